"""How fast a retry in place runs what it re-queues, against the batch's first run, through the HTTP API on
the local stack, C=16, L=2 s, one attempt per request (`max_attempts=1`):

each run creates a batch whose requests each fail once with a 500 (`[[sim:flaky:1:500]]`), so the first run
ends with every request `failed`; then `POST /batches/{id}/retry` runs them all again, and now they pass. The
ratio is the retried run's time (the retry call to `completed`) over the first run's time (create to
`completed`). Goal <= 1.2: a retried request is served as a first attempt is, in groups at the model's
budget, not one claim and one call at a time.
"""

from __future__ import annotations

import argparse
import time

from bench.common import MODEL, command_line, local_stack, median, wait
from bench.ingest import spread

GOAL = 1.2


def one_run(session, base: str, n: int, run: int) -> tuple[float, float]:
    requests = [{"custom_id": f"r{run}-{i}", "body": {"model": MODEL, "messages": [
        {"role": "user", "content": f"[[sim:flaky:1:500]] retry run {run} question {i}"}]}} for i in range(n)]
    started = time.monotonic()
    answer = session.post(f"{base}/batches", json={"requests": requests}, timeout=120)
    answer.raise_for_status()
    batch = wait(session, base, answer.json()["id"], poll=0.05)
    first = time.monotonic() - started
    assert batch["request_counts"]["failed"] == n, batch["request_counts"]
    started = time.monotonic()
    session.post(f"{base}/batches/{batch['id']}/retry", timeout=120).raise_for_status()
    batch = wait(session, base, batch["id"], poll=0.05)
    again = time.monotonic() - started
    assert batch["status"] == "completed" and batch["request_counts"]["completed"] == n, batch
    return first, again


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=400)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--latency", type=float, default=2.0)
    parser.add_argument("--budget", type=int, default=16)
    args = parser.parse_args(argv)
    firsts, agains = [], []
    with local_stack(latency=args.latency, budget=args.budget, max_attempts=1) as (_svc, session, base):
        for run in range(args.runs):
            first, again = one_run(session, base, args.requests, run)
            firsts.append(first)
            agains.append(again)
    ratios = [a / f for a, f in zip(agains, firsts, strict=True)]
    ratio = median(ratios)
    print(f"retry in place: {args.requests} requests, C={args.budget}, L={args.latency}s; {args.runs} runs")
    print(f"  first run: median {median(firsts):.1f} s {spread(firsts, '{:.1f}')}; retried run: median "
          f"{median(agains):.1f} s {spread(agains, '{:.1f}')}")
    print(f"  ratio (retried / first): median {ratio:.2f} {spread(ratios)}; goal <= {GOAL}: "
          f"{'met' if ratio <= GOAL else 'NOT MET'}")
    print(f"  reproduce: {command_line('bench.retry_run')}")
    return {"ratio": ratio}


if __name__ == "__main__":
    main()
