"""A batch's priority within its account: `high`, `normal` (the default) or `low`, given at create and
changeable while the batch runs. An extension beyond the OpenAI and Anthropic batch APIs.

Priority orders an account's own batches only: the scheduler first gives each account its share of a model's
slots as if every batch had the same priority, then hands the account's share to its highest-priority lanes
first (`scheduling.policy.by_priority`). One account's priority never takes slots from another account.
"""

from __future__ import annotations

from ...domain import FINAL_BATCH
from ...errors import BatchNotFound, Conflict, InvalidRequest
from ...records import Batch, BatchItem, Lane
from ...runtime import Services
from ...storage.dynamo import ConditionFailed

PRIORITIES = ("high", "normal", "low")
DEFAULT = "normal"


def parse(value: object, param: str = "priority") -> str:
    """A priority as given in a body (absent: the default); anything else is the caller's 400."""
    if value is None:
        return DEFAULT
    if isinstance(value, str) and value in PRIORITIES:
        return value
    raise InvalidRequest(f"{param} must be one of 'high', 'normal' or 'low', not {value!r}.", param=param)


def of(batch: BatchItem | dict) -> str:
    """A batch's priority as shown (batches created before priorities existed are `normal`)."""
    return str(batch.get("priority") or DEFAULT)


def change(svc: Services, batch: BatchItem, priority: str) -> BatchItem:
    """Set a running batch's priority: the batch and its lanes in one transaction, so the next claim sees
    the new order. 409 once the batch has ended. A lane that ran out between the read and the write (its
    last requests dispatched) makes the transaction fail; the batch is read again and the change retried."""
    priority = parse(priority)
    t = svc.table
    for _ in range(5):
        if batch["status"] in FINAL_BATCH:
            raise Conflict(f"Batch '{batch['id']}' has ended ({batch['status']}); its priority can no longer "
                           "change.", code="batch_ended")
        # A stopped batch has no lanes left; a paused one none until its resume, a file batch awaiting
        # validation none yet: they are made from the batch item, priority included, fenced on the priority
        # they read (`Batch.validated`, `Batch.resume`), as this write is on the lanes being as read.
        models = [] if batch.get("stop") or batch.get("paused_at") or batch.get("awaiting_validation") else [
            m for m, lane in batch.get("lanes", {}).items() if int(lane["next"]) < int(lane["total"])]
        ops = [Batch.set_priority(t, batch["id"], priority, seen=batch)]
        ops += [Lane.set_priority(t, model_id, batch, priority) for model_id in models]
        try:
            t.transact(ops)
        except ConditionFailed:
            current = Batch.get(t, batch["id"])
            if current is None or current.get("deleting"):
                raise BatchNotFound(batch["id"]) from None
            batch = current
            continue
        return {**batch, "priority": priority}
    raise Conflict("The batch changed while its priority was being set; try again.", code="batch_busy")
