"""A batch's spending cap, where it stops the batch: when nothing of it runs and not one of the requests it
could start next fits within the cap beside what it has spent, it stops as a cancel does (what runs
finishes, the rest ends unstarted) with `error.code` `max_cost_reached`.

Claims never start a request whose worst case could pass the cap (ledger, `spending`); while attempts run,
the next request waits for them to settle below their worst case rather than stopping the batch, so the
cap is spent as far as the requests' worst cases allow. The stop is made where it is found: by the settle
that leaves nothing of the batch running, or the claim that finds its next request does not fit while
nothing runs (`stop_if_reached`, then the batch settles at once, as a cancel's does); the sweeper's walk of
unfinished batches makes it too, should a worker die between. The reads happen only for a capped batch with
nothing in flight.
"""

from __future__ import annotations

import math
import time

from ...domain import FINAL_BATCH, RequestState, Stop
from ...records import Batch, BatchItem, Request
from ...runtime import Services
from ...scheduling.lanes import Lanes
from ...spending import cap_reached_error, fits
from ..lifecycle import CANCEL_SETTLE_SECONDS, settle_batch, stop_batch, undispatched_count


def reached(svc: Services, batch: BatchItem) -> bool:
    """Whether the capped batch can start nothing more: nothing in flight, something left to run, and the
    cheapest next request (each lane's next one, each waiting retry) would pass the cap."""
    if batch.get("max_cost_usd") is None or batch.get("stop") or batch.get("deleting"):
        return False
    if batch.get("retrying") or batch.get("awaiting_validation"):
        return False  # its requests are still being queued (a retry's walk) or checked (a file batch)
    if int(batch.get("in_flight", 0)) > 0 or int(batch.get("offloaded", 0)) > 0:
        return False  # what runs (or a provider job holds) may settle below its worst case: the next waits for it
    committed, cap = float(batch.get("committed_usd", 0)), float(batch["max_cost_usd"])
    lanes = Lanes(svc)
    for model_id in batch.get("lanes", {}):
        for position in lanes.next_positions(batch, model_id):
            if position.worst_usd is not None and fits(committed, cap, position.worst_usd):
                return False  # a claim will take it
    if undispatched_count(batch) == 0 and int(batch.get("open", 0)) == 0:
        return False  # nothing left: it settles as it is
    # The waiting retries are read only when no lane can go on (their reads stop once one fits).
    if int(batch.get("open", 0)) > 0:
        for req in Request.waiting_of(svc.table, batch):
            if req.get("state") == RequestState.WAITING.value and fits(committed, cap,
                                                                       float(req.get("worst_usd", math.inf))):
                return False
    return True


def stop(svc: Services, batch: BatchItem) -> bool:
    """Stop the batch at its cap, as a cancel does; False if it was stopped or ended first."""
    error = cap_reached_error(float(batch["max_cost_usd"]), float(batch.get("cost_usd", 0)))
    return stop_batch(svc, batch, Stop.CANCEL, error)


def stop_if_reached(svc: Services, batch_id: str) -> BatchItem | None:
    """Where a settle or a claim may have left a capped batch unable to start anything more: stop it there
    and then (`reached`, on a fresh read; the stop is fenced as a cancel's is) and give it its final status
    as a cancel does, rather than at the sweeper's next look. Returns the batch as it is now."""
    batch = Batch.get(svc.table, batch_id)
    if batch is None or batch["status"] in FINAL_BATCH or not reached(svc, batch):
        return batch
    if not stop(svc, batch):
        return Batch.get(svc.table, batch_id)  # stopped or ended by another first
    return settle_batch(svc, batch_id, deadline=time.monotonic() + CANCEL_SETTLE_SECONDS)
