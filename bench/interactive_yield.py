"""Yield: with interactive requests in flight on a model, the batch requests in flight on it drop to the
model's floor (the catalog's `batch_floor`, 2) within <= 2 s, and come back to the budget when the load goes.
L=2 s, so a request already running finishes within 2 s.

`--real` (the default): the load is real interactive chat completions through the API (`k` clients, each
sending its next request as soon as the last answered), whose leases the budget counts; the backend's
in-flight then holds both, so the batch's share is the backend's count less the interactive calls open.
`--synthetic`: the load is the counter alone (`track_interactive(svc, model, +k)`), with no calls through the
API: how fast batch work gives way, apart from how fast the load itself is counted.

A batch keeps the model busy at its budget; every 0.1 s a sampler reads the model's `in_flight` counter
(MODEL#<id>/BUDGET: dispatched or running) and the simulated backend's `in_flight` (running). Each cycle:
interactive load on (at a random moment), held for a while, off, held again. To the floor: from the
`track_interactive` call until the sampled value stays at or below the floor for the rest of the hold;
back: from the call that removes the load to the first sample at the budget.

The measure that matters ("running calls may finish; new ones must not start"): from the simulated backend's
timeline, where the interactive calls are tagged (`[[sim:tag:interactive]]`), the last batch call that
started above the floor (with `floor` or more batch calls already running) after the load arrived. A call
that started before it runs out its L, so "to the floor" is about L plus that time.
"""

from __future__ import annotations

import argparse
import random
import threading
import time

import httpx

from batchinfer.layout import model_budget_key
from batchinfer.scheduling.capacity import track_interactive
from bench.common import chat, command_line, create, local_stack, median, wait
from bench.ingest import spread

GOAL_SECONDS = 2.0
MODEL = "glm-5.3-flash"
TAG = "[[sim:tag:interactive]]"  # the simulated backend lists these calls apart in its timeline


def last_start_over(timeline: list[list[float]], tags: list[str | None], since: float, until: float,
                    floor: int) -> float:
    """Seconds from `since` to the last batch call (untagged) that started before `until` while `floor` or
    more other batch calls were running: a call that should not have started (0 if none did)."""
    batch = sorted((a, b) for (a, b), tag in zip(timeline, tags, strict=True) if tag is None)
    late = [a for a, _ in batch if since < a <= until
            and sum(1 for a2, b2 in batch if a2 < a < b2) >= floor]
    return max(late) - since if late else 0.0


class Interactive:
    """`k` interactive clients on the API, each sending its next chat completion as its last one answers,
    from `on()` until `off()`; `open` counts the calls under way."""

    def __init__(self, base: str, key: str, k: int) -> None:
        self.base, self.key, self.k = base, key, k
        self.open = 0
        self.lock = threading.Lock()
        self.sending = threading.Event()
        self.threads: list[threading.Thread] = []
        self.errors = 0

    def _client(self) -> None:
        with httpx.Client(headers={"Authorization": f"Bearer {self.key}"}, timeout=60) as client:
            n = 0
            while self.sending.is_set():
                with self.lock:
                    self.open += 1
                try:
                    answer = client.post(f"{self.base}/chat/completions", json={
                        "model": MODEL, "messages": [{"role": "user", "content": f"interactive {n} {TAG}"}]})
                    self.errors += answer.status_code != 200
                finally:
                    with self.lock:
                        self.open -= 1
                n += 1

    def on(self) -> None:
        self.sending.set()
        self.threads = [threading.Thread(target=self._client, daemon=True) for _ in range(self.k)]
        for thread in self.threads:
            thread.start()

    def off(self) -> float:
        """Stop sending; returns when the last interactive call answered."""
        self.sending.clear()
        for thread in self.threads:
            thread.join()
        return time.monotonic()


class Sampler(threading.Thread):
    """(time, counter in_flight, batch calls at the backend) every `every` seconds."""

    def __init__(self, svc, sim_url: str, every: float = 0.1, interactive: Interactive | None = None) -> None:
        super().__init__(daemon=True)
        self.svc, self.sim_url, self.every, self.interactive = svc, sim_url, every, interactive
        self.samples: list[tuple[float, int, int, int]] = []  # time, counter, backend, interactive counted
        self.done = threading.Event()

    def run(self) -> None:
        with httpx.Client(timeout=5) as client:
            while not self.done.is_set():
                t = time.monotonic()
                item = self.svc.table.get(*model_budget_key(MODEL)) or {}
                counter, counted = int(item.get("in_flight", 0)), int(item.get("interactive", 0))
                backend = client.get(f"{self.sim_url}/_sim/stats").json()["in_flight"]
                if self.interactive is not None:  # the backend runs interactive calls too: count the batch's
                    backend = max(0, backend - self.interactive.open)
                self.samples.append((t, counter, backend, counted))
                self.done.wait(max(0.0, self.every - (time.monotonic() - t)))

    def first(self, since: float, test, which: int) -> float | None:
        """Seconds from `since` to the first sample (column 1: counter, 2: backend) that passes `test`."""
        return next((s[0] - since for s in list(self.samples) if s[0] >= since and test(s[which])), None)

    def settled(self, since: float, until: float, limit: int, which: int) -> float | None:
        """Seconds from `since` until the column stays at or below `limit` up to `until` (None: it never does)."""
        window = [s for s in list(self.samples) if since <= s[0] <= until]
        above = [i for i, s in enumerate(window) if s[which] > limit]
        if not above:
            return 0.0
        return window[above[-1] + 1][0] - since if above[-1] + 1 < len(window) else None


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--latency", type=float, default=2.0)
    parser.add_argument("--budget", type=int, default=16)
    parser.add_argument("--interactive", type=int, default=0, help="interactive requests in flight (0: the budget)")
    parser.add_argument("--cycles", type=int, default=10)
    parser.add_argument("--hold", type=float, default=5.0, help="seconds each phase lasts")
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--real", dest="real", action="store_true", default=True,
                      help="real interactive requests through the API (the default)")
    mode.add_argument("--synthetic", dest="real", action="store_false", help="the interactive counter alone")
    args = parser.parse_args(argv)
    budget, latency, k = args.budget, args.latency, args.interactive or args.budget
    with local_stack(latency=latency, budget=budget) as (svc, session, base):
        model = svc.catalog.get(MODEL)
        floor = min(model.batch_floor, budget)
        key = session.headers["Authorization"].removeprefix("Bearer ")
        load = Interactive(base, key, k) if args.real else None
        sampler = Sampler(svc, model.backend.base_url.removesuffix("/v1"), interactive=load)
        sampler.start()
        n = int((args.cycles * 2 * args.hold + 10) * budget / latency) + budget
        batch = create(session, base, [chat(f"y-{i}", f"yield {i}") for i in range(n)])
        while not (sampler.samples and sampler.samples[-1][2] >= budget):
            time.sleep(0.1)
        time.sleep(args.hold)
        down, up = {1: [], 2: []}, {1: [], 2: []}
        ramps: list[float] = []
        windows: list[tuple[float, float]] = []  # (load arrived, load off), epoch seconds
        to_epoch = time.time() - time.monotonic()
        for _ in range(args.cycles):
            time.sleep(random.uniform(0, latency))  # not in step with the requests' rounds
            on = time.monotonic()
            load.on() if load else track_interactive(svc, MODEL, +k)
            time.sleep(args.hold)
            off = time.monotonic()
            if load:
                gone = load.off()  # the load has gone once its last call answered
            else:
                track_interactive(svc, MODEL, -k)
                gone = off
            time.sleep(args.hold)
            # Real load arrives over a moment (each call opens its lease first): from when all k are counted.
            full = on + (sampler.first(on, lambda v: v >= k, 3) or 0.0) if load else on
            ramps.append(full - on)
            windows.append((full + to_epoch, off + to_epoch))
            for which in (1, 2):
                down[which].append(sampler.settled(full, off, floor, which))
                up[which].append(sampler.first(gone, lambda v: v >= budget, which))
        sampler.done.set()
        timeline = httpx.get(f"{sampler.sim_url}/_sim/timeline").json()
        starts = [last_start_over(timeline["requests"], timeline["tags"], a, b, floor) for a, b in windows]
        session.post(f"{base}/batches/{batch['id']}/cancel", timeout=30).raise_for_status()
        wait(session, base, batch["id"], poll=0.2)

    def summary(values: list[float | None]) -> str:
        if any(v is None for v in values):
            return f"not reached within {args.hold:.0f} s in {sum(v is None for v in values)} of {len(values)} cycles"
        return f"median {median(values):.1f} s {spread(values, '{:.1f}')}"

    reached = [v for v in down[2] if v is not None]
    worst_down = max(down[1] + down[2]) if None not in down[1] + down[2] else float("inf")
    how = (f"real interactive chat completions through the API ({load.errors} not 200)" if load
           else "the interactive counter (synthetic)")
    print(f"yield: {k} interactive requests on {MODEL} (budget {budget}, floor {floor}), L={latency}s, {how}; "
          f"{args.cycles} cycles, samples every 0.1 s")
    if load:
        print(f"  the load's arrival (first call sent to all {k} counted): median {median(ramps):.2f} s "
              f"{spread(ramps, '{:.2f}')}; the times below start when all are counted")
    print(f"  to the floor, backend in flight: {summary(down[2])}; budget counter (dispatched + running): "
          f"{summary(down[1])}")
    print(f"  back to the budget when it goes, backend: {summary(up[2])}; counter: {summary(up[1])}")
    ratio = median(reached) / GOAL_SECONDS if reached else float("inf")
    over = sum(v is None or v > GOAL_SECONDS for v in down[1] + down[2])
    print(f"  goal <= {GOAL_SECONDS:.0f} s to the floor: median (backend) ratio {ratio:.2f} "
          f"({'met' if ratio <= 1 else 'NOT MET'}); {over} of {2 * args.cycles} measures over 2 s; worst cycle "
          f"{worst_down:.1f} s: ratio "
          f"{worst_down / GOAL_SECONDS:.2f} ({'met' if worst_down <= GOAL_SECONDS else 'NOT MET'}: a request "
          f"dispatched just before the load came still runs L after it starts)")
    print(f"  new batch calls over the floor stop starting (running calls may finish, new "
          f"ones must not start): {summary(starts)}; worst {max(starts):.2f} s, ratio {max(starts) / GOAL_SECONDS:.2f} "
          f"({'met' if max(starts) <= GOAL_SECONDS else 'NOT MET'})")
    print(f"  reproduce: {command_line('bench.interactive_yield')}")
    return {"last_start_over_s": median(starts), "worst_last_start_over_s": max(starts),
            "to_floor_s": median(reached) if reached else None, "worst_to_floor_s": worst_down,
            "counter_to_floor_s": median([v for v in down[1] if v is not None] or [float("inf")]),
            "recover_s": median([v for v in up[2] if v is not None] or [float("inf")]),
            "ratio": ratio, "cycles": args.cycles}


if __name__ == "__main__":
    main()
