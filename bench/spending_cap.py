"""A spending cap's accuracy: how much of `max_cost_usd` a batch spends before it stops (spend / cap), on
the local stack with the simulated backend. The guarantee is spend <= cap (checked on every run); how close
it gets is bounded below by 1 - worst / cap, the worst case of the request that would have come next (the
batch stops once what it spent plus that worst case passes the cap): a cap of many worst cases is spent
almost whole, whatever `max_tokens` says; a cap of a few is not.

Each run: a batch of chat requests with one `max_tokens` (the simulator answers 10-20 words, cut at
`max_tokens`), a cap of so many times one request's worst case, and enough requests to reach it.
"""

from __future__ import annotations

import argparse
import json
import math
import time

from batchinfer.layout import batch_key
from bench.common import FINAL, MODEL, command_line, local_stack

RUNS = ((16, 20.0), (256, 20.0), (16, 100.0), (256, 5.0))  # (max_tokens, cap in worst cases)


def request(i: int, max_tokens: int) -> dict:
    return {"custom_id": f"c-{i:05d}", "body": {"model": MODEL, "max_tokens": max_tokens,
                                                "messages": [{"role": "user", "content": f"Question {i:05d}?"}]}}


def worst(svc, max_tokens: int) -> float:
    line = json.dumps({"custom_id": "c-00000", "body": request(0, max_tokens)["body"]}, separators=(",", ":"))
    return svc.catalog.get(MODEL).cost_usd(len(line) + 1, max_tokens)


def one_run(svc, session, base: str, max_tokens: int, cap_in_worst: float) -> dict:
    w = worst(svc, max_tokens)
    cap = cap_in_worst * w
    typical = svc.catalog.get(MODEL).cost_usd(8, min(max_tokens, 12))  # a low guess: enough requests to reach it
    n = min(5000, math.ceil(cap / typical * 1.5) + 5)
    started = time.monotonic()
    answer = session.post(f"{base}/batches", json={"requests": [request(i, max_tokens) for i in range(n)],
                                                  "max_cost_usd": cap}, timeout=120)
    answer.raise_for_status()
    batch_id = answer.json()["id"]
    while (item := svc.table.get(*batch_key(batch_id), consistent=False))["status"] not in FINAL:
        time.sleep(0.2)
    spent = float(item.get("cost_usd", 0))
    assert spent <= cap, (spent, cap)
    return {"max_tokens": max_tokens, "cap_in_worst": cap_in_worst, "n": n, "completed": int(item["completed"]),
            "status": item["status"], "code": (item.get("error") or {}).get("code"), "spend_over_cap": spent / cap,
            "floor": 1 - w / cap, "seconds": time.monotonic() - started}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=1, help="rounds of the four scenarios")
    args = parser.parse_args()
    with local_stack(pollers=2) as (svc, session, base):
        rows = [one_run(svc, session, base, m, c) for _ in range(args.runs) for m, c in RUNS]
    print("max_tokens  cap(worst cases)  requests  completed  status     spend/cap  floor(1-worst/cap)  seconds")
    for r in rows:
        print(f"{r['max_tokens']:>10}  {r['cap_in_worst']:>16.0f}  {r['n']:>8}  {r['completed']:>9}  "
              f"{r['status']:<9}  {r['spend_over_cap']:>9.3f}  {r['floor']:>18.3f}  {r['seconds']:>7.1f}")
    ok = all(r["spend_over_cap"] <= 1 for r in rows)
    print(f"goal spend <= cap on every run: {'met' if ok else 'MISSED'}; spend/cap from "
          f"{min(r['spend_over_cap'] for r in rows):.3f} to {max(r['spend_over_cap'] for r in rows):.3f}")
    print(command_line("bench.spending_cap"))


if __name__ == "__main__":
    main()
