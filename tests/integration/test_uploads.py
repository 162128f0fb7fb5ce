"""The Uploads API (a file sent in parts), through the real API handler (Mangum, API Gateway events) as the
OpenAI SDK's `client.uploads.upload_file_chunked` calls it: create, parts (multipart `data`), complete; and
cancel. The part limit is the deployed default, so the events here are the size API Gateway would send."""

from __future__ import annotations

import hashlib
import json

from tests.helpers import error, finish, new_key, ok, s3_keys, settings
from tests.integration.test_files import content, create_from, jsonl, line, upload

BOUNDARY = "0f4b4a7a1c2d3e4f5a6b7c8d9e0f1a2b"
LAMBDA_PAYLOAD_BYTES = 6_291_456  # the most a synchronous Lambda invocation's event may be


def part_body(data: bytes) -> bytes:
    """The body `client.uploads.parts.create(upload_id=..., data=<bytes>)` sends."""
    return (f"--{BOUNDARY}\r\nContent-Disposition: form-data; name=\"data\"; filename=\"upload\"\r\n"
            "Content-Type: application/octet-stream\r\n\r\n").encode() + data + f"\r\n--{BOUNDARY}--\r\n".encode()


def create(api, key: str, size: int, filename: str = "big.jsonl", **extra):
    return api("POST", "/v1/uploads", key, json_body={"bytes": size, "filename": filename,
                                                      "mime_type": "application/jsonl", "purpose": "batch", **extra})


def add_part(api, key: str, upload_id: str, data: bytes, **headers):
    return api("POST", f"/v1/uploads/{upload_id}/parts", key, body=part_body(data),
               headers={"content-type": f"multipart/form-data; boundary={BOUNDARY}", **headers})


def complete(api, key: str, upload_id: str, part_ids: list[str], **extra):
    return api("POST", f"/v1/uploads/{upload_id}/complete", key, json_body={"part_ids": part_ids, **extra})


def cancel(api, key: str, upload_id: str):
    return api("POST", f"/v1/uploads/{upload_id}/cancel", key, headers={"content-type": "application/json"})


def send_in_parts(api, key: str, data: bytes, cuts: list[int]) -> tuple[dict, list[str]]:
    """Create an upload of `data` and add it in parts cut at `cuts`; (the upload, its part ids in order)."""
    created = ok(create(api, key, len(data)))
    bounds = [0, *cuts, len(data)]
    part_ids = []
    for start, end in zip(bounds, bounds[1:], strict=False):
        part = ok(add_part(api, key, created["id"], data[start:end]))
        assert part["object"] == "upload.part" and part["upload_id"] == created["id"]
        assert part["id"].startswith("part_") and isinstance(part["created_at"], int)
        part_ids.append(part["id"])
    return created, part_ids


def lines_of(n: int, **kwargs) -> bytes:
    return jsonl(*[line(f"q-{i}", f"question {i}", **kwargs) for i in range(n)])


def test_create_three_parts_complete_makes_the_file_of_their_bytes(api, svc):
    settings(svc, file_batches_enabled=True)
    _, key = new_key(svc)
    data = lines_of(9)
    created, part_ids = send_in_parts(api, key, data, [len(data) // 3 - 7, 2 * len(data) // 3 + 5])  # mid-line cuts
    assert created["id"].startswith("upload_") and created["object"] == "upload"
    assert (created["bytes"], created["filename"], created["purpose"]) == (len(data), "big.jsonl", "batch")
    assert created["status"] == "pending" and created["file"] is None
    assert created["expires_at"] == created["created_at"] + 3600
    assert len(part_ids) == 3 and len(s3_keys(svc, f"files/{created['id']}/parts/")) == 3
    done = ok(complete(api, key, created["id"], part_ids))
    assert {k: v for k, v in done.items() if k not in ("status", "file")} == {
        k: v for k, v in created.items() if k not in ("status", "file")}
    assert done["status"] == "completed"
    file = done["file"]
    assert file["id"].startswith("file-") and file["object"] == "file" and file["status"] == "processed"
    assert (file["bytes"], file["filename"], file["purpose"]) == (len(data), "big.jsonl", "batch")
    assert file["expires_at"] == file["created_at"] + 30 * 86400  # as a file uploaded to /v1/files
    assert ok(api("GET", f"/v1/files/{file['id']}", key)) == file
    body, etag = content(api, key, file["id"])
    assert body == data and etag == f'"{hashlib.sha256(data).hexdigest()}"'
    assert s3_keys(svc, f"files/{created['id']}/") == []  # the parts are deleted
    # The same call again (a client that lost the answer) answers the same; other parts do not complete it again.
    assert ok(complete(api, key, created["id"], part_ids)) == done
    error(complete(api, key, created["id"], part_ids[:1]), 400, "already completed", code="upload_not_pending")
    error(add_part(api, key, created["id"], b"more"), 400, "already completed", code="upload_not_pending")
    error(cancel(api, key, created["id"]), 400, "already completed")


def test_parts_in_another_order_and_the_files_expires_after_and_md5(api, svc):
    settings(svc, file_batches_enabled=True)
    _, key = new_key(svc)
    data = lines_of(4)
    created = ok(create(api, key, len(data), expires_after={"anchor": "created_at", "seconds": 7200}))
    second = ok(add_part(api, key, created["id"], data[100:]))["id"]  # sent first, named second
    first = ok(add_part(api, key, created["id"], data[:100]))["id"]
    error(complete(api, key, created["id"], [first, second], md5="0" * 32), 400, "MD5", param="md5")
    assert s3_keys(svc, "files/file-") == []  # nothing of the refused file is kept
    done = ok(complete(api, key, created["id"], [first, second], md5=hashlib.md5(data).hexdigest().upper()))
    assert content(api, key, done["file"]["id"])[0] == data
    assert done["file"]["expires_at"] == done["file"]["created_at"] + 7200


def test_a_part_over_the_limit_is_413_naming_the_part_size_that_passes(api, svc):
    settings(svc, file_batches_enabled=True)
    _, key = new_key(svc)
    limit = svc.settings.max_upload_part_bytes
    assert limit == 4 * 1024 * 1024  # the deployed default
    created = ok(create(api, key, 2 * limit))
    # A part of exactly the limit passes, in an event API Gateway can hand to Lambda.
    ok(add_part(api, key, created["id"], b"a" * limit))
    assert len(json.dumps(api.events[-1]).encode()) < LAMBDA_PAYLOAD_BYTES
    too_big = add_part(api, key, created["id"], b"b" * (limit + 1))
    err = error(too_big, 413, f"The part is {limit + 1} bytes", f"part_size={limit}", "upload_file_chunked",
                code="part_too_large", param="data")
    assert str(limit) in err["message"] and too_big.headers["x-should-retry"] == "false"
    # A request whose declared length is past any part is refused before its body is read.
    declared = add_part(api, key, created["id"], b"c", **{"content-length": str(64 * 1024 * 1024)})
    error(declared, 413, f"part_size={limit}", code="part_too_large")
    assert len(s3_keys(svc, f"files/{created['id']}/parts/")) == 1  # only the part that passed


def test_parts_that_do_not_add_up_or_are_not_the_uploads_are_400(api, svc):
    settings(svc, file_batches_enabled=True)
    _, key = new_key(svc)
    created = ok(create(api, key, 10))
    part = ok(add_part(api, key, created["id"], b"1234"))["id"]
    error(complete(api, key, created["id"], [part]), 400, "add up to 4 bytes, not the 10 bytes",
          code="upload_size_mismatch", param="part_ids")
    error(complete(api, key, created["id"], [part, part]), 400, "more than once", param="part_ids")
    error(complete(api, key, created["id"], [part, "part_nope"]), 400, "no part 'part_nope'", param="part_ids")
    error(complete(api, key, created["id"], "nope"), 400, "part_ids must be", param="part_ids")
    error(api("POST", f"/v1/uploads/{created['id']}/complete", key, body="{", headers={
        "content-type": "application/json"}), 400, "not valid JSON")
    rest = ok(add_part(api, key, created["id"], b"567890"))["id"]
    assert ok(complete(api, key, created["id"], [part, rest]))["file"]["bytes"] == 10  # still pending: completes
    # Parts may hold twice the upload's bytes at most (room for parts sent again), then it takes no more.
    other = ok(create(api, key, 4))["id"]
    for _ in range(2):
        ok(add_part(api, key, other, b"abcd"))
    error(add_part(api, key, other, b"x"), 400, "no room for this part", code="upload_full")
    error(api("POST", f"/v1/uploads/{other}/parts", key, json_body={"data": "abcd"}), 400, "multipart/form-data")


def test_create_is_checked_and_counted_as_an_upload(api, svc):
    settings(svc, file_batches_enabled=True, max_uploads_per_hour=2, max_stored_file_bytes=100)
    _, key = new_key(svc)
    error(create(api, key, 10, purpose="fine-tune"), 400, "purpose must be 'batch'", param="purpose")
    error(create(api, key, -1), 400, "bytes must be", param="bytes")
    error(create(api, key, 10, filename=""), 400, "filename", param="filename")
    error(api("POST", "/v1/uploads", key, json_body={"bytes": 10, "filename": "a", "purpose": "batch"}), 400,
          "mime_type", param="mime_type")
    error(create(api, key, 10, expires_after={"anchor": "created_at", "seconds": 60}), 400,
          "expires_after[seconds]")
    error(create(api, key, svc.settings.max_file_bytes + 1), 413, "larger than the limit", param="bytes")
    error(create(api, key, 101), 413, "stored files past the limit", code="file_storage_exceeded")
    ok(upload(api, key, b"z" * 10))  # one upload to /v1/files, one upload in parts: the hour's two
    ok(create(api, key, 10))
    third = create(api, key, 10)
    error(third, 429, "uploaded 2 files this hour", code="too_many_uploads")
    assert 0 < int(third.headers["retry-after"]) <= 3600
    settings(svc, file_batches_enabled=False)
    error(create(api, key, 10), 400, "File batches are not enabled", code="file_batches_disabled")


def test_completing_checks_the_stored_bytes_again(api, svc):
    settings(svc, file_batches_enabled=True, max_stored_file_bytes=15)
    _, key = new_key(svc)
    created = ok(create(api, key, 10))
    part = ok(add_part(api, key, created["id"], b"0123456789"))["id"]
    ok(upload(api, key, b"z" * 10))  # stored meanwhile
    error(complete(api, key, created["id"], [part]), 413, "stored files past the limit", code="file_storage_exceeded")
    assert ok(cancel(api, key, created["id"]))["status"] == "cancelled"


def test_cancel_deletes_the_parts_and_refuses_more(api, svc):
    settings(svc, file_batches_enabled=True)
    _, key = new_key(svc)
    created = ok(create(api, key, 8))
    part = ok(add_part(api, key, created["id"], b"abcd"))["id"]
    cancelled = ok(cancel(api, key, created["id"]))
    assert cancelled["status"] == "cancelled" and cancelled["file"] is None and cancelled["id"] == created["id"]
    assert s3_keys(svc, f"files/{created['id']}/") == []
    error(add_part(api, key, created["id"], b"efgh"), 400, "already cancelled", code="upload_not_pending")
    error(complete(api, key, created["id"], [part]), 400, "already cancelled")
    assert ok(cancel(api, key, created["id"])) == cancelled  # cancelling again answers the same
    assert ok(api("GET", "/v1/files", key))["data"] == []
    # While file batches are off, a pending upload can still be cancelled, not continued.
    pending = ok(create(api, key, 4))["id"]
    settings(svc, file_batches_enabled=False)
    error(add_part(api, key, pending, b"abcd"), 400, "File batches are not enabled")
    error(complete(api, key, pending, []), 400, "File batches are not enabled")
    assert ok(cancel(api, key, pending))["status"] == "cancelled"


def test_another_accounts_upload_and_an_expired_one_read_as_not_found(api, svc):
    settings(svc, file_batches_enabled=True)
    _, key = new_key(svc)
    _, other = new_key(svc)
    theirs = ok(create(api, other, 4))["id"]
    part = ok(add_part(api, other, theirs, b"abcd"))["id"]
    for reply in (add_part(api, key, theirs, b"abcd"), complete(api, key, theirs, [part]), cancel(api, key, theirs),
                  add_part(api, key, "upload_nope", b"abcd"), cancel(api, key, "nope")):
        error(reply, 404, "No such Upload object", code="upload_not_found", param="upload_id")
    assert ok(complete(api, other, theirs, [part]))["status"] == "completed"  # untouched by the other account
    # A pending upload is gone an hour after it was created.
    mine = ok(create(api, key, 4))["id"]
    mine_part = ok(add_part(api, key, mine, b"abcd"))["id"]
    base = svc.clock
    svc.clock = lambda: base() + 3601
    for reply in (add_part(api, key, mine, b"abcd"), complete(api, key, mine, [mine_part]), cancel(api, key, mine)):
        error(reply, 404, "No such Upload object", code="upload_not_found")


def test_a_batch_from_a_file_sent_in_parts_runs(api, svc, sim_control):
    settings(svc, file_batches_enabled=True)
    _, key = new_key(svc)
    data = lines_of(6)
    created, part_ids = send_in_parts(api, key, data, [50, 400])
    file_id = ok(complete(api, key, created["id"], part_ids))["file"]["id"]
    batch_id = ok(create_from(api, key, file_id))["id"]
    assert finish(svc, batch_id)["status"] == "completed"
    batch = ok(api("GET", f"/v1/batches/{batch_id}", key))
    assert batch["request_counts"] == {"total": 6, "completed": 6, "failed": 0}
    outputs = [json.loads(x) for x in content(api, key, batch["output_file_id"])[0].splitlines()]
    assert sorted(o["custom_id"] for o in outputs) == [f"q-{i}" for i in range(6)]
