"""An ended batch's never-dispatched requests, filed as request items so that a retry can name them.

A request its lanes never dispatched (its batch was cancelled or expired first) has no request item: it is a
position beyond its lane's cursor, its fate the batch's stop (or `parked`). A retry by `custom_ids` walks
request items, so before one can name such a request, the batch's never-dispatched requests are filed: each
gets the item a group member's outcome would have written (unstarted, with its stop's error), and its lane's
cursor moves past it in the same transaction, so that no later retry brings the lane back over it. No
counter moves: these requests were counted `unstarted` when the batch ended, and still are.

A page per transaction, fenced on the lane's cursor and on the batch still ended and not being retried or
deleted: safe to repeat, and two calls file each request once. A batch holds up to 50,000 requests; a call
that runs out of time answers 409 `batch_busy`, and the next call goes on where it stopped.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable

from ...domain import RequestState, Stop, new_token, unstarted_error
from ...errors import BatchNotFound, Conflict
from ...layout import INDEX_CHUNK, IndexEntry, index_object, lane_in_order, lane_object, request_key
from ...records import Batch, BatchItem, Request, RequestItem
from ...runtime import Services
from ...spending import worst_usd
from ...storage.dynamo import ConditionFailed

FILE_PAGE = 40  # requests filed per transaction, with their lane's cursor
CALL_SECONDS = 5.0  # what a retry call spends filing before it answers 409 (the next call goes on)


def file_if_named(svc: Services, batch: BatchItem, stop: Stop, named: Callable[[str], bool], deadline: float
                  ) -> BatchItem:
    """File every never-dispatched request of the ended batch under `stop` (the one they ended under), if
    `named` takes the custom id of one of them; else leave them as they are. Returns the batch as it is now;
    Conflict (409 `batch_busy`) when `deadline` came first."""
    entries = _Entries(svc, batch)
    if not any(named(entries.entry(index).custom_id) for model_id, state in batch["lanes"].items()
               for index in entries.lane(model_id, int(state["next"]), int(state["total"]))):
        return batch
    t = svc.table
    paged = False  # each call files a page at least, so that calls again make progress
    while True:
        lane = next(((m, s) for m, s in sorted(batch["lanes"].items()) if int(s["next"]) < int(s["total"])), None)
        if lane is None:
            return batch
        if paged and time.monotonic() >= deadline:
            raise Conflict(f"Batch '{batch['id']}' is large: its never-started requests are still being prepared "
                           "to be retried by custom id; call again.", code="batch_busy")
        model_id, state = lane
        start = int(state["next"])
        end = min(int(state["total"]), start + FILE_PAGE)
        items = [_item(svc, batch, model_id, index, entries.entry(index), stop)
                 for index in entries.lane(model_id, start, end)]
        try:
            t.transact([Batch.file_never_dispatched(t, batch, model_id, start, end)]
                       + [Request.create(t, item) for item in items])
        except ConditionFailed:
            pass  # another call filed this page first, or the batch changed: read it again
        paged = True
        current = Batch.get(t, batch["id"])
        if current is None or current.get("deleting"):
            raise BatchNotFound(batch["id"])
        if current.get("status") != batch["status"] or current.get("retrying"):
            raise Conflict(f"Batch '{batch['id']}' is being retried by another call.", code="batch_not_ended")
        batch = current


def _item(svc: Services, batch: BatchItem, model_id: str, index: int, entry: IndexEntry, stop: Stop) -> RequestItem:
    now = svc.now()
    pk, sk = request_key(batch["id"], index)
    # Kept as long as the batch's first request items (the retention a retry can never outlast).
    keep_until = int(batch.get("keep_until") or int(batch["expires_at"]) + svc.settings.batch_retention_seconds)
    item: RequestItem = {
        "pk": pk, "sk": sk, "batch_id": batch["id"], "index": index, "custom_id": entry.custom_id, "model": model_id,
        "account_id": batch["account_id"], "offset": entry.offset, "length": entry.length,
        "state": RequestState.UNSTARTED.value, "token": new_token(), "attempt": 0, "created_at": now,
        "updated_at": now, "ttl": keep_until + 86400}
    if (error := unstarted_error(stop)) is not None:
        item["error"] = error
    if batch.get("max_cost_usd") is not None and entry.output_bound is not None:
        # Committed when it runs.
        item["worst_usd"] = worst_usd(svc.catalog.get(model_id), entry.length, entry.output_bound)
    return item


class _Entries:
    """The batch's request index and lanes as stored at intake (S3), read a chunk at a time."""

    def __init__(self, svc: Services, batch: BatchItem) -> None:
        self.svc, self.batch = svc, batch
        self.chunks: dict[int, list] = {}
        self.lanes: dict[str, list[int]] = {}

    def lane(self, model_id: str, start: int, end: int) -> list[int]:
        """The batch indexes of the lane's positions start..end-1 (a batch's one lane is simply 0..n-1)."""
        if lane_in_order(self.batch):
            return list(range(start, end))
        if model_id not in self.lanes:
            self.lanes[model_id] = json.loads(self.svc.blobs.get(lane_object(self.batch["id"], model_id)) or b"[]")
        return self.lanes[model_id][start:end]

    def entry(self, index: int) -> IndexEntry:
        chunk = index // INDEX_CHUNK
        if chunk not in self.chunks:
            self.chunks[chunk] = json.loads(self.svc.blobs.get(index_object(self.batch["id"], chunk)) or b"[]")
        return IndexEntry.read(self.chunks[chunk][index - chunk * INDEX_CHUNK])
