"""Export: output.jsonl and /results paging over a finished 50,000-request batch. Goal: streamed, the API
process's peak memory grows by <= 64 MB; prints MB/s.

Running 50,000 requests through moto takes about an hour on this machine (~12 requests/s at latency 0, see
docs/benchmarks.md), so the results are written directly: a small real batch runs first, and its stored
request items (state `completed`, the simulator's responses) are cloned into a 50,000-request batch created
over HTTP (budgets at 0 so nothing of it is dispatched), 25 items per BatchWriteItem; the batch item is
then set as the sweeper would finalize it. The export code reads exactly what a real run leaves behind.

Measured: `export_lines` iterated in this process (tracemalloc peak), the HTTP download of output.jsonl
streamed with `iter_content` and every /results page (limit 1000) over HTTP (growth of this process's
peak RSS, VmHWM reset before each run; the API runs in this process).
"""

from __future__ import annotations

import argparse
import time
import tracemalloc

from batchinfer.layout import account_key, batch_key, lane_key, request_key
from batchinfer.service import batches
from batchinfer.service.accounts import authenticate
from batchinfer.storage.dynamo import serialize
from bench.common import chat, command_line, create, local_stack, median, wait
from bench.ingest import reset_peak, rss_mb, spread

GOAL_MB = 64
MODEL = "glm-5.3-flash"


def seed(svc, session, base: str, n: int, prompt: str) -> dict:
    """A finished n-request batch whose request items are clones of a small real batch's."""
    template = wait(session, base, create(session, base, [chat(f"t-{i}", f"{prompt} {i}") for i in range(20)])["id"],
                    poll=0.2)
    items = list(svc.table.query_all("pk = :pk AND begins_with(sk, :r)",
                                     {":pk": f"BATCH#{template['id']}", ":r": "REQ#"}, consistent=True))
    for model in svc.catalog.runnable:
        model.batch_budget = 0  # nothing of the big batch is dispatched
    batch = create(session, base, [chat(f"e-{i}", f"{prompt} {i}") for i in range(n)])
    stored = svc.table.get(*batch_key(batch["id"]))
    index = batches._index_entries(svc, batch["id"], 0, n)
    client, pending = svc.table.client, []
    for i, (custom_id, _, offset, length) in enumerate(index):
        pk, sk = request_key(batch["id"], i)
        pending.append({"PutRequest": {"Item": serialize({
            **items[i % len(items)], "pk": pk, "sk": sk, "batch_id": batch["id"], "index": i,
            "custom_id": custom_id, "offset": offset, "length": length})}})
        if len(pending) == 25 or i == n - 1:
            request = {svc.table.name: pending}
            while request:
                request = client.batch_write_item(RequestItems=request).get("UnprocessedItems")
            pending = []
    now = svc.now()
    tokens = {k: sum(int(items[i % len(items)]["response"]["body"]["usage"][k]) for i in range(n))
              for k in ("prompt_tokens", "completion_tokens")}
    svc.table.update(*batch_key(batch["id"]),
                     "SET #status = :c, completed_at = :now, finalizing_at = :now, in_progress_at = :now, "
                     "lanes.#m.#next = :n, completed = :n, input_tokens = :i, output_tokens = :o "
                     "REMOVE active_pk, active_sk",
                     vals={":c": "completed", ":now": now, ":n": n, ":i": tokens["prompt_tokens"],
                           ":o": tokens["completion_tokens"]}, names={"#m": MODEL})
    svc.table.delete(*lane_key(MODEL, stored["created_at"], batch["id"]))
    svc.table.update(*account_key(stored["account_id"]), "ADD unfinished_batches :m, unfinished_requests :r",
                     vals={":m": -1, ":r": -n})
    return batch


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=50_000)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--result-bytes", type=int, default=0,
                        help="answers of about this size ([[sim:big:N]]); 0: the simulator's short answers")
    args = parser.parse_args(argv)
    n, runs = args.requests, args.runs
    prompt = f"[[sim:big:{args.result_bytes}]] export" if args.result_bytes else "export"
    with local_stack(latency=0.0, budget=16, max_unfinished_requests=2 * n) as (svc, session, base):
        started = time.monotonic()
        batch = seed(svc, session, base, n, prompt)
        seed_s = time.monotonic() - started
        principal = authenticate(svc, session.headers["Authorization"].removeprefix("Bearer "))
        direct_s, http_s, http_growth, page_s, page_growth = [], [], [], [], []
        size = 0
        for _ in range(runs):
            started = time.perf_counter()
            size = sum(len(chunk) for chunk in batches.export_lines(svc, principal, batch["id"]))
            direct_s.append(time.perf_counter() - started)
        tracemalloc.start()
        lines = sum(chunk.count(b"\n") for chunk in batches.export_lines(svc, principal, batch["id"]))
        traced_peak = tracemalloc.get_traced_memory()[1] / 2**20
        tracemalloc.stop()
        assert lines == n, lines
        for _ in range(runs):
            reset_peak()
            before, got = rss_mb(), 0
            started = time.perf_counter()
            with session.get(f"{base}/batches/{batch['id']}/output.jsonl", stream=True, timeout=600) as answer:
                answer.raise_for_status()
                for chunk in answer.iter_content(1 << 20):
                    got += len(chunk)
            http_s.append(time.perf_counter() - started)
            http_growth.append(rss_mb("VmHWM") - before)
            assert got == size, (got, size)
        page_bytes = 0
        for _ in range(runs):
            reset_peak()
            before, after, count, page_bytes = rss_mb(), None, 0, 0
            started = time.perf_counter()
            while True:
                params = {"limit": 1000, **({"after": after} if after else {})}
                answer = session.get(f"{base}/batches/{batch['id']}/results", params=params, timeout=120)
                answer.raise_for_status()
                page = answer.json()
                page_bytes += len(answer.content)
                count += len(page["data"])
                after = page["last_id"]
                if not page["has_more"]:
                    break
            page_s.append(time.perf_counter() - started)
            page_growth.append(rss_mb("VmHWM") - before)
            assert count == n, count
    mb, worst = size / 1e6, max(http_growth + page_growth + [traced_peak])
    print(f"export: {n} results, output.jsonl {mb:.1f} MB ({size / n:.0f} B a line); results seeded directly "
          f"in {seed_s:.0f} s (clones of a real 20-request run); {runs} runs each")
    print(f"  output.jsonl over HTTP, streamed: median {median(http_s):.2f} s {spread(http_s)}, "
          f"{mb / median(http_s):.1f} MB/s; peak RSS growth median {median(http_growth):.0f} MB "
          f"{spread(http_growth, '{:.0f}')}")
    print(f"  export_lines in process: median {median(direct_s):.2f} s, {mb / median(direct_s):.1f} MB/s; "
          f"tracemalloc peak {traced_peak:.1f} MB")
    print(f"  /results, {-(-n // 1000)} pages of 1000: median {median(page_s):.2f} s {spread(page_s)}, "
          f"{page_bytes / 1e6 / median(page_s):.1f} MB/s ({n / median(page_s):.0f} results/s); "
          f"peak RSS growth median {median(page_growth):.0f} MB")
    print(f"  memory goal <= {GOAL_MB} MB: worst growth {worst:.0f} MB, ratio {worst / GOAL_MB:.2f} "
          f"({'met' if worst <= GOAL_MB else 'NOT MET'})")
    print(f"  reproduce: {command_line('bench.export')}")
    return {"requests": n, "mb": mb, "http_mb_s": mb / median(http_s), "direct_mb_s": mb / median(direct_s),
            "pages_mb_s": page_bytes / 1e6 / median(page_s), "http_growth_mb": median(http_growth),
            "page_growth_mb": median(page_growth), "traced_peak_mb": traced_peak, "worst_mb": worst,
            "ratio": worst / GOAL_MB, "runs": runs}


if __name__ == "__main__":
    main()
