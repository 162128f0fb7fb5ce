"""How close a batch's estimate (`POST /v1/batches/estimate`, an extension) comes to when the batch really
ends, measured from outside through the HTTP API on the local stack, C=16, L=1 s by default (`--budget`,
`--latency`: the estimate must follow a backend of any pace, not only the 1 s it guesses before any call):

- alone: a batch of 200 and one of 2,000 requests on an idle model;
- behind another batch: the same sizes created right after another account's batch of 1,000 requests on
  the same model (fair turns: each account gets half the slots while both have work).

For each, the estimate is asked for just before the create, with the same body; the error is
|estimated duration - real duration| / real duration, where the estimated duration is
`estimated_completion_at - created_at` of the estimate and the real one `completed_at - created_at` of the
batch (the service's own clock, Unix seconds). Goal: within 25 % for each. A warm-up batch first lets the
workers measure the backend's latency (the estimate reads what they noted). The medians of `--runs` runs are
reported; the other batch is cancelled once the measured one has ended, and waited for.
"""

from __future__ import annotations

import argparse
import time

import requests

from batchinfer.service import accounts
from bench.common import FINAL, chat, command_line, local_stack, median, wait
from bench.ingest import spread

GOAL = 0.25


def estimate_and_run(session, base: str, body: dict) -> tuple[float, dict, dict]:
    """The estimate of `body`, then the batch created from it and run to its end: (error, estimate, batch)."""
    answer = session.post(f"{base}/batches/estimate", json=body, timeout=120)
    answer.raise_for_status()
    estimate = answer.json()
    created = session.post(f"{base}/batches", json=body, timeout=120)
    created.raise_for_status()
    batch = wait(session, base, created.json()["id"], poll=0.2)
    assert batch["status"] == "completed", batch
    estimated = estimate["estimated_completion_at"] - estimate["created_at"]
    real = batch["completed_at"] - batch["created_at"]
    return abs(estimated - real) / real, estimate, batch


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=2)
    parser.add_argument("--latency", type=float, default=1.0)
    parser.add_argument("--budget", type=int, default=16)
    parser.add_argument("--sizes", default="200,2000", help="the measured batches' sizes")
    parser.add_argument("--ahead", type=int, default=1000, help="the other account's batch, created first")
    parser.add_argument("--warmup", type=int, default=None,
                        help="requests in the warm-up batch (default: 12 waves of the budget; a short one, e.g. 16, "
                             "checks that a batch shorter than the pumps' periodic note teaches the estimate too)")
    args = parser.parse_args(argv)
    sizes = [int(s) for s in args.sizes.split(",")]
    errors: dict[str, list[float]] = {}
    seen: dict[str, list[tuple[int, int]]] = {}
    with local_stack(latency=args.latency, budget=args.budget) as (svc, session, base):
        other_account = accounts.create_account(svc, tier="pro", batch_access=True, daily_quota_usd=1e6)
        other = requests.Session()
        other.headers["Authorization"] = f"Bearer {accounts.create_key(svc, other_account['id'])}"
        # Warm-up: the pumps note what their calls took on the budget (every few seconds while busy, and when
        # they stop), where the estimate reads it.
        warmup = 12 * args.budget if args.warmup is None else args.warmup
        if warmup:
            wait(session, base, session.post(f"{base}/batches", json={"requests": [
                chat(f"w-{i}", f"warm up {i}") for i in range(warmup)]}, timeout=60).json()["id"], poll=0.5)
        for run in range(args.runs):
            for size in sizes:
                for where in ("alone", "behind"):
                    name = f"{size} {where}"
                    ahead = None
                    if where == "behind":
                        ahead = other.post(f"{base}/batches", timeout=120, json={"requests": [
                            chat(f"o{run}-{size}-{i}", f"ahead {i}") for i in range(args.ahead)]}).json()
                    body = {"requests": [chat(f"m{run}-{size}-{i}", f"measured {i}") for i in range(size)]}
                    error, estimate, batch = estimate_and_run(session, base, body)
                    errors.setdefault(name, []).append(error)
                    seen.setdefault(name, []).append((estimate["estimated_completion_at"] - estimate["created_at"],
                                                      batch["completed_at"] - batch["created_at"]))
                    print(f"  run {run + 1}, {name}: estimated {seen[name][-1][0]} s, real {seen[name][-1][1]} s, "
                          f"error {error:.1%} (queue ahead {estimate['models'][0]['queue_ahead']}, "
                          f"latency used {estimate['models'][0]['latency_used_seconds']} s)", flush=True)
                    if ahead is not None:
                        other.post(f"{base}/batches/{ahead['id']}/cancel", timeout=30).raise_for_status()
                        assert wait(other, base, ahead["id"], poll=0.5)["status"] in FINAL
                        time.sleep(1)
    print(f"estimate: C={args.budget}, L={args.latency}s, a warm-up batch of {warmup}, another account's batch "
          f"of {args.ahead} ahead in the 'behind' cases; {args.runs} runs")
    out: dict = {"runs": args.runs}
    for name, values in errors.items():
        ratio = median(values)
        out[name] = ratio
        estimated, real = median([e for e, _ in seen[name]]), median([r for _, r in seen[name]])
        print(f"  {name}: estimated {estimated:.0f} s, real {real:.0f} s (medians); error median {ratio:.1%} "
              f"{spread(values, '{:.1%}')}; goal <= {GOAL:.0%}: {'met' if ratio <= GOAL else 'NOT MET'}")
    print(f"  reproduce: {command_line('bench.estimate')}")
    return out


if __name__ == "__main__":
    main()
