"""The OpenAI-shaped batch API: create (inline), check, list, results, export, cancel, delete."""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Iterator

from ..domain import (
    FINAL_BATCH,
    BatchStatus,
    RequestState,
    Stop,
    new_batch_id,
    parse_result_id,
    public_request_status,
    result_id,
    unstarted_error,
)
from ..errors import ApiError
from ..layout import (
    INDEX_CHUNK,
    account_key,
    batch_key,
    batch_prefix,
    idempotency_key,
    index_object,
    lane_key,
    lane_object,
    owner_sort,
    request_sk,
    requests_object,
)
from ..runtime import Services
from ..storage.dynamo import ConditionFailed
from .accounts import Principal, quota_used_up
from .validation import ValidatedBatch, validate_inline_batch

ACTIVE = "ACTIVE"


# --- Create ------------------------------------------------------------------------------------------

def _check_idempotency_key(key: str | None) -> None:
    if key is None:
        return
    if not 1 <= len(key) <= 255 or not all(0x20 <= ord(c) <= 0x7E for c in key):
        raise ApiError(400, "The Idempotency-Key header must be 1-255 printable ASCII characters.",
                       param="Idempotency-Key")


def _replay(svc: Services, principal: Principal, key: str, body_hash: str) -> dict | None:
    """The batch an earlier call with this Idempotency-Key created, or None if the key is new."""
    record = svc.table.get(*idempotency_key(principal.account_id, key))
    if record is None or (record.get("ttl") and record["ttl"] <= svc.now()):
        return None
    if record["body_hash"] != body_hash:
        raise ApiError(409, "This Idempotency-Key was already used for a different request.",
                       code="idempotency_key_reused")
    batch = svc.table.get(*batch_key(record["batch_id"]))
    if record.get("deleted") or batch is None:
        raise ApiError(410, "The batch this Idempotency-Key created has been deleted.", code="batch_deleted")
    return batch


def create_batch(svc: Services, principal: Principal, raw: bytes, idem_key: str | None) -> tuple[dict, bool]:
    """Create an inline batch. Returns (batch object, created) — created is False for a replay."""
    limits = svc.settings
    if len(raw) > limits.max_body_bytes:
        raise ApiError(413, f"The request body is larger than the limit of {limits.max_body_bytes} bytes.")
    _check_idempotency_key(idem_key)
    try:
        payload = json.loads(raw) if raw.strip() else None
        canonical = json.dumps(payload, sort_keys=True, separators=(",", ":"))
    except (ValueError, UnicodeDecodeError):
        raise ApiError(400, "The body is not valid JSON.") from None
    except RecursionError:
        raise ApiError(400, "The body is nested too deeply.") from None
    body_hash = hashlib.sha256(canonical.encode()).hexdigest()
    if idem_key:
        existing = _replay(svc, principal, idem_key, body_hash)
        if existing:
            return batch_object(existing), False
    account = principal.account
    if not account.get("batch_access"):
        raise ApiError(403, "Your account may not create batches.", code="batch_access_denied")
    if quota_used_up(svc, account):
        raise ApiError(429, "Your daily quota is used up; it renews at 00:00 UTC.", code="quota_exceeded")
    batch = validate_inline_batch(svc, account, payload)
    try:
        return batch_object(_store_new_batch(svc, principal, batch, idem_key, body_hash)), True
    except ConditionFailed:
        if idem_key:  # a concurrent call with the same key won the race
            existing = _replay(svc, principal, idem_key, body_hash)
            if existing:
                return batch_object(existing), False
        current = svc.table.get(*account_key(principal.account_id)) or {}
        if current.get("unfinished_batches", 0) >= limits.max_unfinished_batches:
            raise ApiError(429, f"You already have {limits.max_unfinished_batches} unfinished batches, the most "
                                "allowed. Wait for one to finish.", code="too_many_batches") from None
        raise ApiError(429, f"This batch would take your unfinished batch requests past the limit of "
                            f"{limits.max_unfinished_requests}.", code="too_many_requests") from None


def _store_new_batch(svc: Services, principal: Principal, batch: ValidatedBatch, idem_key: str | None,
                     body_hash: str) -> dict:
    s = svc.settings
    now = svc.now()
    batch_id = new_batch_id()
    if len(batch.requests) > s.max_unfinished_requests:
        raise ConditionFailed("batch larger than the unfinished-request limit")  # before anything is stored
    # Bodies go to S3 as one object (one PUT, not one write per request); request state is created
    # only when requests are dispatched, so creating 50,000 requests stays far inside 30 s.
    lines, index, offset = [], [], 0
    for req in batch.requests:
        line = json.dumps({"custom_id": req.custom_id, "body": req.body}, separators=(",", ":")).encode() + b"\n"
        lines.append(line)
        index.append([req.custom_id, req.model_id, offset, len(line)])
        offset += len(line)
    svc.blobs.put(requests_object(batch_id), b"".join(lines), "application/x-ndjson")
    for chunk in range(0, len(index), INDEX_CHUNK):
        svc.blobs.put(index_object(batch_id, chunk // INDEX_CHUNK),
                      json.dumps(index[chunk:chunk + INDEX_CHUNK], separators=(",", ":")).encode())
    lanes: dict[str, list[int]] = {}
    for position, req in enumerate(batch.requests):
        lanes.setdefault(req.model_id, []).append(position)
    if len(lanes) > 1:  # a single-model lane is simply 0..n-1
        for model_id, positions in lanes.items():
            svc.blobs.put(lane_object(batch_id, model_id), json.dumps(positions).encode())
    total = len(batch.requests)
    item = {
        "pk": batch_key(batch_id)[0], "sk": batch_key(batch_id)[1],
        "id": batch_id, "account_id": principal.account_id, "key_hash": principal.key_hash,
        "endpoint": batch.endpoint, "status": BatchStatus.VALIDATING.value, "created_at": now,
        "expires_at": now + s.batch_completion_window_seconds, "metadata": batch.metadata, "total": total,
        "lanes": {m: {"next": 0, "total": len(p)} for m, p in lanes.items()},
        "completed": 0, "failed": 0, "open": 0, "in_flight": 0, "input_tokens": 0, "output_tokens": 0,
        "cost_usd": 0.0, "cost_unknown_attempts": 0,
        "owner_pk": f"ACCOUNT#{principal.account_id}",
        # Wall-clock microseconds, not the (injectable) service clock: only the order matters here.
        "owner_sk": owner_sort(time.time_ns() // 1000, batch_id),
        "active_pk": ACTIVE, "active_sk": batch_id, "idempotency_key": idem_key,
    }
    ops = [
        svc.table.op_put(item, condition="attribute_not_exists(pk)"),
        svc.table.op_update(
            *account_key(principal.account_id),
            "ADD unfinished_batches :one, unfinished_requests :n",
            vals={":one": 1, ":n": total, ":maxb": s.max_unfinished_batches,
                  ":maxr": s.max_unfinished_requests - total},
            condition="attribute_exists(pk) AND (attribute_not_exists(unfinished_batches) OR "
                      "unfinished_batches < :maxb) AND (attribute_not_exists(unfinished_requests) OR "
                      "unfinished_requests <= :maxr)",
        ),
    ]
    for model_id in lanes:
        pk, sk = lane_key(model_id, now, batch_id)
        ops.append(svc.table.op_put({"pk": pk, "sk": sk, "batch_id": batch_id, "account_id": principal.account_id,
                                     "model": model_id}))
    if idem_key:
        pk, sk = idempotency_key(principal.account_id, idem_key)
        # A record past its TTL may linger until DynamoDB deletes it; it no longer holds the key.
        ops.append(svc.table.op_put({"pk": pk, "sk": sk, "batch_id": batch_id, "body_hash": body_hash},
                                    condition="attribute_not_exists(pk) OR #ttl <= :now", vals={":now": now}))
    try:
        svc.table.transact(ops)
    except ConditionFailed:
        svc.blobs.delete_prefix(batch_prefix(batch_id))
        raise
    return item


# --- Read --------------------------------------------------------------------------------------------

def batch_object(item: dict) -> dict:
    """The batch as the API shows it (OpenAI's batch object plus the service's own fields)."""
    def at(name: str) -> int | None:
        return item.get(name)

    return {
        "id": item["id"], "object": "batch", "endpoint": item["endpoint"], "errors": None,
        "input_file_id": item.get("input_file_id"), "completion_window": "24h", "status": item["status"],
        "output_file_id": item.get("output_file_id"), "error_file_id": item.get("error_file_id"),
        "created_at": item["created_at"], "in_progress_at": at("in_progress_at"), "expires_at": at("expires_at"),
        "finalizing_at": at("finalizing_at"), "completed_at": at("completed_at"), "failed_at": at("failed_at"),
        "expired_at": at("expired_at"), "cancelling_at": at("cancelling_at"), "cancelled_at": at("cancelled_at"),
        "request_counts": {"total": item["total"], "completed": item.get("completed", 0),
                           "failed": item.get("failed", 0)},
        "metadata": item.get("metadata"),
        "usage": {"input_tokens": item.get("input_tokens", 0), "output_tokens": item.get("output_tokens", 0),
                  "total_tokens": item.get("input_tokens", 0) + item.get("output_tokens", 0)},
        "cost_usd": round(float(item.get("cost_usd", 0)), 10),
        "cost_unknown_attempts": item.get("cost_unknown_attempts", 0),
        "results_expires_at": at("results_expires_at"),
        "error": item.get("error"),
    }


def owned_batch(svc: Services, principal: Principal, batch_id: str) -> dict:
    item = svc.table.get(*batch_key(batch_id)) if batch_id.startswith("batch_") else None
    if item is None or item.get("account_id") != principal.account_id or item.get("deleting"):
        raise ApiError(404, f"No batch found with id '{batch_id}'.", code="batch_not_found", param="batch_id")
    return item


def list_batches(svc: Services, principal: Principal, limit: int, after: str | None) -> dict:
    if not 1 <= limit <= 100:
        raise ApiError(400, "limit must be between 1 and 100.", param="limit")
    start = None
    if after:
        anchor = svc.table.get(*batch_key(after)) if after.startswith("batch_") else None
        if anchor is None or anchor.get("account_id") != principal.account_id:
            raise ApiError(400, f"after: no batch found with id '{after}'.", param="after")
        start = {"pk": anchor["pk"], "sk": anchor["sk"], "owner_pk": anchor["owner_pk"],
                 "owner_sk": anchor["owner_sk"]}
    items: list[dict] = []
    while len(items) <= limit:
        page, start = svc.table.query("owner_pk = :o AND begins_with(owner_sk, :b)",
                                      {":o": f"ACCOUNT#{principal.account_id}", ":b": "BATCH#"},
                                      index="by_owner", forward=False, limit=limit + 1 - len(items), start=start)
        items.extend(i for i in page if not i.get("deleting"))
        if not start:
            break
    data = [batch_object(i) for i in items[:limit]]
    return {"object": "list", "data": data, "first_id": data[0]["id"] if data else None,
            "last_id": data[-1]["id"] if data else None, "has_more": len(items) > limit}


def _index_entries(svc: Services, batch_id: str, start: int, end: int) -> list[list]:
    entries: list[list] = []
    for chunk in range(start // INDEX_CHUNK, (end - 1) // INDEX_CHUNK + 1):
        data = json.loads(svc.blobs.get(index_object(batch_id, chunk)) or b"[]")
        base = chunk * INDEX_CHUNK
        entries.extend(data[max(start - base, 0):end - base])
    return entries


def _result(svc: Services, batch: dict, index: int, custom_id: str, stored: dict | None) -> dict:
    stop = Stop(batch["stop"]) if batch.get("stop") else None
    state = RequestState(stored["state"]) if stored else None
    response = None
    error = stored.get("error") if stored else unstarted_error(stop)
    if state is RequestState.COMPLETED:
        response = stored.get("response")
        if response is None and stored.get("response_object"):
            response = json.loads(svc.blobs.get(stored["response_object"]) or b"null")
        error = None
    return {"id": result_id(index), "custom_id": custom_id, "status": public_request_status(state, stop),
            "response": response, "error": error}


def iter_results(svc: Services, batch: dict, start: int, end: int) -> Iterator[dict]:
    """Results start..end-1 in submission order; unstored requests read as never dispatched."""
    if start >= end:
        return
    entries = _index_entries(svc, batch["id"], start, end)
    stored = {
        s["index"]: s for s in svc.table.query_all(
            "pk = :pk AND sk BETWEEN :a AND :b",
            {":pk": batch["pk"], ":a": request_sk(start), ":b": request_sk(end - 1)}, consistent=True)
    }
    if batch.get("in_flight", 0) > 0:  # members of groups under way have no item yet: they read as running
        for group in svc.table.query_all("pk = :pk AND begins_with(sk, :g)", {":pk": batch["pk"], ":g": "GRP#"},
                                         consistent=True):
            for position in group["positions"]:
                if start <= position[0] < end and position[0] not in stored:
                    stored[position[0]] = {"state": group["state"]}
    for offset, entry in enumerate(entries):
        index = start + offset
        yield _result(svc, batch, index, entry[0], stored.get(index))


def results_page(svc: Services, principal: Principal, batch_id: str, limit: int, after: str | None) -> dict:
    if not 1 <= limit <= 1000:
        raise ApiError(400, "limit must be between 1 and 1000.", param="limit")
    batch = owned_batch(svc, principal, batch_id)
    start = 0
    if after is not None:
        index = parse_result_id(after)
        if index is None:
            raise ApiError(400, f"after must be a result ID such as 'batch_req_42', not '{after}'.", param="after")
        start = index + 1
    end = min(batch["total"], start + limit)
    data = list(iter_results(svc, batch, start, end))
    return {"object": "list", "data": data, "has_more": end < batch["total"],
            "first_id": data[0]["id"] if data else None, "last_id": data[-1]["id"] if data else None}


def export_stream(svc: Services, batch: dict) -> Iterator[bytes]:
    """Every result as a JSONL line, in submission order, a thousand at a time (memory stays flat)."""
    for start in range(0, batch["total"], 1000):
        chunk = []
        for r in iter_results(svc, batch, start, min(batch["total"], start + 1000)):
            line = {"id": r["id"], "custom_id": r["custom_id"], "response": r["response"], "error": r["error"]}
            chunk.append(json.dumps(line, separators=(",", ":")).encode() + b"\n")
        yield b"".join(chunk)


def export_lines(svc: Services, principal: Principal, batch_id: str) -> Iterator[bytes]:
    """output.jsonl: every result, one line each, in submission order; streamed a page at a time."""
    batch = owned_batch(svc, principal, batch_id)
    if batch["status"] not in FINAL_BATCH:
        raise ApiError(409, "The batch has not finished; output.jsonl is available once it reaches a final status.",
                       code="batch_not_finished")
    return export_stream(svc, batch)


def export_location(svc: Services, principal: Principal, batch_id: str) -> str | None:
    """A short-lived URL of the export written when a large batch ended, or None to stream it instead."""
    batch = owned_batch(svc, principal, batch_id)
    if batch["status"] not in FINAL_BATCH:
        raise ApiError(409, "The batch has not finished; output.jsonl is available once it reaches a final status.",
                       code="batch_not_finished")
    return svc.blobs.presigned_get(batch["export_object"]) if batch.get("export_object") else None


# --- Cancel and delete -------------------------------------------------------------------------------

def cancel_batch(svc: Services, principal: Principal, batch_id: str) -> dict:
    from .sweep import settle_batch, stop_batch

    batch = owned_batch(svc, principal, batch_id)
    if batch["status"] in FINAL_BATCH or batch["status"] == BatchStatus.FINALIZING.value or batch.get("stop"):
        return batch_object(batch)
    stop_batch(svc, batch, Stop.CANCEL)
    settle_batch(svc, batch_id)
    return batch_object(svc.table.get(*batch_key(batch_id)))


def delete_batch(svc: Services, principal: Principal, batch_id: str) -> dict:
    from .sweep import purge_batch

    batch = owned_batch(svc, principal, batch_id)
    if batch.get("in_flight", 0) > 0:
        raise ApiError(409, "A request of this batch is still running. Cancel the batch, wait for its running "
                            "requests to finish, then delete it.", code="batch_running")
    try:
        purge_batch(svc, batch)
    except ConditionFailed:
        raise ApiError(409, "A request of this batch is still running. Cancel the batch, wait for its running "
                            "requests to finish, then delete it.", code="batch_running") from None
    return {"id": batch_id, "object": "batch.deleted", "deleted": True}
