"""Priority and fairness between an account's batches, measured from outside through the HTTP API, C=16,
L=2 s, the account's tier limit above the model's budget (the account's share is the whole model):

- high after normal: a `high` batch (100 requests) created right after a large `normal` batch (1,000
  requests) of the same account. Its completion time divided by its time alone. Goal <= 1.2: the account's
  slots go to its high batch first, so it waits only for the calls running when it arrived (and what the
  workers had claimed ahead of them).
- equal priority: a small batch (30 requests) created right after a large one (400 requests), both
  `normal`. Its completion time divided by its time alone. Goal <= 2.0: no worse than an even share of the
  model (which gives 2). `--delay` creates it that many seconds after the large one instead, once the large
  one runs at the model's budget (its completion time still counted from its own creation): the calls
  running then are service the large batch receives after the small one arrived, which the small one is
  owed.

Each run: the small batch alone; then the large batch and, right after it, the small batch again; the large
batch is cancelled once the small one is done (and waited for, so the next run starts empty). The medians of
`--runs` runs are reported. `--scale` multiplies the large batches' sizes (a quicker run; they must still
outlast the small ones).
"""

from __future__ import annotations

import argparse
import time

from batchinfer.layout import batch_key
from bench.common import FINAL, chat, command_line, local_stack, median, wait
from bench.ingest import spread

HIGH_GOAL = 1.2
EQUAL_GOAL = 2.0


def create(session, base: str, requests: list[dict], priority: str | None = None) -> dict:
    body: dict = {"requests": requests}
    if priority is not None:
        body["priority"] = priority
    answer = session.post(f"{base}/batches", json=body, timeout=120)
    answer.raise_for_status()
    return answer.json()


def timed(session, base: str, requests: list[dict], priority: str | None = None) -> float:
    started = time.monotonic()
    batch = wait(session, base, create(session, base, requests, priority)["id"], poll=0.05)
    assert batch["status"] == "completed", batch
    return time.monotonic() - started


def after_large(svc, session, base: str, large: list[dict], small: list[dict], priority: str | None,
                delay: float = 0.0) -> tuple[float, int]:
    """The small batch's time right after the large one (`delay` seconds after it); and how many of the large
    one's requests had started or finished by then. The large one is cancelled and waited for."""
    big = create(session, base, large)
    time.sleep(delay)
    shared = timed(session, base, small, priority)
    item = svc.table.get(*batch_key(big["id"]))
    progress = int(item.get("completed", 0)) + int(item.get("in_flight", 0))
    session.post(f"{base}/batches/{big['id']}/cancel", timeout=30).raise_for_status()
    assert wait(session, base, big["id"], poll=0.2)["status"] in FINAL
    return shared, progress


def report(name: str, small: int, big: int, alone: list[float], shared: list[float], progress: list[int],
           goal: float, even: str) -> float:
    ratios = [s / a for s, a in zip(shared, alone, strict=True)]
    ratio = median(ratios)
    print(f"  {name}: a {small}-request batch right after a {big}-request batch")
    print(f"    alone: median {median(alone):.1f} s {spread(alone, '{:.1f}')}; after the large one: median "
          f"{median(shared):.1f} s {spread(shared, '{:.1f}')} (the large one had {median(progress):.0f} requests "
          "started or done by then)")
    print(f"    ratio (after / alone): median {ratio:.2f} {spread(ratios)}; goal <= {goal}: "
          f"{'met' if ratio <= goal else 'NOT MET'} ({even})")
    return ratio


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--scale", type=float, default=1.0, help="multiplies the large batches' sizes")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--latency", type=float, default=2.0)
    parser.add_argument("--budget", type=int, default=16)
    parser.add_argument("--high", type=int, default=100, help="the high batch's requests")
    parser.add_argument("--small", type=int, default=30, help="the equal-priority small batch's requests")
    parser.add_argument("--only", choices=("high", "equal"), help="run one of the two measures")
    parser.add_argument("--delay", type=float, default=0.0,
                        help="seconds between the large batch and the equal-priority small one")
    args = parser.parse_args(argv)
    normal_big, equal_big = max(1, round(1000 * args.scale)), max(1, round(400 * args.scale))
    high = {"alone": [], "shared": [], "progress": []}
    equal = {"alone": [], "shared": [], "progress": []}
    # The stack's account is `internal` (64 slots): its share is the whole model.
    with local_stack(latency=args.latency, budget=args.budget) as (svc, session, base):
        for run in range(args.runs):
            if args.only in (None, "high"):
                high["alone"].append(timed(session, base, [chat(f"ha{run}-{i}", f"high alone {i}")
                                                           for i in range(args.high)], "high"))
                shared, progress = after_large(svc, session, base,
                                               [chat(f"hn{run}-{i}", f"normal {i}") for i in range(normal_big)],
                                               [chat(f"hs{run}-{i}", f"high after normal {i}")
                                                for i in range(args.high)], "high")
                high["shared"].append(shared)
                high["progress"].append(progress)
            if args.only in (None, "equal"):
                equal["alone"].append(timed(session, base, [chat(f"ea{run}-{i}", f"small alone {i}")
                                                            for i in range(args.small)]))
                shared, progress = after_large(svc, session, base,
                                               [chat(f"el{run}-{i}", f"large {i}") for i in range(equal_big)],
                                               [chat(f"es{run}-{i}", f"small after large {i}")
                                                for i in range(args.small)], None, args.delay)
                equal["shared"].append(shared)
                equal["progress"].append(progress)
    print(f"priority: C={args.budget}, L={args.latency}s, one account (its share: the whole model); {args.runs} runs")
    out: dict = {"runs": args.runs}
    if high["alone"]:
        out["high_ratio"] = report("high after normal", args.high, normal_big, high["alone"], high["shared"],
                                   high["progress"], HIGH_GOAL, "the account's slots go to its high batch first")
    if equal["alone"]:
        if args.delay:
            print(f"  (the small batch created {args.delay:.1f} s after the large one)")
        out["equal_ratio"] = report("equal priority", args.small, equal_big, equal["alone"], equal["shared"],
                                    equal["progress"], EQUAL_GOAL, "an even share of the model gives 2.0")
    print(f"  reproduce: {command_line('bench.priority')}")
    return out


if __name__ == "__main__":
    main()
