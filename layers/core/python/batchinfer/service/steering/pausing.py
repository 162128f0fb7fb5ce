"""Pause and resume: a paused batch starts no request; those already running finish.

Pausing is a flag on the batch (`paused_at`), not a status: a paused batch stays validating or in progress,
its completion window keeps running, and the sweeper expires it when the window closes. The pause removes
the batch's lanes in the same transaction as it sets the flag (as a stop does), so dispatchers stop serving
it at once; every claim and every start is fenced on the flag (`records.Batch`). What was dispatched but had
not started goes back to waiting, holding no slot and put off in that same write (`run_request._precheck`,
fenced on the pause), and the batch's waiting requests are put off until the window's end
(`ledger.defer_while_paused`): the slots it held go to the other batches as soon as its running requests end.

A resume removes the flag, puts the lanes that still have requests to dispatch back in the model's ring
(at their old place: a lane sorts by its batch's creation) and makes the requests the pause put off due at
once. Each step is fenced, so a pause and a resume racing (or racing a worker putting a request back) leave
no request put off while its batch runs: whichever write comes second sees the other's.

A paused batch's waiting requests are out of their model's `waiting` count (what tells dispatchers, the
console and the quota's wake-ups that retries wait): putting one off takes it out (`uncounted` on the
request), bringing it back puts it back, in the transaction that moves it, fenced on its token; every way out
of waiting (a claim, a stop's close, a purge) moves the count only for a counted request.

A batch holds up to 50,000 requests, so neither call walks them all: the pause (or resume) starts a walk
over the batch's waiting requests (`pause_walk`: its id and a cursor) in the transaction that sets (or
removes) the flag, walks for a few seconds and answers; the sweeper carries the walk on (`carry_on`). Each
step moves a page of requests and advances the cursor in one transaction fenced on the walk and the cursor,
so two walkers move each request once, and a walker that dies midway leaves the cursor where its last step
left it. A resume (or a pause) starts a walk of its own in place of the other's, from the start.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable

from ...domain import FINAL_BATCH, PAUSABLE_BATCH, RequestState, new_token
from ...errors import BatchNotFound, Conflict
from ...layout import REQUEST_PREFIX
from ...ledger import defer_while_paused, paused_until
from ...records import Batch, BatchItem, Budget, Lane, Request, RequestItem
from ...runtime import Services
from ...storage.dynamo import ConditionFailed, Throttled
from ..reading import analytics

ATTEMPTS = 3  # a pause or resume that keeps losing to other changes of the batch (claims, counters) gives up
WALK_PAGE = 40  # requests moved per step: their moves, the batch's cursor and each model's count fit one transaction
READ_PAGE = 400  # request items a step reads at most (only the waiting ones come back)
CALL_SECONDS = 5.0  # what the API call spends walking before it answers; the sweeper does the rest


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
        raise BatchNotFound(batch_id)
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


def _walk(resume: bool) -> dict:
    return {"id": new_token(), "resume": resume}


def pause(svc: Services, batch: BatchItem) -> BatchItem:
    """Pause a validating or in-progress batch; a paused one is returned unchanged. Conflict (409) for a
    batch that has ended or is stopping (cancelling, finalizing). Returns the batch as it is now."""
    t = svc.table

    def pausing(current: BatchItem) -> list | None:
        if current.get("paused_at"):
            return None
        return [Batch.pause(t, current["id"], svc.now(), _walk(resume=False))] + [
            Lane.remove(t, m, current) for m in current["lanes"]]

    batch, changed = _change(svc, batch, "paused", pausing)
    if not changed:
        return batch
    return _walk_in_call(svc, batch)


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
        return [Batch.resume(t, current["id"], int(current["paused_at"]), _walk(resume=True), seen=current)] + [
            Lane.create(t, m, current) for m in lanes]

    batch, changed = _change(svc, batch, "resumed", resuming)
    if not changed:
        return batch
    analytics.after_resume(svc, seen)
    return _walk_in_call(svc, batch)


def _walk_in_call(svc: Services, batch: BatchItem) -> BatchItem:
    """The part of the walk the API call does; the sweeper carries on with the rest."""
    try:
        batch = carry_on(svc, batch, time.monotonic() + CALL_SECONDS) or batch
    except Throttled:  # the pause (or resume) is made; the sweeper carries its walk on
        pass
    return _fresh(svc, batch["id"])


# --- The walk -----------------------------------------------------------------------------------------

def carry_on(svc: Services, batch: BatchItem | None, deadline: float | None) -> BatchItem | None:
    """Go on with the batch's pause (or resume) walk until it is over or `deadline` (time.monotonic()) comes;
    returns the batch as it is now. Safe to run in several places at once: each step is fenced on the walk and
    its cursor."""
    while batch is not None and batch.get("pause_walk"):
        if deadline is not None and time.monotonic() >= deadline:
            break
        batch = _step(svc, batch)
    return batch


def _moves(req: RequestItem, resume: bool) -> bool:
    """Whether the walk moves this waiting request: a pause puts off what is counted; a resume brings back
    what a pause put off (out of the count, or due at the window's end: put back by a worker meanwhile)."""
    if resume:
        return bool(req.get("uncounted")) or int(req.get("due_at", 0)) >= int(req["batch_expires_at"])
    return not req.get("uncounted")


def _step(svc: Services, batch: BatchItem) -> BatchItem | None:
    t = svc.table
    walk = batch["pause_walk"]
    cursor = walk.get("cursor")
    if batch.get("stop") or batch.get("deleting") or batch["status"] in FINAL_BATCH:
        try:  # what still waits is closed with the batch (a stop's close moves the count of each once)
            Batch.end_pause_walk(t, batch["id"], walk["id"])
        except ConditionFailed:
            pass
        return Batch.get(t, batch["id"])
    items, more = t.query("pk = :pk AND sk > :after", {":pk": batch["pk"], ":after": cursor or REQUEST_PREFIX,
                                                        ":w": RequestState.WAITING.value},
                          filter_expression="#state = :w", limit=READ_PAGE, consistent=True)
    now = svc.now()
    ops: list = []
    counts: Counter = Counter()
    last, full = cursor, False
    for item in items:
        if len(ops) == WALK_PAGE:
            full = True  # the step is full: the next one goes on from the last item it looked at
            break
        last = item["sk"]
        # A request held by a provider job stays with it: the job runs on at the provider while paused.
        if not item["sk"].startswith(REQUEST_PREFIX) or item.get("job") or not _moves(
                {**item, "batch_expires_at": batch["expires_at"]}, walk["resume"]):
            continue
        if walk["resume"]:
            ops.append(Request.bring_back(t, item, now, new_token()))
            counts[item["model"]] += 1 if item.get("uncounted") else 0
        else:
            ops.append(Request.put_off(t, item, paused_until(batch, now), new_token()))
            counts[item["model"]] -= 1
    if not full and more is not None:
        last = more["sk"]  # the read's page ended there (the filter left out what does not wait)
    done = not full and more is None
    ops.append(Batch.pause_walk_step(t, batch["id"], walk["id"], cursor, None if done else last))
    ops += [op for model, k in counts.items() if k and (op := Budget.add(t, model, {"waiting": k})) is not None]
    try:
        t.transact(ops)
    except ConditionFailed:
        pass  # another walker moved this step first, a request moved meanwhile, or the batch stopped: read again
    return Batch.get(t, batch["id"])


def after_wait(svc: Services, batch_id: str, indexes: list[int]) -> None:
    """After a worker put requests of a paused batch back to wait: that write put them off already (out of
    the count, due at the window's end, fenced on the batch still paused: `Settlement.uncounted`), so a
    worker that dies before this leaves nothing to fix. Here, a batch resumed since has them due now and
    counted at once, without waiting for its resume's walk: never counted twice (each move is fenced on the
    request's token)."""
    t = svc.table
    batch = Batch.get(t, batch_id)
    if not batch or batch.get("stop") or batch["status"] in FINAL_BATCH or batch.get("deleting"):
        return
    for index in indexes:
        req = Request.get(t, batch_id, index)
        if not req or req["state"] != RequestState.WAITING.value:
            continue
        if batch.get("paused_at"):
            defer_while_paused(svc, req, batch)
        elif _moves({**req, "batch_expires_at": batch["expires_at"]}, resume=True):
            ops = [Request.bring_back(t, req, svc.now(), new_token())]
            if req.get("uncounted") and (op := Budget.add(t, req["model"], {"waiting": 1})) is not None:
                ops.append(op)
            try:
                t.transact(ops)
            except ConditionFailed:
                pass  # claimed or closed meanwhile
