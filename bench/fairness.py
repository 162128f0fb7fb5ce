"""Fairness: a small batch (50 requests) created right after a large one (1,000 requests) on the same model,
C=16, L=2 s. Its completion time divided by its completion time alone. Goal <= 2.0: no worse than an even
share of the budget between the two batches (which gives 2).

Each run: the small batch alone; then the large batch and, right after it, the small batch again. The
large batch is cancelled once the small one is done (and waited for, so the next run starts empty).
`--scale` multiplies both sizes for a quicker run.
"""

from __future__ import annotations

import argparse
import math
import time

from batchinfer.layout import batch_key
from bench.common import chat, command_line, create, local_stack, median, wait
from bench.ingest import spread

GOAL = 2.0
MODEL = "glm-5.3-flash"


def timed(session, base: str, requests: list[dict]) -> tuple[float, dict]:
    started = time.monotonic()
    batch = wait(session, base, create(session, base, requests)["id"], poll=0.05)
    return time.monotonic() - started, batch


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--scale", type=float, default=1.0, help="multiplies both batch sizes")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--latency", type=float, default=2.0)
    parser.add_argument("--budget", type=int, default=16)
    args = parser.parse_args(argv)
    big, small = max(1, round(1000 * args.scale)), max(1, round(50 * args.scale))
    alone_s, shared_s, ratios, progress = [], [], [], []
    with local_stack(latency=args.latency, budget=args.budget) as (svc, session, base):
        for run in range(args.runs):
            alone, _ = timed(session, base, [chat(f"a{run}-{i}", f"small alone {i}") for i in range(small)])
            large = create(session, base, [chat(f"l{run}-{i}", f"large {i}") for i in range(big)])
            shared, _ = timed(session, base, [chat(f"s{run}-{i}", f"small after large {i}") for i in range(small)])
            item = svc.table.get(*batch_key(large["id"]))
            progress.append(item.get("completed", 0) + item.get("in_flight", 0))
            session.post(f"{base}/batches/{large['id']}/cancel", timeout=30).raise_for_status()
            wait(session, base, large["id"], poll=0.2)
            alone_s.append(alone)
            shared_s.append(shared)
            ratios.append(shared / alone)
    ideal = math.ceil(small / args.budget) * args.latency
    ratio = median(ratios)
    print(f"fairness: a {small}-request batch right after a {big}-request batch, C={args.budget}, L={args.latency}s; "
          f"{args.runs} runs")
    print(f"  small batch alone: median {median(alone_s):.1f} s {spread(alone_s, '{:.1f}')} "
          f"(the limit ceil(n/C)*L = {ideal:.1f} s)")
    print(f"  small batch after the large one: median {median(shared_s):.1f} s {spread(shared_s, '{:.1f}')}; "
          f"the large batch had {median(progress):.0f} requests started or done by then")
    print(f"  ratio (after / alone): median {ratio:.2f} {spread(ratios)}; goal <= {GOAL}: "
          f"{'met' if ratio <= GOAL else 'NOT MET'} (an even share of the budget gives 2.0)")
    print(f"  reproduce: {command_line('bench.fairness')}")
    return {"big": big, "small": small, "alone_s": median(alone_s), "shared_s": median(shared_s), "ratio": ratio,
            "runs": args.runs}


if __name__ == "__main__":
    main()
