"""A batch's spending cap, where it stops the batch: when nothing of it runs and not one of the requests it
could start next fits within the cap beside what it has spent, it stops as a cancel does (what runs
finishes, the rest ends unstarted) with `error.code` `max_cost_reached`.

Claims never start a request whose worst case could pass the cap (ledger, `spending`); while attempts run,
the next request waits for them to settle below their worst case rather than stopping the batch, so the
cap is spent as far as the requests' worst cases allow. The sweeper's walk of unfinished batches makes the
stop (`reached`, then `stop`): its reads happen only for a capped batch with nothing in flight.
"""

from __future__ import annotations

import math

from ..domain import RequestState, Stop
from ..records import BatchItem, Request
from ..runtime import Services
from ..scheduling.lanes import Lanes
from ..spending import cap_reached_error, fits
from .lifecycle import stop_batch, undispatched_count


def reached(svc: Services, batch: BatchItem) -> bool:
    """Whether the capped batch can start nothing more: nothing in flight, something left to run, and the
    cheapest next request (each lane's next one, each waiting retry) would pass the cap."""
    if batch.get("max_cost_usd") is None or batch.get("stop") or batch.get("deleting"):
        return False
    if int(batch.get("in_flight", 0)) > 0:
        return False  # what runs may settle below its worst case: the next request waits for it
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
