"""Many lanes: many small batches from many accounts on one model, all waiting at once. Default:
200 batches of 20 requests from 100 accounts (two each), C = 16, L = 1 s. Goals: throughput / (C/L) >= 0.9,
every batch's completion time within 2x of the median (fairness), DynamoDB write units per request <= 4.

The batches are created while the model's budget is 0 (nothing runs), then the budget is set and the clock
starts: the measure is the scheduler's, not the create calls'. Completion times are the batches' own
`completed_at` (whole seconds), from that moment. Write units are counted per call as AWS bills them
(bench/calls.py) over the run, the polls of this benchmark left out; `--hot` also prints the hot-item report
(bench/hot_report.py) of the same run.
"""

from __future__ import annotations

import argparse
import time

from batchinfer.layout import batch_key
from batchinfer.service import accounts
from bench.calls import LABEL, recording
from bench.common import FINAL, MODEL, chat, command_line, local_stack, median
from bench.hot_report import print_breakdown, print_report

GOAL_RATIO, GOAL_FAIRNESS, GOAL_WRU = 0.9, 2.0, 4.0


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batches", type=int, default=200)
    parser.add_argument("--requests", type=int, default=20, help="per batch")
    parser.add_argument("--accounts", type=int, default=100)
    parser.add_argument("--latency", type=float, default=1.0)
    parser.add_argument("--budget", type=int, default=16)
    parser.add_argument("--shard-slots", type=int, default=4,
                        help="BUDGET_SHARD_SLOTS: the budget's slots per shard (4: C = 16 in 4 shards; the target's "
                             "C = 1,024 has 16 at the default of 64)")
    parser.add_argument("--hot", action="store_true", help="print the hot-item report of the run")
    args = parser.parse_args(argv)
    n = args.batches * args.requests
    with local_stack(latency=args.latency, budget=0, pollers=args.budget,
                     budget_shard_slots=args.shard_slots) as (svc, session, base):
        LABEL.set("bench")
        model = svc.catalog.get(MODEL)
        keys = []
        for _ in range(args.accounts):
            account = accounts.create_account(svc, tier="pro", batch_access=True, daily_quota_usd=1000.0)
            keys.append(accounts.create_key(svc, account["id"]))
        ids = []
        for b in range(args.batches):
            answer = session.post(f"{base}/batches", timeout=120, headers={
                "Authorization": f"Bearer {keys[b % args.accounts]}"}, json={
                "requests": [chat(f"b{b}-{i}", f"lane {b} request {i}") for i in range(args.requests)]})
            answer.raise_for_status()
            ids.append(answer.json()["id"])
        with recording(svc) as rec:
            started = time.time()
            model.batch_budget = args.budget  # the dispatcher and workers read the catalog object
            pending, ended = set(ids), {}
            while pending:
                time.sleep(1.0)
                for batch_id in list(pending):
                    item = svc.table.get(*batch_key(batch_id), consistent=False) or {}
                    if item.get("status") in FINAL:
                        pending.discard(batch_id)
                        ended[batch_id] = item
            wall = time.time() - started
            time.sleep(1.0)  # the last invocations end and are recorded
            calls = [c for c in rec.calls if c.label != "bench"]
    statuses = sorted({item["status"] for item in ended.values()})
    done = [int(item.get("completed_at") or item.get("updated_at") or 0) - started for item in ended.values()]
    ratio = n / wall / (args.budget / args.latency)
    mid = median(done)
    fairness = max(done) / mid if mid > 0 else float("inf")
    wru = sum(c.wru for c in calls) / n
    gsi = sum(c.gsi_wru for c in calls) / n
    print(f"many lanes: {args.batches} batches x {args.requests} requests from {args.accounts} accounts on {MODEL}, "
          f"C={args.budget}, L={args.latency}s; statuses {statuses}")
    print(f"  wall {wall:.1f} s for {n} requests: {n / wall:.2f} req/s; limit C/L {args.budget / args.latency:.1f}: "
          f"ratio {ratio:.3f} (goal >= {GOAL_RATIO}: {'met' if ratio >= GOAL_RATIO else 'NOT MET'})")
    print(f"  completion times: median {mid:.0f} s, first {min(done):.0f} s, last {max(done):.0f} s; last / median "
          f"{fairness:.2f} (goal <= {GOAL_FAIRNESS:.0f}: {'met' if fairness <= GOAL_FAIRNESS else 'NOT MET'})")
    print(f"  DynamoDB per request: {sum(c.service == 'dynamodb' for c in calls) / n:.2f} calls, write units "
          f"{wru:.2f} in the table + {gsi:.2f} in GSIs (goal <= {GOAL_WRU:.0f} in the table: "
          f"{'met' if wru <= GOAL_WRU else 'NOT MET'})")
    print_breakdown(calls, n, per_batch=args.requests)
    if args.hot:
        print_report(calls, n, wall, args.batches, args.accounts)
    print(f"  reproduce: {command_line('bench.many_lanes')}")
    return {"ratio": ratio, "fairness": fairness, "wru": wru, "gsi_wru": gsi, "wall": wall}


if __name__ == "__main__":
    main()
