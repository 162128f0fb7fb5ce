"""Short calls (embeddings, small models): does the pump keep a fast backend busy at one slot and at a few?

For each C (default 1 and 4) and L = 20 ms, 2,000 requests in one batch, against a direct asyncio client
(httpx, a semaphore of C) sending the same requests to the same backend in the same run. The backend runs in a
process of its own, as a real one does. Goal: wall / direct
<= 1.10 wherever the local stack's own ceiling is not what binds. That ceiling is measured in the same run,
on a fresh stack at L = 0 (every request answered at once: what moto, one process serving every DynamoDB, S3
and SQS call of the stack one at a time, lets through at this C). When the ceiling is below what the backend
could take (C / L), moto binds, not the design, and the line says so.
"""

from __future__ import annotations

import argparse

from bench.common import backend_process, command_line, local_stack, median
from bench.throughput import one_run


def measure(n: int, latency: float, budget: int) -> dict:
    with backend_process(latency), local_stack(latency=latency, budget=budget) as (svc, session, base):
        return one_run(svc, session, base, n, budget, 0)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--latency", type=float, default=0.02)
    parser.add_argument("--budgets", type=int, nargs="+", default=[1, 4])
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args(argv)
    n, latency = args.requests, args.latency
    for budget in args.budgets:
        runs = [measure(n, latency, budget) for _ in range(args.runs)]
        ceiling = n / measure(n, 0.0, budget)["wall"]  # req/s the local stack passes with no backend time
        limit = budget / latency
        walls = [r["wall"] / r["direct"] for r in runs]
        utilization = [r["occupancy"] / r["direct_occupancy"] for r in runs]
        gaps = [r["gap"] * 1000 for r in runs]
        achieved = n / median([r["wall"] for r in runs])
        bound = ("the backend (C/L) binds: goal wall / direct <= 1.10" if ceiling >= 1.1 * limit else
                 f"moto binds: the stack's own ceiling ({ceiling:.0f} req/s) is below 1.1 x C/L; the goal does "
                 f"not apply")
        print(f"short calls: {n} requests, L={latency * 1000:.0f} ms, C={budget}; {args.runs} runs; "
              f"statuses {sorted({r['final']['status'] for r in runs})}")
        print(f"  wall {median([r['wall'] for r in runs]):.1f} s vs direct client "
              f"{median([r['direct'] for r in runs]):.1f} s: ratio median {median(walls):.3f} "
              f"[{', '.join(f'{w:.3f}' for w in walls)}]")
        print(f"  achieved {achieved:.1f} req/s; C/L = {limit:.0f} req/s; the stack at L=0: {ceiling:.0f} req/s; "
              f"{bound}")
        print(f"  backend utilization {median([r['occupancy'] for r in runs]):.3f} vs the direct client's "
              f"{median([r['direct_occupancy'] for r in runs]):.3f}: ratio median {median(utilization):.3f}; "
              f"{median([r['before'] for r in runs]):.2f} s from create to the first call, "
              f"{median([r['after'] for r in runs]):.2f} s from the last answer to the final status seen; "
              f"median refill gap {median(gaps):.1f} ms")
    print(f"  reproduce: {command_line('bench.short_calls')}")


if __name__ == "__main__":
    main()
