"""A batch's results: read in submission order, a page at a time, or all of them as JSONL.

Whatever API shows them, results come from here; each line as the batch's protocol shows it. Requests
with an outcome have an item (small results inline, large ones in S3), members of groups under way read
as their group's state, and requests not yet dispatched have nothing stored at all and read as queued
(or as their stopped batch's fate).
"""

from __future__ import annotations

import json
from collections.abc import Iterator

from ... import protocols
from ...domain import (
    RequestState,
    Stop,
    parse_result_id,
    public_request_status,
    result_id,
    unstarted_error,
    unstarted_stop,
)
from ...errors import InvalidRequest, quoted
from ...jsontext import parse_object, to_json
from ...layout import INDEX_CHUNK, IndexEntry, index_object
from ...records import BatchItem, Group, Request, RequestItem
from ...runtime import Services

EXPORT_PAGE = 1000  # results read and written per step of an export: memory stays flat


def index_entries(svc: Services, batch_id: str, start: int, end: int) -> list[IndexEntry]:
    """Entries start..end-1 of a batch's request index."""
    entries: list[IndexEntry] = []
    for chunk in range(start // INDEX_CHUNK, (end - 1) // INDEX_CHUNK + 1):
        data = json.loads(svc.blobs.get(index_object(batch_id, chunk)) or b"[]")
        base = chunk * INDEX_CHUNK
        entries.extend(map(IndexEntry.read, data[max(start - base, 0):end - base]))
    return entries


def _result(svc: Services, batch: BatchItem, index: int, entry: IndexEntry, stored: RequestItem | None) -> dict:
    stop = Stop(batch["stop"]) if batch.get("stop") else None
    if stored is None and batch.get("parked"):  # never dispatched, left as it ended by a retry of its batch
        stop = Stop(batch["parked"])
    custom_id = entry.custom_id
    if stored is None and entry.model_id is None:  # rejected at intake: its error is in its index entry
        stored = {"state": RequestState.FAILED.value, "error": entry.error}
    state = RequestState(stored["state"]) if stored else None
    if state is RequestState.UNSTARTED and batch.get("retry_count"):
        stop = unstarted_stop(stored.get("error"))  # a retry may have left it from an earlier ending
    response = None
    error = shown_error(stored.get("error")) if stored else unstarted_error(stop)
    if state is RequestState.COMPLETED:
        response = stored_response(svc, stored)
        error = None
    return {"id": result_id(index), "custom_id": custom_id, "status": public_request_status(state, stop),
            "response": response, "error": error}


result_of = _result  # one result as every reader shows it (the finished-order feed reads them too)


def shown_error(error: dict | None) -> dict | None:
    """A stored error as results show it: the service's `code` and `message`, and for an error answer beside
    them the backend's `status`, `request_id` and `body` (its JSON as sent: a `Text`; null when it sent no
    JSON object, or a body too large to keep, whose size `body_omitted_bytes` says)."""
    if not error or "body_text" not in error:
        return error
    shown = {"code": error.get("code"), "message": error.get("message"), "status": error.get("status"),
             "request_id": error.get("request_id"),
             "body": parse_object(error["body_text"]) if error["body_text"] is not None else None}
    return {**shown, **{k: v for k, v in error.items() if k not in shown and k != "body_text"}}


def stored_response(svc: Services, stored: RequestItem) -> dict | None:
    """A completed request's response, {status_code, request_id, body}, its body the text the backend sent
    (a `Text`): in the item (`body_text`), or in S3 (`response_object`) when large."""
    response = stored.get("response")
    if stored.get("response_object"):
        data = (svc.blobs.get(stored["response_object"]) or b"null").decode()
        if response is None:  # kept before bodies were kept as sent: the whole response, as JSON
            return json.loads(data)
        return {"status_code": response["status_code"], "request_id": response["request_id"],
                "body": parse_object(data)}
    if response is not None and "body_text" in response:
        return {"status_code": response["status_code"], "request_id": response["request_id"],
                "body": parse_object(response["body_text"])}
    return response  # kept before bodies were kept as sent: a map


def start_after(after: str | None) -> int:
    """Where a page of results in submission order starts: at the first, or just after the result ID `after`
    (the last ID of the page before); 400 when `after` is not a result ID."""
    if after is None:
        return 0
    index = parse_result_id(after)
    if index is None:
        raise InvalidRequest(f"after must be a result ID such as 'batch_req_42', not {quoted(after)}.", param="after")
    return index + 1


def iter_results(svc: Services, batch: BatchItem, start: int, end: int) -> Iterator[dict]:
    """Results start..end-1 in submission order; unstored requests read as never dispatched."""
    if start >= end:
        return
    entries = index_entries(svc, batch["id"], start, end)
    stored = {s["index"]: s for s in Request.between(svc.table, batch, start, end - 1)}
    if batch.get("in_flight", 0) > 0:  # members of groups under way have no item yet: they read as running
        for group in Group.of_batch(svc.table, batch):
            for position in group["positions"]:
                if start <= position[0] < end and position[0] not in stored:
                    stored[position[0]] = {"state": group["state"]}
    for offset, entry in enumerate(entries):
        index = start + offset
        yield _result(svc, batch, index, entry, stored.get(index))


def export_stream(svc: Services, batch: BatchItem) -> Iterator[bytes]:
    """Every result as a JSONL line (LF-terminated, none blank: the SDKs' line decoders need both), in
    submission order, a thousand at a time (memory stays flat)."""
    shape = protocols.of_batch(batch).export_line
    for start in range(0, batch["total"], EXPORT_PAGE):
        chunk = []
        for r in iter_results(svc, batch, start, min(batch["total"], start + EXPORT_PAGE)):
            chunk.append(to_json(shape(r)).encode() + b"\n")
        yield b"".join(chunk)


def export_location(svc: Services, batch: BatchItem) -> str | None:
    """A short-lived URL of the export written when a large batch ended, or None to stream it instead."""
    return svc.blobs.presigned_get(batch["export_object"]) if batch.get("export_object") else None
