"""Batch files and batches from a file, through the real API handler (Mangum, API Gateway events) and the
real worker and sweeper handlers, as the OpenAI SDK sends them (multipart layout from the wire contracts)."""

from __future__ import annotations

import hashlib
import json

import pytest

from batchinfer.layout import batch_key
from tests.helpers import (
    AS_SENT,
    CONTEXT_OVERFLOW,
    SIM_REJECTED,
    check_as_sent,
    error,
    finish,
    new_key,
    ok,
    settings,
    sim_requests,
    step_by_record,
)

BOUNDARY = "672e0c9c1d2ba60237426016355a8290"


def multipart(data: bytes, filename: str = "batchinput.jsonl", purpose: str = "batch",
              expires_after: tuple[str, str] | None = None) -> bytes:
    """The body `client.files.create(file=..., purpose=...)` sends: scalar fields first, the file last."""
    fields = [("purpose", purpose)]
    if expires_after:
        fields += [("expires_after[anchor]", expires_after[0]), ("expires_after[seconds]", expires_after[1])]
    out = b""
    for name, value in fields:
        out += (f"--{BOUNDARY}\r\nContent-Disposition: form-data; name=\"{name}\"\r\n\r\n{value}\r\n").encode()
    out += (f"--{BOUNDARY}\r\nContent-Disposition: form-data; name=\"file\"; filename=\"{filename}\"\r\n"
            "Content-Type: application/octet-stream\r\n\r\n").encode() + data + f"\r\n--{BOUNDARY}--\r\n".encode()
    return out


def upload(api, key: str, data: bytes, **kwargs):
    return api("POST", "/v1/files", key, body=multipart(data, **kwargs),
               headers={"content-type": f"multipart/form-data; boundary={BOUNDARY}"})


def line(custom_id: str, content: str = "hello", model: str = "glm-5.3-flash", url: str = "/v1/chat/completions",
         **body) -> dict:
    return {"custom_id": custom_id, "method": "POST", "url": url,
            "body": {"model": model, "messages": [{"role": "user", "content": content}], **body}}


def jsonl(*lines: dict | str) -> bytes:
    return b"".join((x if isinstance(x, str) else json.dumps(x)).encode() + b"\n" for x in lines)


def create_from(api, key: str, file_id: str, **extra):
    return api("POST", "/v1/batches", key, json_body={"input_file_id": file_id, "endpoint": "/v1/chat/completions",
                                                     "completion_window": "24h", **extra})


def content(api, key: str, file_id: str) -> tuple[bytes, str]:
    reply = api("GET", f"/v1/files/{file_id}/content", key, headers={"accept": "application/binary"})
    assert reply.status == 200, reply.body
    return reply.body, reply.headers["etag"]


def test_upload_list_retrieve_download_delete(api, svc):
    settings(svc, file_batches_enabled=True)
    _, key = new_key(svc)
    data = jsonl(line("a"), line("b"))
    uploaded = ok(upload(api, key, data))
    assert uploaded["id"].startswith("file-") and uploaded["object"] == "file"
    assert (uploaded["bytes"], uploaded["filename"], uploaded["purpose"]) == (len(data), "batchinput.jsonl", "batch")
    assert uploaded["status"] == "processed" and uploaded["expires_at"] == uploaded["created_at"] + 30 * 86400
    assert ok(api("GET", f"/v1/files/{uploaded['id']}", key)) == uploaded
    second = ok(upload(api, key, data, filename="two.jsonl", expires_after=("created_at", "3600")))
    assert second["expires_at"] == second["created_at"] + 3600
    listed = ok(api("GET", "/v1/files", key))
    assert [f["id"] for f in listed["data"]] == [second["id"], uploaded["id"]] and listed["has_more"] is False
    page = ok(api("GET", "/v1/files", key, query={"limit": "1", "order": "asc"}))
    assert [f["id"] for f in page["data"]] == [uploaded["id"]] and page["has_more"] is True
    rest = ok(api("GET", "/v1/files", key, query={"limit": "1", "order": "asc", "after": uploaded["id"]}))
    assert [f["id"] for f in rest["data"]] == [second["id"]] and rest["has_more"] is False
    body, etag = content(api, key, uploaded["id"])
    assert body == data and etag == f'"{hashlib.sha256(data).hexdigest()}"'
    assert ok(api("DELETE", f"/v1/files/{uploaded['id']}", key)) == {"id": uploaded["id"], "object": "file",
                                                                       "deleted": True}
    for method, path in (("GET", ""), ("GET", "/content"), ("DELETE", "")):
        error(api(method, f"/v1/files/{uploaded['id']}{path}", key), 404, "No such File object",
              code="file_not_found")


def test_uploads_refused_with_a_clear_error(api, svc):
    settings(svc, file_batches_enabled=True, max_uploads_per_hour=2, max_stored_file_bytes=100)
    _, key = new_key(svc)
    error(upload(api, key, b"x", purpose="fine-tune"), 400, "purpose must be 'batch'")
    error(upload(api, key, b"x", expires_after=("last_active_at", "3600")), 400, "expires_after[anchor]")
    error(upload(api, key, b"x", expires_after=("created_at", "60")), 400, "expires_after[seconds]")
    error(api("POST", "/v1/files", key, json_body={"purpose": "batch"}), 400, "multipart/form-data")
    too_big = upload(api, key, b"y" * 101)
    error(too_big, 413, "stored files past the limit", code="file_storage_exceeded")
    assert too_big.headers["x-should-retry"] == "false"
    settings(svc, max_direct_upload_bytes=50)  # past what one request carries: the Uploads API, said how
    direct = upload(api, key, b"z" * 51)
    error(direct, 413, "upload_file_chunked", code="file_too_large_for_one_request")
    assert "part_size=4194304" in direct.json()["error"]["message"] and direct.headers["x-should-retry"] == "false"
    ok(upload(api, key, b"z" * 10))
    ok(upload(api, key, b"z" * 10))
    third = upload(api, key, b"z" * 10)
    error(third, 429, "uploaded 2 files this hour", code="too_many_uploads")
    assert 0 < int(third.headers["retry-after"]) <= 3600
    settings(svc, file_batches_enabled=False)
    error(upload(api, key, b"z"), 400, "File batches are not enabled", code="file_batches_disabled")


def test_the_output_file_keeps_the_backends_body_as_it_sent_it(api, svc, sim_control):
    sim_control.put("/_sim/config", json={"answer_extra_json": AS_SENT})
    settings(svc, file_batches_enabled=True)
    _, key = new_key(svc)
    uploaded = ok(upload(api, key, jsonl(line("q-0"), line("q-1", "[[sim:big:40000]]"))))
    created = ok(create_from(api, key, uploaded["id"]))
    final = finish(svc, created["id"])
    out, _ = content(api, key, final["output_file_id"])
    assert out.decode().count(AS_SENT) == 2
    for text in out.splitlines():
        check_as_sent(json.loads(text)["response"]["body"]["timings"])


def test_the_error_file_carries_the_backends_error_as_it_sent_it(api, svc, sim_control):
    """An error file line in OpenAI's shape: the backend's status, request id and body as it sent it in
    `response`, its own fields and all."""
    settings(svc, file_batches_enabled=True)
    _, key = new_key(svc)
    uploaded = ok(upload(api, key, jsonl(line("overflow", "[[sim:context-overflow]] a long story"),
                                         line("rejected", "[[sim:400]] no"), line("fine"))))
    final = finish(svc, ok(create_from(api, key, uploaded["id"]))["id"])
    text = content(api, key, final["error_file_id"])[0].decode()
    lines = {x["custom_id"]: x for x in map(json.loads, text.splitlines())}
    results = {r["custom_id"]: r for r in ok(api.results(key, final["id"]))["data"]}
    for custom_id in ("overflow", "rejected"):
        error = results[custom_id]["error"]
        assert lines[custom_id] == {"id": results[custom_id]["id"], "custom_id": custom_id, "error": None,
                                    "response": {"status_code": 400, "request_id": error["request_id"],
                                                 "body": error["body"]}}
        assert error["request_id"].startswith("req_sim_")
    assert lines["rejected"]["response"]["body"] == SIM_REJECTED
    body = lines["overflow"]["response"]["body"]["error"]
    assert body["message"] == CONTEXT_OVERFLOW and body["type"] == "exceed_context_size_error"
    assert body["code"] == 400 and body["n_ctx"] == 4096
    assert f'"body":{{"error":{{"code":400,"message":"{CONTEXT_OVERFLOW}","type":"exceed_context_size_error"' in text


def test_a_batch_from_a_file_runs_and_writes_its_result_files(api, svc, sim_control):
    settings(svc, file_batches_enabled=True)
    _, key = new_key(svc)
    lines = [line(f"q-{i}", f"question {i}") for i in range(5)]
    lines[3] = line("q-3", "[[sim:400]] refuse this")  # the simulated backend answers 400 for it
    uploaded = ok(upload(api, key, jsonl(*lines[:3], "", *lines[3:])))  # an empty line is ignored
    created = ok(create_from(api, key, uploaded["id"], metadata={"project": "eval-42"}))
    assert created["status"] == "validating" and created["input_file_id"] == uploaded["id"]
    assert created["model"] is None  # not known until the file's lines are read
    # Deleting the upload does not affect the batch created from it.
    ok(api("DELETE", f"/v1/files/{uploaded['id']}", key))
    final = finish(svc, created["id"])
    batch = ok(api("GET", f"/v1/batches/{created['id']}", key))
    assert batch["status"] == "completed" and batch["errors"] is None and batch["model"] == "glm-5.3-flash"
    assert batch["request_counts"] == {"total": 5, "completed": 4, "failed": 1}, batch
    assert batch["finalizing_at"] is not None and final["output_file_id"] and final["error_file_id"]
    results = {r["custom_id"]: r for r in ok(api("GET", f"/v1/batches/{created['id']}/results", key))["data"]}
    out, out_etag = content(api, key, batch["output_file_id"])
    assert out_etag == f'"{hashlib.sha256(out).hexdigest()}"' and content(api, key, batch["output_file_id"])[0] == out
    outputs = [json.loads(x) for x in out.splitlines()]
    assert sorted(o["custom_id"] for o in outputs) == ["q-0", "q-1", "q-2", "q-4"]
    for o in outputs:
        assert o["response"] == results[o["custom_id"]]["response"] and o["error"] is None
        assert o["id"] == results[o["custom_id"]]["id"]
    errors = [json.loads(x) for x in content(api, key, batch["error_file_id"])[0].splitlines()]
    assert [e["custom_id"] for e in errors] == ["q-3"] and errors[0]["error"] is None
    assert errors[0]["response"]["status_code"] == 400 and errors[0]["response"]["body"]["error"]["message"]
    listed = {f["id"]: f for f in ok(api("GET", "/v1/files", key))["data"]}
    assert listed[batch["output_file_id"]]["purpose"] == "batch_output"
    assert ok(api("GET", "/v1/files", key, query={"purpose": "batch"}))["data"] == []
    # Deleting the batch deletes its result files.
    ok(api("DELETE", f"/v1/batches/{created['id']}", key))
    error(api("GET", f"/v1/files/{batch['output_file_id']}", key), 404)
    assert ok(api("GET", "/v1/files", key))["data"] == []


def test_an_invalid_file_fails_the_batch_with_every_problem_and_runs_nothing(api, svc, sim_control):
    settings(svc, file_batches_enabled=True)
    _, key = new_key(svc)
    data = jsonl(line("a"), "{not json", line("a"), line("b", model="qwen3.6-35b"),
                 line("c", url="/v1/embeddings"), line("d", stream=True),
                 {"custom_id": "e", "method": "POST", "url": "/v1/chat/completions"}, line("f", model="nope"))
    uploaded = ok(upload(api, key, data))
    created = ok(create_from(api, key, uploaded["id"]))
    final = finish(svc, created["id"])
    batch = ok(api("GET", f"/v1/batches/{created['id']}", key))
    assert batch["status"] == "failed" and final["failed_at"]
    assert batch["output_file_id"] is None and batch["error_file_id"] is None
    problems = [(p["line"], p["code"]) for p in batch["errors"]["data"]]
    assert problems == [(2, "invalid_json_line"), (3, "duplicate_custom_id"), (4, "model_mismatch"),
                        (5, "url_mismatch"), (6, "invalid_body"), (7, "invalid_request"), (8, "model_not_found")]
    assert all(p["message"] for p in batch["errors"]["data"])
    assert sim_requests(sim_control) == 0
    # An empty file, and too many lines.
    empty = ok(upload(api, key, b"\n\n"))
    failed = finish(svc, ok(create_from(api, key, empty["id"]))["id"])
    assert [p["code"] for p in failed["errors"]["data"]] == ["empty_file"]
    settings(svc, max_line_bytes=300)  # a line over the limit is named, the others still checked
    long_line = ok(upload(api, key, jsonl(line("ok"), line("long", "x" * 400), line("ok"))))
    failed = finish(svc, ok(create_from(api, key, long_line["id"]))["id"])
    assert [(p["line"], p["code"]) for p in failed["errors"]["data"]] == [(2, "line_too_large"),
                                                                           (3, "duplicate_custom_id")]
    settings(svc, max_requests_per_batch=2, max_line_bytes=4 * 1024 * 1024)
    many = ok(upload(api, key, jsonl(line("x"), line("y"), line("z"))))
    failed = finish(svc, ok(create_from(api, key, many["id"]))["id"])
    assert [p["code"] for p in failed["errors"]["data"]] == ["too_many_tasks"]
    assert sim_requests(sim_control) == 0


def test_a_line_nested_too_deeply_or_with_a_mistyped_model_is_named_as_such(api, svc, sim_control):
    settings(svc, file_batches_enabled=True)
    _, key = new_key(svc)
    data = jsonl(line("a"), "[" * 10_000 + "]" * 10_000, line("b", model=5), line("c", max_tokens="x"))
    created = ok(create_from(api, key, ok(upload(api, key, data))["id"]))
    finish(svc, created["id"])
    problems = ok(api("GET", f"/v1/batches/{created['id']}", key))["errors"]["data"]
    assert [(p["line"], p["code"], p["message"]) for p in problems] == [
        (2, "invalid_json_line", "Line 2 is nested too deeply to be read as JSON."),
        (3, "invalid_body", "body.model: input should be a valid string (got 5)"),
        (4, "invalid_body", "body.max_tokens: input should be a valid integer (got 'x')")]
    assert sim_requests(sim_control) == 0


def test_a_filename_past_the_limit_is_named_and_nothing_stored(api, svc):
    settings(svc, file_batches_enabled=True)
    _, key = new_key(svc)
    data = jsonl(line("a"))
    # 10,000 characters: past what the multipart parser reads of a part's header, before the name is seen.
    error(upload(api, key, data, filename="n" * 10_000), 400, param="file",
          message="The 'file' part's filename is too long: a filename may have at most 512 characters.")
    error(upload(api, key, data, filename="n" * 513), 400, param="file",
          message="The 'file' part's filename is too long (it has 513): a filename may have at most 512 characters.")
    assert ok(api("GET", "/v1/files", key))["data"] == []
    assert ok(upload(api, key, data, filename="n" * 512))["filename"] == "n" * 512


def test_create_from_a_file_refuses_bad_calls(api, svc):
    settings(svc, file_batches_enabled=True)
    _, key = new_key(svc)
    _, other = new_key(svc)
    theirs = ok(upload(api, other, jsonl(line("a"))))
    error(create_from(api, key, theirs["id"]), 400, "not found", code="file_not_found")
    error(create_from(api, key, "file-nope"), 400, "not found", code="file_not_found")
    mine = ok(upload(api, key, jsonl(line("a"))))
    error(create_from(api, key, mine["id"], completion_window="1h"), 400, "completion_window")
    error(create_from(api, key, mine["id"], endpoint="/v1/completions"), 400, "endpoint")
    error(create_from(api, key, mine["id"], output_expires_after={"anchor": "created_at", "seconds": 60}), 400,
          "output_expires_after[seconds]")
    # Another account's file is found nowhere.
    for method, path in (("GET", ""), ("GET", "/content"), ("DELETE", "")):
        error(api(method, f"/v1/files/{theirs['id']}{path}", key), 404)
    assert [f["id"] for f in ok(api("GET", "/v1/files", key))["data"]] == [mine["id"]]
    assert ok(api("GET", "/v1/batches", key))["data"] == []
    settings(svc, file_batches_enabled=False)
    error(create_from(api, key, mine["id"]), 400, "File batches are not enabled")


def test_a_file_batch_cancelled_while_validating_runs_nothing(api, svc, sim_control):
    settings(svc, file_batches_enabled=True)
    _, key = new_key(svc)
    uploaded = ok(upload(api, key, jsonl(*[line(f"q-{i}") for i in range(3)])))
    created = ok(create_from(api, key, uploaded["id"]))
    cancelled = ok(api("POST", f"/v1/batches/{created['id']}/cancel", key))
    assert cancelled["status"] in ("cancelling", "cancelled")
    final = finish(svc, created["id"])
    assert final["status"] == "cancelled" and sim_requests(sim_control) == 0
    batch = ok(api("GET", f"/v1/batches/{created['id']}", key))
    assert batch["request_counts"]["total"] == 0 and batch["output_file_id"] is None


def test_result_files_resume_where_a_killed_writer_stopped(api, svc, monkeypatch):
    """The sweeper dies while writing a result file: the next run resumes the same multipart upload from
    the saved cursor, and the file has exactly the bytes (and the SHA-256 ETag) of the results."""
    from batchinfer.service.background import finalize

    settings(svc, file_batches_enabled=True, result_part_bytes=400)
    monkeypatch.setattr("moto.s3.models.S3_UPLOAD_PART_MIN_SIZE", 1)  # small parts, so that there are several
    monkeypatch.setattr(finalize, "EXPORT_PAGE", 2)
    _, key = new_key(svc)
    uploaded = ok(upload(api, key, jsonl(*[line(f"q-{i:02d}", f"question {i}") for i in range(12)])))
    batch_id = ok(create_from(api, key, uploaded["id"]))["id"]
    real_put_part, calls = svc.blobs.put_part, []

    class Killed(BaseException):
        """The process dying (not an exception the sweeper's bulkheads catch and go on from)."""

    def killed_on_the_third_part(*args, **kwargs):
        calls.append(args[2])
        if len(calls) == 3:
            raise Killed("the sweeper was killed")
        return real_put_part(*args, **kwargs)

    monkeypatch.setattr(svc.blobs, "put_part", killed_on_the_third_part)
    with pytest.raises(Killed, match="killed"):
        finish(svc, batch_id)
    cut = svc.table.get(*batch_key(batch_id))
    assert cut["status"] == "finalizing" and len(cut["writing"]["output"]["parts"]) == 2
    final = finish(svc, batch_id)
    assert final["status"] == "completed"
    state = final["writing"]["output"]
    assert state["upload_id"] == cut["writing"]["output"]["upload_id"] and len(state["parts"]) > 3  # resumed
    assert calls[2] == calls[3] == 3  # the part being written when it died was written again, not skipped
    results = ok(api("GET", f"/v1/batches/{batch_id}/results", key))["data"]
    expected = b"".join(json.dumps({"id": r["id"], "custom_id": r["custom_id"], "response": r["response"],
                                    "error": None}, separators=(",", ":")).encode() + b"\n" for r in results)
    data, etag = content(api, key, final["output_file_id"])
    assert data == expected and etag == f'"{hashlib.sha256(expected).hexdigest()}"'
    assert ok(api("GET", f"/v1/files/{final['output_file_id']}", key))["bytes"] == len(expected)
    assert final["error_file_id"] is None
    # A run holding an old cursor cannot advance the finished writer again.
    assert finalize.write(svc, cut, ("output",)) is None
    assert content(api, key, final["output_file_id"])[0] == expected


def test_deleted_result_files_expired_uploads_and_idempotent_file_batches(api, svc):
    settings(svc, file_batches_enabled=True)
    _, key = new_key(svc)
    uploaded = ok(upload(api, key, jsonl(line("a"), line("b"))))
    headers = {"idempotency-key": "file-job-1"}
    body = {"input_file_id": uploaded["id"], "endpoint": "/v1/chat/completions", "completion_window": "24h"}
    first = ok(api("POST", "/v1/batches", key, json_body=body, headers=headers))
    again = api("POST", "/v1/batches", key, json_body=body, headers=headers)
    assert ok(again)["id"] == first["id"] and again.headers["idempotent-replayed"] == "true"
    reused = api("POST", "/v1/batches", key, json_body={**body, "metadata": {"x": "y"}}, headers=headers)
    error(reused, 409, code="idempotency_key_reused")
    assert reused.headers["x-should-retry"] == "false"  # the OpenAI SDK would retry a 409 otherwise
    final = finish(svc, first["id"])
    # A deleted result file is not written again: the batch keeps naming it, its download answers 404, and
    # the results stay readable until the batch is deleted.
    ok(api("DELETE", f"/v1/files/{final['output_file_id']}", key))
    finish(svc, first["id"])
    batch = ok(api("GET", f"/v1/batches/{first['id']}", key))
    assert batch["output_file_id"] == final["output_file_id"]
    error(api("GET", f"/v1/files/{final['output_file_id']}/content", key), 404)
    assert [r["status"] for r in ok(api("GET", f"/v1/batches/{first['id']}/results", key))["data"]] == [
        "completed", "completed"]
    assert api("GET", f"/v1/batches/{first['id']}/output.jsonl", key).status == 200
    # An upload past its expiry reads as not found everywhere and cannot start a batch.
    short = ok(upload(api, key, jsonl(line("c")), expires_after=("created_at", "3600")))
    base = svc.clock
    svc.clock = lambda: base() + 3601
    error(api("GET", f"/v1/files/{short['id']}", key), 404)
    assert short["id"] not in [f["id"] for f in ok(api("GET", "/v1/files", key))["data"]]
    error(create_from(api, key, short["id"]), 400, "not found", code="file_not_found")


def test_a_writer_out_of_time_keeps_what_it_read_and_the_next_run_goes_on(api, svc, monkeypatch):
    """Each sweeper run has time for a couple of pages only: lines too few for a part wait in a carry object,
    every run makes progress, and the file still has exactly the results' bytes."""
    from batchinfer.service import lifecycle
    from batchinfer.service.background import finalize

    settings(svc, file_batches_enabled=True)
    monkeypatch.setattr(finalize, "EXPORT_PAGE", 2)
    _, key = new_key(svc)
    uploaded = ok(upload(api, key, jsonl(*[line(f"q-{i:02d}", f"question {i}") for i in range(12)])))
    batch_id = ok(create_from(api, key, uploaded["id"]))["id"]
    # Run every request, with a sweeper that has no time left for writing: the batch stops at finalizing.
    real_settle = lifecycle.settle_batch
    monkeypatch.setattr("batchinfer.service.background.sweep.settle_batch",
                        lambda svc, batch_id, deadline=None: real_settle(svc, batch_id, deadline=-1.0))
    for _ in range(40):
        step_by_record(svc)
        if svc.table.get(*batch_key(batch_id))["status"] == "finalizing":
            break
    assert svc.table.get(*batch_key(batch_id))["status"] == "finalizing"
    ticks = iter(range(10**6))
    monkeypatch.setattr(finalize.time, "monotonic", lambda: float(next(ticks)))
    runs = 0
    while (batch := svc.table.get(*batch_key(batch_id)))["status"] != "completed":
        runs += 1
        assert runs < 50, "no progress"
        real_settle(svc, batch_id, deadline=float(next(ticks)) + 4)  # time for about two pages
    assert runs > 3
    results = ok(api("GET", f"/v1/batches/{batch_id}/results", key))["data"]
    expected = b"".join(json.dumps({"id": r["id"], "custom_id": r["custom_id"], "response": r["response"],
                                    "error": None}, separators=(",", ":")).encode() + b"\n" for r in results)
    data, etag = content(api, key, batch["output_file_id"])
    assert data == expected and etag == f'"{hashlib.sha256(expected).hexdigest()}"'
    leftovers = svc.blobs.s3.list_objects_v2(Bucket=svc.settings.bucket_name, Prefix="files/").get("Contents", [])
    assert not [o["Key"] for o in leftovers if ".carry-" in o["Key"]]


def test_any_filename_downloads(api, svc):
    settings(svc, file_batches_enabled=True)
    _, key = new_key(svc)
    uploaded = ok(upload(api, key, jsonl(line("a")), filename='données "q1" 😀.jsonl'))
    assert uploaded["filename"] == 'données "q1" 😀.jsonl'
    reply = api("GET", f"/v1/files/{uploaded['id']}/content", key)
    assert reply.status == 200 and reply.headers["content-disposition"].startswith('attachment; filename="donn')
    assert "filename*=UTF-8''donn%C3%A9es%20%22q1%22%20%F0%9F%98%80.jsonl" in reply.headers["content-disposition"]
