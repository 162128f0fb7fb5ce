"""A batch's results: read in submission order, a page at a time, or all of them as JSONL.

Whatever API shows them, results come from here: requests with an outcome have an item (small results
inline, large ones in S3), members of groups under way read as their group's state, and requests not
yet dispatched have nothing stored at all and read as queued (or as their stopped batch's fate).
"""

from __future__ import annotations

import json
from collections.abc import Iterator

from ..domain import RequestState, Stop, public_request_status, result_id, unstarted_error
from ..layout import INDEX_CHUNK, index_object
from ..records import BatchItem, Group, Request
from ..runtime import Services

EXPORT_PAGE = 1000  # results read and written per step of an export: memory stays flat


def index_entries(svc: Services, batch_id: str, start: int, end: int) -> list[list]:
    """Entries start..end-1 of a batch's request index: [custom_id, model, offset, length] each."""
    entries: list[list] = []
    for chunk in range(start // INDEX_CHUNK, (end - 1) // INDEX_CHUNK + 1):
        data = json.loads(svc.blobs.get(index_object(batch_id, chunk)) or b"[]")
        base = chunk * INDEX_CHUNK
        entries.extend(data[max(start - base, 0):end - base])
    return entries


def _result(svc: Services, batch: BatchItem, index: int, custom_id: str, stored: dict | None) -> dict:
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
        yield _result(svc, batch, index, entry[0], stored.get(index))


def export_stream(svc: Services, batch: BatchItem) -> Iterator[bytes]:
    """Every result as a JSONL line, in submission order, a thousand at a time (memory stays flat)."""
    for start in range(0, batch["total"], EXPORT_PAGE):
        chunk = []
        for r in iter_results(svc, batch, start, min(batch["total"], start + EXPORT_PAGE)):
            line = {"id": r["id"], "custom_id": r["custom_id"], "response": r["response"], "error": r["error"]}
            chunk.append(json.dumps(line, separators=(",", ":")).encode() + b"\n")
        yield b"".join(chunk)


def export_location(svc: Services, batch: BatchItem) -> str | None:
    """A short-lived URL of the export written when a large batch ended, or None to stream it instead."""
    return svc.blobs.presigned_get(batch["export_object"]) if batch.get("export_object") else None
