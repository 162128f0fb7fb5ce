"""File batch: a batch created from an uploaded JSONL file of 50,000 short chat requests (one model), as the
OpenAI SDK creates one. Goals: the file validated within 60 s of the create call's answer; finalization
(the output and error files) resumable, and measured against the sweeper's 70 s timeout per invocation.

Each run starts a fresh stack (moto answers GSI queries by scanning the whole table, so a second run on
the same stack would be slower). Measured:
- upload: the HTTP round trip of `POST /v1/files` (multipart body encoded beforehand, not counted);
- create: `POST /v1/batches` with `input_file_id` (answers `validating`);
- validation: from the create call's answer until the sweeper's `intake.validate_file_batch` has admitted
  the requests (the batch item gains `validated_at`), split into the wait for the sweeper to pick it up,
  checking the lines (`validate_file_lines`, CPU only) and waiting on moto. Budgets are 0 (set after a
  small real batch has run, see below), so nothing is dispatched and the time is validation alone;
- finalization: the validated batch's request items are then seeded as bench/export.py seeds them (clones
  of a real 20-request run's items; every 50th a failure the simulator refused with a 400, cloned from
  that run's failed items) and the batch item left as the last settlement leaves it; the real sweeper
  writes the output and error files (and output.jsonl, past EXPORT_REDIRECT_BYTES of results), a part at
  a time, resuming across invocations (`finalize.write`), until the batch is `completed`. Both files are
  downloaded and their lines counted (they must add up to N).

The local sweeper is given the deployed timeout (70 s, infra/functions.py; it stops starting parts 15 s
before it), so the number of sweeper runs is what it would be on AWS at moto's speed; locally an
invocation is not killed at its timeout, so the longest one is printed against it. To time the sweeper's
steps and label their AWS calls, `validate_file_batch`, `validate_file_lines` and `finalize.write` are
wrapped in place while the benchmark runs (timers only). Time spent waiting on moto is measured per call
(bench/calls.py; an S3 body read after the response headers is not counted).
"""

from __future__ import annotations

import argparse
import json
import time
from contextlib import contextmanager

from urllib3 import encode_multipart_formdata

from batchinfer.layout import batch_key
from batchinfer.service.background import finalize, sweep
from batchinfer.service.creating import intake
from batchinfer.settings import Settings
from bench.calls import LABEL, by_operation, describe, recording
from bench.common import MODEL, chat, command_line, local_stack, median, real_results, seed_results, wait
from bench.ingest import spread
from local.lambda_runtime import FakeContext

VALIDATION_GOAL_S = 60.0  # for 50,000 lines
SWEEPER_TIMEOUT_S = 70.0  # infra/functions.py SWEEPER
API_TIMEOUT_S = 29.0  # infra/functions.py API (API Gateway's integration timeout is 30 s)
DEPLOYED_MAX_REQUEST = 6_291_456 * 3 // 4  # a Lambda invoke payload, the body base64-encoded in it (settings.py)
FAILED_EVERY = 50  # 2% of the requests failed: both result files are written
CHAT = "/v1/chat/completions"


def input_file(n: int) -> bytes:
    """n lines of short chat requests (~200 bytes a line: ~10 MB for 50,000)."""
    return b"".join(json_line({**chat(f"r-{i:05d}", f"In one sentence, why does the sky look blue at noon? ({i})"),
                               "method": "POST", "url": CHAT}) for i in range(n))


def json_line(entry: dict) -> bytes:
    return json.dumps(entry, separators=(",", ":")).encode() + b"\n"


@contextmanager
def timed_steps():
    """While the block runs: the sweeper's validation and finalization steps are timed (start, end) and
    their AWS calls labelled `validation` / `finalize`; the local sweeper sees the deployed timeout."""
    spans: dict[str, list[tuple[float, float]]] = {"validation": [], "lines": [], "finalize": []}
    places = [(sweep, "validate_file_batch", "validation", True), (intake, "validate_file_lines", "lines", False),
              (finalize, "write", "finalize", True)]
    originals = [getattr(module, name) for module, name, _, _ in places]

    def timer(fn, span: str, label: bool):
        def wrapper(*args, **kwargs):
            token = LABEL.set(span) if label else None
            started = time.monotonic()
            try:
                return fn(*args, **kwargs)
            finally:
                spans[span].append((started, time.monotonic()))
                if token is not None:
                    LABEL.reset(token)
        return wrapper

    remaining = FakeContext.get_remaining_time_in_millis

    def deployed_timeout(self) -> int:
        return int(SWEEPER_TIMEOUT_S * 1000) if self.function_name == "sweeper" else remaining(self)

    for (module, name, span, label), fn in zip(places, originals, strict=True):
        setattr(module, name, timer(fn, span, label))
    FakeContext.get_remaining_time_in_millis = deployed_timeout
    try:
        yield spans
    finally:
        FakeContext.get_remaining_time_in_millis = remaining
        for (module, name, _, _), fn in zip(places, originals, strict=True):
            setattr(module, name, fn)


def moto_s(rec, *labels: str) -> float:
    return sum(c.seconds for c in rec.calls if c.label in labels)


def download_lines(session, base: str, file_id: str | None) -> tuple[int, int]:
    """(bytes, lines) of a result file, downloaded (large ones through the redirect to S3)."""
    if file_id is None:
        return 0, 0
    size = lines = 0
    with session.get(f"{base}/files/{file_id}/content", stream=True, timeout=600) as answer:
        answer.raise_for_status()
        for chunk in answer.iter_content(1 << 20):
            size, lines = size + len(chunk), lines + chunk.count(b"\n")
    return size, lines


def one_run(n: int, data: bytes, overrides: dict) -> dict:
    limits = {"max_unfinished_requests": max(Settings().max_unfinished_requests, 2 * n + 100), **overrides}
    with local_stack(latency=0.0, budget=16, pollers=2, file_batches_enabled=True, **limits) as (svc, session, base), \
            timed_steps() as spans, recording(svc) as rec:
        LABEL.set("bench")
        completed, failed = real_results(svc, session, base, "file", failing=2)  # budgets at 0 from here on
        body, content_type = encode_multipart_formdata(
            {"purpose": "batch", "file": ("requests.jsonl", data, "application/jsonl")})

        rec.reset()
        started = time.perf_counter()
        answer = session.post(f"{base}/files", data=body, headers={"Content-Type": content_type}, timeout=600)
        upload_s = time.perf_counter() - started
        answer.raise_for_status()
        upload_moto, upload_calls = moto_s(rec, "api"), describe(by_operation(rec.calls, {"api"}))
        file_id = answer.json()["id"]

        rec.reset()
        started = time.perf_counter()
        answer = session.post(f"{base}/batches", timeout=600, json={
            "input_file_id": file_id, "endpoint": CHAT, "completion_window": "24h"})
        answered = time.monotonic()
        create_s = time.perf_counter() - started
        answer.raise_for_status()
        batch = answer.json()
        assert batch["status"] == "validating", batch["status"]
        create_moto = moto_s(rec, "api")
        while True:
            item = svc.table.get(*batch_key(batch["id"]))
            if "validated_at" in item or item["status"] != "validating":
                break
            time.sleep(0.1)
        assert "validated_at" in item and item["total"] == n, (item["status"], item.get("errors"))
        (v_start, v_end), = spans["validation"][-1:]
        lines_s = sum(end - start for start, end in spans["lines"])
        validation_moto, validation_calls = moto_s(rec, "validation"), describe(by_operation(rec.calls, {"validation"}))

        rec.reset()
        started = time.monotonic()
        seeded = seed_results(svc, batch["id"], completed, failed, FAILED_EVERY)
        marked = time.monotonic()
        seed_s, seed_moto = marked - started, moto_s(rec, "bench")
        rec.reset()
        spans["finalize"].clear()
        final = wait(session, base, batch["id"], poll=0.5)
        final_s = time.monotonic() - marked
        item = svc.table.get(*batch_key(batch["id"]))
        runs = [end - start for start, end in spans["finalize"]]
        sweeper_runs = [seconds for function, seconds in rec.invocations if function == "sweeper"]
        final_moto, sweeper_moto = moto_s(rec, "finalize"), moto_s(rec, "finalize", "sweeper")
        queries = [c.seconds for c in rec.calls if c.label == "finalize" and c.operation == "Query"]
        out_bytes, out_lines = download_lines(session, base, final["output_file_id"])
        err_bytes, err_lines = download_lines(session, base, final["error_file_id"])
    assert final["status"] == "completed", final["status"]
    assert out_lines + err_lines == n and err_lines == seeded["failed"], (out_lines, err_lines, seeded)
    return {
        "upload_s": upload_s, "upload_moto": upload_moto, "upload_calls": upload_calls,
        "create_s": create_s, "create_moto": create_moto,
        "validation_s": v_end - answered, "pickup_s": v_start - answered, "validate_s": v_end - v_start,
        "lines_s": lines_s, "validation_moto": validation_moto, "validation_calls": validation_calls,
        "seed_s": seed_s, "seed_moto": seed_moto, "failed": seeded["failed"],
        "final_s": final_s, "final_moto": final_moto, "sweeper_moto": sweeper_moto, "runs": len(runs),
        "longest_run": max(runs), "longest_sweeper": max(sweeper_runs or [0.0]),
        "queries": len(queries), "query_s": median(queries or [0.0]),
        "writers": ", ".join(item.get("writing") or {}),
        "out_bytes": out_bytes, "out_lines": out_lines, "err_bytes": err_bytes, "err_lines": err_lines,
    }


def bound(moto: float, total: float) -> str:
    """Whether moto, not the service, accounts for most of a phase's time."""
    share = moto / total if total else 0.0
    return f"moto-bound: {share:.0%} of it" if share >= 0.5 else f"{share:.0%} of it moto"


def main(argv: list[str] | None = None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=50_000, help="lines of the input file")
    parser.add_argument("--runs", type=int, default=1, help="each on a fresh stack (~20 min each at 50,000)")
    args = parser.parse_args(argv)
    n = args.requests
    data = input_file(n)
    defaults, overrides = Settings(), {}
    if len(data) > defaults.max_file_bytes:  # raised only as far as this file needs
        overrides["max_file_bytes"] = len(data)
    if len(data) > defaults.max_direct_upload_bytes:
        # Deployed, a file this large goes through the Uploads API; here one POST /v1/files times the upload.
        overrides["max_direct_upload_bytes"] = len(data)
        print(f"  (max_direct_upload_bytes raised to {len(data)} for this benchmark: deployed, a file this large "
              "goes through the Uploads API)")
    if n > defaults.max_requests_per_batch:
        overrides["max_requests_per_batch"] = n
    runs = [one_run(n, data, overrides) for _ in range(args.runs)]

    def med(key: str) -> float:
        return median([r[key] for r in runs])

    def all_of(key: str, fmt: str = "{:.1f}") -> str:
        return spread([r[key] for r in runs], fmt)

    mb, last = len(data) / 1e6, runs[-1]
    raised = "; raised: " + ", ".join(f"{k} {v}" for k, v in overrides.items()) if overrides else ""
    print(f"file_batch: {n} lines ({mb:.1f} MB, {len(data) / n:.0f} B a line), one model ({MODEL}); {len(runs)} "
          f"runs, each on a fresh stack; sweeper timeout {SWEEPER_TIMEOUT_S:.0f} s as deployed{raised}")
    print(f"  upload, POST /v1/files over HTTP (multipart encoded beforehand): median {med('upload_s'):.2f} s "
          f"{all_of('upload_s', '{:.2f}')}, {mb / med('upload_s'):.1f} MB/s, of which {med('upload_moto'):.2f} s "
          f"waiting on moto ({bound(med('upload_moto'), med('upload_s'))}); within the API function's "
          f"{API_TIMEOUT_S:.0f} s timeout: ratio {med('upload_s') / API_TIMEOUT_S:.2f}")
    print(f"    AWS calls of the upload (incl. authentication): {last['upload_calls']}")
    if len(data) > DEPLOYED_MAX_REQUEST:
        print(f"  note: {mb:.1f} MB is over what one request through API Gateway to Lambda carries (~4.7 MB raw: a "
              "6 MB invoke payload, the body base64-encoded in it): deployed, a file this size needs the Uploads "
              "API (parts of at most MAX_UPLOAD_PART_BYTES)")
    print(f"  create, POST /v1/batches with input_file_id (answers validating): median {med('create_s'):.2f} s "
          f"{all_of('create_s', '{:.2f}')}, of which {med('create_moto'):.2f} s waiting on moto")
    print(f"  validation, the create call's answer to validated: median {med('validation_s'):.1f} s "
          f"{all_of('validation_s')}: the sweeper picked it up after {med('pickup_s'):.1f} s (it runs every 1 s "
          f"here), validate_file_batch {med('validate_s'):.1f} s {all_of('validate_s')}, of which checking the "
          f"lines {med('lines_s'):.1f} s ({n / med('lines_s'):.0f} lines/s, CPU) and waiting on moto "
          f"{med('validation_moto'):.1f} s ({bound(med('validation_moto'), med('validate_s'))})")
    print(f"    AWS calls of validate_file_batch: {last['validation_calls']}")
    ratio = med("validation_s") / VALIDATION_GOAL_S
    print(f"  validation goal <= {VALIDATION_GOAL_S:.0f} s (for 50,000 lines; here {n}): ratio {ratio:.2f} "
          f"({'met' if ratio <= 1 else 'NOT MET'}); on AWS the sweeper runs once a minute, which may add up to "
          "60 s before it starts")
    print(f"  finalization: request items seeded directly in {med('seed_s'):.0f} s (of which {med('seed_moto'):.0f} s "
          f"waiting on moto; clones of a real 20-request run, every {FAILED_EVERY}th failed: {last['failed']} "
          "failed), the batch item left as the last settlement leaves it")
    print(f"  finalization, settled to completed: median {med('final_s'):.0f} s {all_of('final_s', '{:.0f}')} in "
          f"{med('runs'):.0f} sweeper runs {all_of('runs', '{:.0f}')} (writers: {last['writers']}, each a pass over "
          f"every result), of which {med('final_moto'):.0f} s waiting on moto in finalize.write "
          f"({bound(med('final_moto'), med('final_s'))}; {med('sweeper_moto'):.0f} s with the sweeper's other calls"
          f"; {med('queries'):.0f} Query calls, median {med('query_s'):.2f} s each); without moto's time "
          f"{med('final_s') - med('final_moto'):.0f} s")
    total, longest = med("final_s") / SWEEPER_TIMEOUT_S, med("longest_sweeper") / SWEEPER_TIMEOUT_S
    print(f"  finalization goal <= {SWEEPER_TIMEOUT_S:.0f} s per sweeper invocation (not required: resumable): "
          f"all of it ratio {total:.2f} over {med('runs'):.0f} runs; longest sweeper invocation "
          f"{med('longest_sweeper'):.0f} s (finalize.write {med('longest_run'):.0f} s): ratio {longest:.2f} "
          f"({'met' if longest <= 1 else 'NOT MET: on AWS it would be cut off and its part written again'})")
    print(f"  files: output {last['out_bytes'] / 1e6:.1f} MB ({last['out_lines']} lines), error "
          f"{last['err_bytes'] / 1e6:.2f} MB ({last['err_lines']} lines): {last['out_lines'] + last['err_lines']} "
          f"lines, N = {n} ({'ok' if last['out_lines'] + last['err_lines'] == n else 'MISMATCH'})")
    print(f"  reproduce: {command_line('bench.file_batch')}")
    return runs


if __name__ == "__main__":
    main()
