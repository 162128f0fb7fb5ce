"""Export: output.jsonl and /results paging over a finished 50,000-request batch. Goal: streamed, the API
process's peak memory grows by <= 64 MB; prints MB/s.

Running 50,000 requests through moto takes over an hour on this machine (~12 requests/s at latency 0), so
the results are written directly: a small real batch runs first, and its stored request items (state
`completed`, the simulator's responses) are cloned into a 50,000-request batch created over HTTP (budgets
at 0 so nothing of it is dispatched), 25 items per BatchWriteItem. The batch item is then left as the last
worker's settlement leaves it (every request counted, nothing open or in flight) and the real sweeper
finalizes it: past EXPORT_REDIRECT_BYTES of results it writes output.jsonl to S3 (multipart, streamed)
and GET output.jsonl answers with a redirect to it.

Measured: the finalization (the sweeper's export), `export_lines` iterated in this process (the streamed
path smaller batches take; tracemalloc peak), the HTTP download of output.jsonl streamed with
`iter_content`, and every /results page (limit 1000) over HTTP. Memory: growth of this process's peak RSS
(VmHWM, reset before each; the API and the sweeper run in this process). Time spent waiting on moto is
measured per call (bench/calls.py), to separate moto's speed from the service's.
"""

from __future__ import annotations

import argparse
import time
import tracemalloc

from batchinfer.layout import batch_key
from batchinfer.operations.openai import batches
from batchinfer.service.accounts import authenticate
from bench.calls import LABEL, recording
from bench.common import chat, command_line, create, local_stack, median, real_results, seed_results, wait
from bench.ingest import reset_peak, rss_mb, spread

GOAL_MB = 64
TRACED_RESULTS = 5000  # tracemalloc slows the process: it watches the first chunks only


def seed(svc, session, base: str, n: int, prompt: str) -> dict:
    """An n-request batch whose request items are clones of a small real batch's, ready to be finalized."""
    completed, _ = real_results(svc, session, base, prompt)  # budgets at 0 from then on: nothing is dispatched
    batch = create(session, base, [chat(f"e-{i}", f"{prompt} {i}") for i in range(n)])
    seed_results(svc, batch["id"], completed)
    return batch


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=50_000)
    parser.add_argument("--runs", type=int, default=3, help="downloads of output.jsonl (the cheap part)")
    parser.add_argument("--page-runs", type=int, default=1, help="passes over /results (each a full scan)")
    parser.add_argument("--result-bytes", type=int, default=0,
                        help="answers of about this size ([[sim:big:N]]); 0: the simulator's short answers")
    args = parser.parse_args(argv)
    n, runs = args.requests, args.runs
    prompt = f"[[sim:big:{args.result_bytes}]] export" if args.result_bytes else "export"
    with local_stack(latency=0.0, budget=16, max_unfinished_requests=2 * n) as (svc, session, base), \
            recording(svc, settle=False) as rec:
        LABEL.set("bench")
        started = time.monotonic()
        batch = seed(svc, session, base, n, prompt)
        seed_s = time.monotonic() - started
        rec.reset()
        reset_peak()
        before, started = rss_mb(), time.monotonic()
        final = wait(session, base, batch["id"], poll=0.5)
        final_s, final_growth = time.monotonic() - started, rss_mb("VmHWM") - before
        final_moto = sum(c.seconds for c in rec.calls if c.label == "sweeper")
        exported = svc.table.get(*batch_key(batch["id"])).get("export_object")
        principal = authenticate(svc, session.headers["Authorization"].removeprefix("Bearer "))

        rec.reset()
        token = LABEL.set("api")
        reset_peak()
        before, size, lines = rss_mb(), 0, 0
        started = time.perf_counter()
        for chunk in batches.export_lines(svc, principal, batch["id"]):
            size, lines = size + len(chunk), lines + chunk.count(b"\n")
        direct_s, direct_growth = time.perf_counter() - started, rss_mb("VmHWM") - before
        direct_moto = sum(c.seconds for c in rec.calls if c.label == "api")
        queries = [c.seconds for c in rec.calls if c.operation == "Query" and c.label == "api"]
        assert lines == n, lines
        traced = min(n, TRACED_RESULTS)
        tracemalloc.start()
        for i, _ in enumerate(batches.export_lines(svc, principal, batch["id"])):
            if (i + 1) * 1000 >= traced:
                break
        traced_peak = tracemalloc.get_traced_memory()[1] / 2**20
        tracemalloc.stop()
        LABEL.reset(token)

        http_s, http_growth = [], []
        for _ in range(runs):
            reset_peak()
            before, got = rss_mb(), 0
            started = time.perf_counter()
            with session.get(f"{base}/batches/{batch['id']}/output.jsonl", stream=True, timeout=600) as answer:
                answer.raise_for_status()
                redirected = bool(answer.history)
                for chunk in answer.iter_content(1 << 20):
                    got += len(chunk)
            http_s.append(time.perf_counter() - started)
            http_growth.append(rss_mb("VmHWM") - before)
            assert got == size, (got, size)

        page_s, page_growth, page_bytes, page_moto = [], [], 0, []
        for _ in range(args.page_runs):
            rec.reset()
            reset_peak()
            before, after, count, page_bytes = rss_mb(), None, 0, 0
            started = time.perf_counter()
            while True:
                params = {"limit": 1000, **({"after": after} if after else {})}
                answer = session.get(f"{base}/batches/{batch['id']}/results", params=params, timeout=600)
                answer.raise_for_status()
                page = answer.json()
                page_bytes += len(answer.content)
                count += len(page["data"])
                after = page["last_id"]
                if not page["has_more"]:
                    break
            page_s.append(time.perf_counter() - started)
            page_growth.append(rss_mb("VmHWM") - before)
            page_moto.append(sum(c.seconds for c in rec.calls if c.label == "api"))
            assert count == n, count

    mb = size / 1e6
    worst = max(http_growth + page_growth + [traced_peak, final_growth, direct_growth])
    how = "redirect to S3, written by the sweeper at finalization" if redirected else "streamed by the API"
    print(f"export: {n} results, output.jsonl {mb:.1f} MB ({size / n:.0f} B a line); results seeded directly in "
          f"{seed_s:.0f} s (clones of a real 20-request run), finalized by the sweeper")
    to_s3 = ", output.jsonl written to S3" if exported else ""
    print(f"  finalization (status {final['status']}{to_s3}): {final_s:.0f} s, {mb / final_s:.2f} MB/s, of which "
          f"{final_moto:.0f} s waiting on moto; peak RSS growth {final_growth:.0f} MB")
    print(f"  output.jsonl over HTTP ({how}), {runs} runs: median {median(http_s):.2f} s {spread(http_s)}, "
          f"{mb / median(http_s):.1f} MB/s; peak RSS growth median {median(http_growth):.0f} MB "
          f"{spread(http_growth, '{:.0f}')}")
    print(f"  export_lines in process (the streamed path): {direct_s:.0f} s, {mb / direct_s:.2f} MB/s, of which "
          f"{direct_moto:.0f} s waiting on moto ({len(queries)} Query calls of 1000 items, median "
          f"{median(queries or [0]):.2f} s each); without moto's time {mb / max(direct_s - direct_moto, 1e-9):.1f} "
          f"MB/s; peak RSS growth {direct_growth:.0f} MB; tracemalloc peak over the first {traced} results "
          f"{traced_peak:.1f} MB")
    print(f"  /results, {-(-n // 1000)} pages of 1000, {len(page_s)} runs: median {median(page_s):.0f} s, "
          f"{page_bytes / 1e6 / median(page_s):.2f} MB/s ({n / median(page_s):.0f} results/s), of which "
          f"{median(page_moto):.0f} s waiting on moto; peak RSS growth median {median(page_growth):.0f} MB")
    print(f"  memory goal <= {GOAL_MB} MB: worst growth {worst:.0f} MB, ratio {worst / GOAL_MB:.2f} "
          f"({'met' if worst <= GOAL_MB else 'NOT MET'})")
    print(f"  reproduce: {command_line('bench.export')}")
    return {"requests": n, "mb": mb, "http_mb_s": mb / median(http_s), "direct_mb_s": mb / direct_s,
            "final_s": final_s, "pages_mb_s": page_bytes / 1e6 / median(page_s), "worst_mb": worst,
            "ratio": worst / GOAL_MB, "runs": runs, "redirected": redirected,
            "direct_mb_s_without_moto": mb / max(direct_s - direct_moto, 1e-9)}


if __name__ == "__main__":
    main()
