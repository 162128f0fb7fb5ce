"""Yield: with interactive requests in flight on a model (`track_interactive(svc, model, +n)`, as the
interactive endpoints will do), the batch requests in flight on it drop to the model's floor (the catalog's
`batch_floor`, 2) within <= 2 s, and come back to the budget when the load goes (`-n`). L=2 s, so a
request already running finishes within 2 s.

A batch keeps the model busy at its budget; every 0.1 s a sampler reads the model's `in_flight` counter
(MODEL#<id>/BUDGET: dispatched or running) and the simulated backend's `in_flight` (running). Each cycle:
interactive load on (at a random moment), held for a while, off, held again. To the floor: from the
`track_interactive` call until the sampled value stays at or below the floor for the rest of the hold;
back: from the call that removes the load to the first sample at the budget.
"""

from __future__ import annotations

import argparse
import random
import threading
import time

import httpx

from batchinfer.layout import model_budget_key
from batchinfer.service.capacity import track_interactive
from bench.common import chat, command_line, create, local_stack, median, wait
from bench.ingest import spread

GOAL_SECONDS = 2.0
MODEL = "glm-5.3-flash"


class Sampler(threading.Thread):
    """(time, counter in_flight, backend in_flight) every `every` seconds."""

    def __init__(self, svc, sim_url: str, every: float = 0.1) -> None:
        super().__init__(daemon=True)
        self.svc, self.sim_url, self.every = svc, sim_url, every
        self.samples: list[tuple[float, int, int]] = []
        self.done = threading.Event()

    def run(self) -> None:
        with httpx.Client(timeout=5) as client:
            while not self.done.is_set():
                t = time.monotonic()
                counter = int((self.svc.table.get(*model_budget_key(MODEL)) or {}).get("in_flight", 0))
                backend = client.get(f"{self.sim_url}/_sim/stats").json()["in_flight"]
                self.samples.append((t, counter, backend))
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
    args = parser.parse_args(argv)
    budget, latency, k = args.budget, args.latency, args.interactive or args.budget
    with local_stack(latency=latency, budget=budget) as (svc, session, base):
        model = svc.catalog.get(MODEL)
        floor = min(model.batch_floor, budget)
        sampler = Sampler(svc, model.backend.base_url.removesuffix("/v1"))
        sampler.start()
        n = int((args.cycles * 2 * args.hold + 10) * budget / latency) + budget
        batch = create(session, base, [chat(f"y-{i}", f"yield {i}") for i in range(n)])
        while not (sampler.samples and sampler.samples[-1][2] >= budget):
            time.sleep(0.1)
        time.sleep(args.hold)
        down, up = {1: [], 2: []}, {1: [], 2: []}
        for _ in range(args.cycles):
            time.sleep(random.uniform(0, latency))  # not in step with the requests' rounds
            on = time.monotonic()
            track_interactive(svc, MODEL, +k)
            time.sleep(args.hold)
            off = time.monotonic()
            track_interactive(svc, MODEL, -k)
            time.sleep(args.hold)
            for which in (1, 2):
                down[which].append(sampler.settled(on, off, floor, which))
                up[which].append(sampler.first(off, lambda v: v >= budget, which))
        sampler.done.set()
        session.post(f"{base}/batches/{batch['id']}/cancel", timeout=30).raise_for_status()
        wait(session, base, batch["id"], poll=0.2)

    def summary(values: list[float | None]) -> str:
        if any(v is None for v in values):
            return f"not reached within {args.hold:.0f} s in {sum(v is None for v in values)} of {len(values)} cycles"
        return f"median {median(values):.1f} s {spread(values, '{:.1f}')}"

    reached = [v for v in down[2] if v is not None]
    worst_down = max(down[1] + down[2]) if None not in down[1] + down[2] else float("inf")
    print(f"yield: {k} interactive requests on {MODEL} (budget {budget}, floor {floor}), L={latency}s; "
          f"{args.cycles} cycles, samples every 0.1 s")
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
    print(f"  reproduce: {command_line('bench.interactive_yield')}")
    return {"to_floor_s": median(reached) if reached else None, "worst_to_floor_s": worst_down,
            "counter_to_floor_s": median([v for v in down[1] if v is not None] or [float("inf")]),
            "recover_s": median([v for v in up[2] if v is not None] or [float("inf")]),
            "ratio": ratio, "cycles": args.cycles}


if __name__ == "__main__":
    main()
