"""Pause and resume: a paused batch starts no request; those already running finish.

Pausing is a flag on the batch (`paused_at`), not a status: a paused batch stays validating or in progress,
its completion window keeps running, and the sweeper expires it when the window closes. The pause removes
the batch's lanes in the same transaction as it sets the flag (as a stop does), so dispatchers stop serving
it at once; every claim and every start is fenced on the flag (`records.Batch`). What was dispatched but had
not started goes back to waiting, holding no slot (`run_request._precheck`), and the batch's waiting
requests are put off until the window's end (`ledger.defer_while_paused`): the slots it held go to the
other batches as soon as its running requests end.

A resume removes the flag, puts the lanes that still have requests to dispatch back in the model's ring
(at their old place: a lane sorts by its batch's creation) and makes the requests the pause put off due at
once. Each step is fenced, so a pause and a resume racing (or racing a worker putting a request back) leave
no request put off while its batch runs: whichever write comes second sees the other's.
"""

from __future__ import annotations

from collections.abc import Callable

from ..domain import FINAL_BATCH, PAUSABLE_BATCH
from ..errors import Conflict, NotFound
from ..ledger import defer_while_paused
from ..records import Batch, BatchItem, Lane, Request
from ..runtime import Services
from ..storage.dynamo import ConditionFailed
from . import analytics

ATTEMPTS = 3  # a pause or resume that keeps losing to other changes of the batch (claims, counters) gives up


def paused_at(batch: BatchItem) -> int | None:
    """When the batch was paused, or None when it is not (a batch stopped or ended is not paused)."""
    if batch.get("stop") or batch["status"] in FINAL_BATCH or batch.get("deleting"):
        return None
    return batch.get("paused_at")


def _refusal(batch: BatchItem, what: str) -> Conflict:
    status = batch["status"]
    if status in FINAL_BATCH:
        return Conflict(f"Batch '{batch['id']}' has ended ({status}): it cannot be {what}.", code="batch_ended")
    # A batch that is cancelling or finalizing, or whose requests stopped starting (it expired or failed and
    # waits for its running ones to end).
    state = "stopping" if status in {s.value for s in PAUSABLE_BATCH} else status
    return Conflict(f"Batch '{batch['id']}' is {state}: only a validating or in-progress batch can be {what}.",
                    code="batch_not_running")


def _runs(batch: BatchItem) -> bool:
    return batch["status"] in {s.value for s in PAUSABLE_BATCH} and not batch.get("stop")


def _fresh(svc: Services, batch_id: str) -> BatchItem:
    batch = Batch.get(svc.table, batch_id)
    if batch is None or batch.get("deleting"):
        raise NotFound(f"No batch found with id '{batch_id}'.", code="batch_not_found")
    return batch


def _change(svc: Services, batch: BatchItem, what: str, writes: Callable[[BatchItem], list | None]
            ) -> tuple[BatchItem, bool]:
    """Pause or resume: `writes` gives the fenced writes for the batch as read (None: it is so already).
    A write that loses to another change of the batch is decided again from a fresh read, at most ATTEMPTS
    times. Returns (the batch as it is now, whether this call changed it); Conflict for a batch that has
    ended or is stopping."""
    for _ in range(ATTEMPTS):
        if not _runs(batch):
            raise _refusal(batch, what)
        ops = writes(batch)
        if ops is None:
            return batch, False
        try:
            svc.table.transact(ops)
            return _fresh(svc, batch["id"]), True
        except ConditionFailed:
            batch = _fresh(svc, batch["id"])
    raise Conflict(f"Batch '{batch['id']}' kept changing; try again.", code="batch_busy")


def pause(svc: Services, batch: BatchItem) -> BatchItem:
    """Pause a validating or in-progress batch; a paused one is returned unchanged. Conflict (409) for a
    batch that has ended or is stopping (cancelling, finalizing). Returns the batch as it is now."""
    t = svc.table

    def pausing(current: BatchItem) -> list | None:
        if current.get("paused_at"):
            return None
        return [Batch.pause(t, current["id"], svc.now())] + [Lane.remove(t, m, current) for m in current["lanes"]]

    batch, changed = _change(svc, batch, "paused", pausing)
    if not changed:
        return batch
    for req in Request.waiting_of(t, batch):
        if req.get("due_at", 0) < batch["expires_at"] and not defer_while_paused(svc, req, batch):
            current = Batch.get(t, batch["id"])
            if not current or not current.get("paused_at") or current.get("stop"):
                break  # resumed or stopped meanwhile: what is left stays due as it was
    return _fresh(svc, batch["id"])


def resume(svc: Services, batch: BatchItem) -> BatchItem:
    """Resume a paused batch: its requests start again at the dispatcher's next pass; a batch that is not
    paused is returned unchanged. Conflict (409) for a batch that has ended or is stopping."""
    t = svc.table

    seen: dict = {}

    def resuming(current: BatchItem) -> list | None:
        if not current.get("paused_at"):
            return None
        seen.update(current)  # the pause as resumed, for its analytics
        # A file batch still being checked has no lanes yet: its validation creates them.
        lanes = [] if current.get("awaiting_validation") else [
            model_id for model_id, lane in current["lanes"].items() if int(lane["next"]) < int(lane["total"])]
        return [Batch.resume(t, current["id"], int(current["paused_at"]))] + [
            Lane.create(t, m, current) for m in lanes]

    batch, changed = _change(svc, batch, "resumed", resuming)
    if not changed:
        return batch
    analytics.after_resume(svc, seen)
    bring_forward(svc, batch)
    return batch


def bring_forward(svc: Services, batch: BatchItem) -> int:
    """Make the requests a pause put off (due at the window's end or later) due now. Returns how many."""
    now = svc.now()
    moved = 0
    for req in Request.waiting_of(svc.table, batch):
        if int(req.get("due_at", 0)) < int(batch["expires_at"]):
            continue  # waiting for its own reason (a retry's backoff): left as it was
        try:
            svc.table.transact([Request.defer(svc.table, req, now)])
            moved += 1
        except ConditionFailed:
            pass  # claimed or closed meanwhile
    return moved


def after_wait(svc: Services, batch_id: str) -> None:
    """After a worker put a request of a paused batch back to wait: if the batch was resumed meanwhile (its
    resume may have looked for waiting requests before this one waited), make it due now."""
    batch = Batch.get(svc.table, batch_id)
    if batch and not batch.get("paused_at") and not batch.get("stop") and batch["status"] not in FINAL_BATCH:
        bring_forward(svc, batch)

