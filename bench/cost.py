"""Cost per request: every DynamoDB, SQS, S3 and Lambda call a request causes over its whole life (create,
dispatch, run, settle, finalization, one download of output.jsonl, the retention purge), with ~1 KB answers
([[sim:big:1000]]). Goals: <= 5 DynamoDB write units per request, amortized, and <= $4 per million
requests for all AWS request charges (us-east-1 on-demand list prices, bench/calls.py).

Counted with botocore event hooks on the stack's clients (bench/calls.py: how write and read units are
estimated from item sizes, and how GSI writes are counted apart). Lambda invocations are counted by
wrapping the local runtime's `invoke`; Lambda duration is reported apart, as GB-seconds per request per
second of backend latency, against a design that runs one request per invocation. Everything the stack
does between the create and the end of the purge is charged to the batch, including the dispatcher's and
sweeper's idle passes, except the event source mapping's empty receives (idle polling, a fixed cost per
queue), shown apart.
"""

from __future__ import annotations

import argparse
import resource
import time
from collections import Counter, defaultdict

from batchinfer.layout import INDEX_PROJECTIONS, batch_key
from batchinfer.service.lifecycle import begin_purge, purge_batch
from bench.calls import LABEL, PRICE, S3_FREE, S3_PUT_CLASS, Call, moto_cpu_seconds, recording, usd
from bench.common import FINAL, chat, command_line, create, local_stack, median

GOAL_WRU = 5.0
GOAL_USD_PER_MILLION = 4.0
WORKER_GB = 512 / 1024  # infra/functions.py: WORKER.memory_mb
DISPATCHER_GB = 512 / 1024
LAMBDA_GB_SECOND_USD = 0.0000166667  # x86, us-east-1


def _cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def one_batch(svc, session, base: str, rec, n: int, prompt: str, latency: float, max_cost: float | None = None
              ) -> dict:
    """Run one batch through its whole life; returns what it cost, per request. `max_cost`: its spending cap
    (one it never reaches: what the cap's bookkeeping costs)."""
    rec.reset()
    started, moto_cpu, own_cpu = time.monotonic(), moto_cpu_seconds(), _cpu()
    requests_ = [chat(f"c-{i}", f"{prompt} {i}") for i in range(n)]
    if max_cost is None:
        batch = create(session, base, requests_)
    else:
        answer = session.post(f"{base}/batches", json={"requests": requests_, "max_cost_usd": max_cost}, timeout=120)
        answer.raise_for_status()
        batch = answer.json()
    while (item := svc.table.get(*batch_key(batch["id"]), consistent=False))["status"] not in FINAL:
        time.sleep(0.2)
    wall = time.monotonic() - started
    moto_busy, own_busy = (moto_cpu_seconds() - moto_cpu) / wall, (_cpu() - own_cpu) / wall
    during = [c for c in rec.calls if c.service == "dynamodb"]
    assert item["completed"] == n, item
    api_calls = 2  # the create and the download below: the only API calls of this batch's life
    with session.get(f"{base}/batches/{batch['id']}/output.jsonl", stream=True, timeout=120) as answer:
        answer.raise_for_status()
        assert sum(chunk.count(b"\n") for chunk in answer.iter_content(1 << 20)) == n
    token = LABEL.set("sweeper")  # as the sweeper will when the batch's retention ends
    begin_purge(svc, svc.table.get(*batch_key(batch["id"])), purge_items=False)
    purge_batch(svc, svc.table.get(*batch_key(batch["id"])))
    LABEL.reset(token)
    time.sleep(0.5)  # let the last invocations end and be recorded
    calls: list[Call] = [c for c in rec.calls if c.label != "bench"]
    idle = [c for c in calls if c.operation == "ReceiveMessage (empty)"]
    calls = [c for c in calls if c.operation != "ReceiveMessage (empty)"]
    invocations = Counter(f for f, _ in rec.invocations)
    seconds = defaultdict(float)
    for function, s in rec.invocations:
        seconds[function] += s
    writes: dict[tuple, float] = defaultdict(float)
    for c in calls:
        for op, kind, wru, gsi in c.writes:
            call = c.operation + ("" if c.ok else " (failed)")
            writes[(c.label, call, op, kind, "base")] += wru
            writes[(c.label, call, op, kind, "gsi")] += gsi
    dollars = usd(calls, sum(invocations.values()))
    # The per-account request rate (service.limits): one conditional write of the account's bucket per API call.
    bucket = [c for c in calls if any(kind == "rate bucket" for _, kind, _, _ in c.writes)]
    return {
        "rate_calls": len(bucket), "rate_wru": sum(c.wru for c in bucket), "api_calls": api_calls,
        "wall": wall,
        "ddb_calls": sum(c.service == "dynamodb" for c in calls) / n,
        "wru": sum(c.wru for c in calls) / n, "gsi_wru": sum(c.gsi_wru for c in calls) / n,
        "gsi_wru_all": sum(c.gsi_wru_all for c in calls) / n,
        "failed_writes": sum(c.service == "dynamodb" and bool(c.writes) and not c.ok for c in calls) / n,
        "failed_wru": sum(c.wru for c in calls if not c.ok) / n,
        "rru": sum(c.rru for c in calls) / n,
        "rru_by": {label: sum(c.rru for c in calls if c.label == label) / n for label in {c.label for c in calls}},
        "sqs": sum(c.units for c in calls if c.service == "sqs") / n, "sqs_idle": len(idle) / n,
        "s3_put": sum(c.units for c in calls if c.service == "s3" and c.operation in S3_PUT_CLASS) / n,
        "s3_get": sum(c.units for c in calls if c.service == "s3" and c.operation not in S3_PUT_CLASS | S3_FREE) / n,
        "lambda": {f: k / n for f, k in invocations.items()},
        "usd": {k: v / n * 1e6 for k, v in dollars.items()},
        "ops": {k: v / n for k, v in Counter((c.label, c.service, c.operation) for c in calls).items()},
        "writes": {k: v / n for k, v in writes.items()},
        "worker_gb_s": seconds["worker"] * WORKER_GB / n,
        "worker_concurrency": n * latency / max(seconds["worker"], 1e-9),
        "moto_busy": moto_busy, "own_busy": own_busy, "moto_calls_s": len(during) / wall,
        "moto_wait_ms": 1000 * sum(c.seconds for c in during) / max(len(during), 1),
        "worker_wait_s": sum(c.seconds for c in calls if c.label == "worker" and c.service != "sqs") / n,
    }


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=320)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--latency", type=float, default=2.0)
    parser.add_argument("--budget", type=int, default=16)
    parser.add_argument("--result-bytes", type=int, default=1000)
    parser.add_argument("--max-cost", type=float, default=None, help="each batch's spending cap (max_cost_usd)")
    # A spread of latencies fills more of a batch's latency buckets (its analytics), which the batch item carries.
    parser.add_argument("--distribution", choices=("fixed", "lognormal", "long_tail"), default="fixed",
                        help="how the backend's latency spreads around L (as bench.throughput)")
    parser.add_argument("--sigma", type=float, default=0.5, help="lognormal: sigma of the latency's log")
    args = parser.parse_args(argv)
    n, latency = args.requests, args.latency
    prompt = f"[[sim:big:{args.result_bytes}]] cost"
    sim = {"latency_distribution": args.distribution, "latency_sigma": args.sigma}
    with local_stack(latency=latency, budget=args.budget, sim=sim) as (svc, session, base), recording(svc) as rec:
        LABEL.set("bench")
        idle_ms = []
        for _ in range(30):
            started = time.perf_counter()
            svc.table.get(*batch_key("batch_none"))
            idle_ms.append(1000 * (time.perf_counter() - started))
        runs = [one_batch(svc, session, base, rec, n, prompt, latency, args.max_cost) for _ in range(args.runs)]

    def med(key: str, sub: str | None = None) -> float:
        return median([r[key].get(sub, 0.0) if sub else r[key] for r in runs])

    wru, gsi, gsi_all, rru = med("wru"), med("gsi_wru"), med("gsi_wru_all"), med("rru")
    dollars = {k: med("usd", k) for k in runs[0]["usd"]}
    total = sum(dollars.values())
    lambda_per = {f: med("lambda", f) for f in sorted({f for r in runs for f in r["lambda"]})}
    spread = "" if args.distribution == "fixed" else f" ({args.distribution}, sigma {args.sigma:g})"
    print(f"cost: {n} requests with ~{args.result_bytes} B answers, L={latency}s{spread}, C={args.budget}; "
          f"{args.runs} runs, medians of the per-request figures (batch wall {med('wall'):.1f} s)")
    print(f"  DynamoDB per request: {med('ddb_calls'):.1f} calls; write units {wru:.2f} in the table + {gsi:.2f} in "
          f"GSIs = {wru + gsi:.2f}; read units {rru:.2f}; failed conditional writes "
          f"{med('failed_writes'):.3f} ({med('failed_wru'):.2f} write units)")
    projections = ", ".join(f"{name} {p}{'(' + ','.join(inc) + ')' if inc else ''}"
                            for name, (p, inc) in INDEX_PROJECTIONS.items())
    print(f"  GSI projections ({projections}): {gsi:.2f} write units per request in GSIs, against {gsi_all:.2f} in "
          f"the same run had every index projected ALL: {gsi_all - gsi:.2f} saved "
          f"({(gsi_all - gsi) / max(wru + gsi_all, 1e-9):.0%} of all write units)")
    rate_per_call = med("rate_wru") / max(med("api_calls"), 1)
    print(f"  the per-account request rate: {med('rate_calls'):.0f} bucket writes for the batch's "
          f"{med('api_calls'):.0f} API calls: {rate_per_call:.2f} write units per API call "
          f"(${rate_per_call * PRICE['wru'] * 1e6:.2f} per million API calls; included above, "
          f"{med('rate_wru') / n:.4f} per request here)")
    print(f"  SQS per request: {med('sqs'):.3f} billed requests (idle empty receives not counted: "
          f"{med('sqs_idle'):.2f} per request here, local pollers long-poll 1 s, AWS up to 20 s)")
    print(f"  S3 per request: {med('s3_get'):.3f} GET, {med('s3_put'):.4f} PUT/LIST")
    print("  Lambda invocations per request: " + ", ".join(f"{f} {v:.3f}" for f, v in lambda_per.items())
          + " (local schedule: sweeper every 1 s, dispatcher every 5 s; AWS: both once a minute)")
    print("  USD per million requests: " + ", ".join(f"{k} ${v:.2f}" for k, v in dollars.items())
          + f" = ${total:.2f}; goal <= ${GOAL_USD_PER_MILLION:.0f}: ratio {total / GOAL_USD_PER_MILLION:.2f} "
          + ("(met)" if total <= GOAL_USD_PER_MILLION else f"(NOT MET, over by ${total - GOAL_USD_PER_MILLION:.2f})"))
    ddb_no_gsi = dollars["dynamodb"] - gsi * PRICE["wru"] * 1e6
    print(f"    (DynamoDB without the GSI writes: ${ddb_no_gsi:.2f}; total ${total - gsi * PRICE['wru'] * 1e6:.2f})")
    verdict = "met" if wru <= GOAL_WRU else f"NOT MET, over by {wru - GOAL_WRU:.2f} WRU ({wru / GOAL_WRU:.1f}x)"
    print(f"  write units goal <= {GOAL_WRU:.0f} per request: {wru:.2f} in the table: ratio {wru / GOAL_WRU:.2f} "
          f"({verdict}); counting GSI writes {wru + gsi:.2f}: ratio {(wru + gsi) / GOAL_WRU:.2f}")
    print("  where the write units go, per request (who, call, op, item: table + GSI):")
    keys = {k[:4] for r in runs for k in r["writes"]}
    rows = sorted(((median([r["writes"].get((*k, "base"), 0.0) for r in runs]),
                    median([r["writes"].get((*k, "gsi"), 0.0) for r in runs]), k) for k in keys), reverse=True)
    for base_wru, gsi_wru, (who, call, op, kind) in rows:
        if base_wru + gsi_wru >= 0.05:
            print(f"    {base_wru:5.2f} + {gsi_wru:4.2f}  {who:10} {call:27} {op:14} {kind}")
    by = {label: med("rru_by", label) for label in sorted({k for r in runs for k in r["rru_by"]})}
    print("  read units per request by function: " + ", ".join(
        f"{label} {units:.2f} (${units * PRICE['rru'] * 1e6:.2f}/M)" for label, units in by.items() if units >= 0.005)
        + "; the sweeper's reads are mostly its fixed pass (every lease and index shard), run every 1 s here and "
          "once a minute on AWS")
    print("  calls per request (who, service, operation):")
    ops = {k for r in runs for k in r["ops"]}
    for k in sorted(ops):
        value = median([r["ops"].get(k, 0.0) for r in runs])
        if value >= 0.005:
            print(f"    {value:6.3f}  {k[0]:10} {k[1]:8} {k[2]}")
    worker = med("worker_gb_s")
    single = WORKER_GB * latency  # one request per invocation: L seconds at the same memory
    looping = DISPATCHER_GB * 55 / 60 * 3600 * 24 * 30 * LAMBDA_GB_SECOND_USD
    print(f"  Lambda duration: worker {worker / latency:.4f} GB-s per request per second of L "
          f"({worker * LAMBDA_GB_SECOND_USD * 1e6:.2f} $/M at L={latency}s) vs one request per invocation "
          f"{single / latency:.2f}: ratio {worker / single:.3f} (requests running at once per worker invocation: "
          f"{med('worker_concurrency'):.1f} on average); the dispatcher loops ~55 s a minute on AWS: "
          f"~{looping:.0f} $/month, fixed")
    print(f"  moto while the batch ran: {med('moto_calls_s'):.0f} DynamoDB calls/s, {med('moto_wait_ms'):.1f} ms each "
          f"on average (a GetItem on idle moto: {median(idle_ms):.1f} ms); CPU: moto server {med('moto_busy'):.0%}, "
          f"the stack's own process (API, dispatcher, workers, sweeper: one GIL) {med('own_busy'):.0%} of a core")
    wait_s = med("worker_wait_s")
    print(f"  worker time in AWS calls: {wait_s:.3f} s per request (a group's result puts overlap; how full the "
          f"backend is kept is measured by bench.throughput)")
    print(f"  reproduce: {command_line('bench.cost')}")
    return {"requests": n, "runs": args.runs, "wru": wru, "gsi_wru": gsi, "gsi_wru_all": gsi_all, "rru": rru,
            "usd_per_million": total, "rate_wru_per_api_call": rate_per_call,
            "usd": dollars, "wru_ratio": wru / GOAL_WRU, "usd_ratio": total / GOAL_USD_PER_MILLION,
            "worker_gb_s_per_l": worker / latency, "single_gb_s_per_l": single / latency}


if __name__ == "__main__":
    main()
