"""Ingest: create a 50,000-request inline batch with short prompts. Goal: median server time <= 2 s on the
local stack (API Gateway allows 30 s). Prints the peak memory of the API process and the AWS calls the
create made, split by service and operation.

Server time is the HTTP round trip of POST /v1/batches with the body encoded beforehand (so the client's
JSON encoding is not in it), and, without HTTP, a direct call of `batches.create_batch` in this process
against the same moto server. Peak memory: the growth of this process's peak RSS (VmHWM, reset before each
create) during the HTTP create (the API runs in this process), and tracemalloc's peak around one direct
create. The model budgets are 0 so that nothing is dispatched while creating.
"""

from __future__ import annotations

import argparse
import json
import time
import tracemalloc

from batchinfer.operations.openai import batches
from batchinfer.service.accounts import authenticate
from bench.calls import LABEL, by_operation, describe, recording
from bench.common import chat, command_line, local_stack, median

GOAL_SECONDS = 2.0
DEPLOYED_MAX_BODY = 4 * 2**20  # infra/config.py: max_body_bytes (LAMBDA_EVENT_BODY_LIMIT_BYTES)


def rss_mb(field: str = "VmRSS") -> float:
    """This process's resident set (or, with VmHWM, its peak since the last reset_peak), in MB."""
    for line in open("/proc/self/status"):
        if line.startswith(field + ":"):
            return int(line.split()[1]) / 1024
    return 0.0


def reset_peak() -> None:
    """Reset VmHWM to the current RSS (Linux: `echo 5 > /proc/self/clear_refs`)."""
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")


def spread(values: list[float], fmt: str = "{:.2f}") -> str:
    return "[" + ", ".join(fmt.format(v) for v in values) + "]"


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=50_000)
    parser.add_argument("--runs", type=int, default=3, help="creates over HTTP, and as many direct ones")
    args = parser.parse_args(argv)
    n, runs = args.requests, args.runs
    limits = {"max_unfinished_requests": 10 * n * runs, "max_unfinished_batches": 4 * runs}
    with local_stack(latency=0.0, budget=0, pollers=1, **limits) as (svc, session, base), recording(svc) as rec:
        LABEL.set("bench")
        principal = authenticate(svc, session.headers["Authorization"].removeprefix("Bearer "))
        started = time.perf_counter()
        body = json.dumps({"requests": [chat(f"r-{i}", f"Say hi {i}") for i in range(n)]}).encode()
        encode_s = time.perf_counter() - started
        http_s, growth, http_calls = [], [], []
        for _ in range(runs):
            rec.reset()
            reset_peak()
            before = rss_mb()
            started = time.perf_counter()
            answer = session.post(f"{base}/batches", data=body, headers={"Content-Type": "application/json"},
                                  timeout=120)
            http_s.append(time.perf_counter() - started)
            growth.append(rss_mb("VmHWM") - before)
            answer.raise_for_status()
            assert answer.json()["request_counts"]["total"] == n
            http_calls.append(by_operation(rec.calls, {"api"}))
        direct_s, direct_calls = [], []
        for _ in range(runs):
            rec.reset()
            token = LABEL.set("api")
            started = time.perf_counter()
            batches.create_batch(svc, principal, body, None)
            direct_s.append(time.perf_counter() - started)
            LABEL.reset(token)
            direct_calls.append(by_operation(rec.calls, {"api"}))
        tracemalloc.start()
        batches.create_batch(svc, principal, body, None)
        traced_peak = tracemalloc.get_traced_memory()[1] / 2**20
        tracemalloc.stop()
    result = {"requests": n, "body_mb": len(body) / 1e6, "http_s": median(http_s), "direct_s": median(direct_s),
              "rss_growth_mb": median(growth), "traced_peak_mb": traced_peak, "runs": runs,
              "ratio": median(http_s) / GOAL_SECONDS}
    print(f"ingest: {n} inline requests, body {len(body) / 1e6:.1f} MB (client-side JSON encoding {encode_s:.2f} s, "
          f"not counted); {runs} runs each")
    print(f"  server time, HTTP round trip of POST /v1/batches: median {median(http_s):.2f} s {spread(http_s)}; "
          f"goal <= {GOAL_SECONDS:.0f} s: ratio {median(http_s) / GOAL_SECONDS:.2f} "
          f"({'met' if median(http_s) <= GOAL_SECONDS else 'NOT MET'})")
    print(f"  server time, create_batch called directly: median {median(direct_s):.2f} s {spread(direct_s)}")
    print(f"  API process memory: peak RSS growth during the HTTP create median {median(growth):.0f} MB "
          f"{spread(growth, '{:.0f}')}; tracemalloc peak of a direct create {traced_peak:.0f} MB")
    print(f"  AWS calls of one create over HTTP (incl. authentication): {describe(http_calls[-1])}")
    print(f"  AWS calls of one direct create_batch: {describe(direct_calls[-1])}")
    if len(body) > DEPLOYED_MAX_BODY:
        print(f"  note: {len(body) / 2**20:.1f} MiB is over the deployed body limit (MAX_BODY_BYTES 4 MiB, under "
              f"Lambda's 6 MB payload): deployed, this batch answers 413 and needs shorter bodies or an upload")
    print(f"  reproduce: {command_line('bench.ingest')}")
    return result


if __name__ == "__main__":
    main()
