"""A batch's lifecycle: the only place that changes a batch's status.

Stop (cancel, expire, fail), settle (the final status once nothing runs or is left to start), purge
(delete with its results: marked at once, by a user's delete or when the retention ends, then removed by the
sweeper in resumable steps). Every status change is checked against the transition table in `domain`
(through `records.Batch`), and fenced in DynamoDB on the status it was decided from, so two callers
(the API, the sweeper, a worker) racing on one batch change it once. Whatever the API a batch came
from (inline, file, Message Batch), it ends here.
"""

from __future__ import annotations

import logging
import time
from collections import Counter

from ..domain import (
    FINAL_BATCH,
    STOPPABLE_BATCH,
    BatchStatus,
    RequestState,
    Stop,
    counts_as_failed_unstarted,
    final_status,
    new_file_id,
    unstarted_stop,
)
from ..layout import REQUEST_PREFIX, batch_prefix, export_object, file_prefix
from ..ledger import Settlement, settle
from ..records import Account, Batch, BatchItem, File, Idempotency, Lane, Request
from ..runtime import Services
from ..storage.dynamo import ConditionFailed, ItemTooLarge
from .background import finalize, webhooks
from .creating.validation import bounded_problems

log = logging.getLogger(__name__)

OWNER_UNAUTHORIZED = {"code": "owner_unauthorized",
                      "message": "The API key that created this batch was revoked or has expired, or its "
                                 "account was suspended or deleted."}


def internal_error(step: str, times: int) -> dict:
    """Why a batch ended failed when one of the service's own steps on it kept raising: no user's mistake, and
    nothing the user can change; what was run is kept, what never started counts as failed."""
    return {"code": "internal_error",
            "message": f"The service failed {times} times in a row at the {step} step of this batch and stopped it. "
                       "Requests that had finished keep their results; those not started are counted as failed. "
                       "Submitting the failed requests again (or retrying the batch) may succeed."}


def dispatched_count(batch: BatchItem) -> int:
    """How many of the batch's requests have been dispatched (lanes advance as they are)."""
    return sum(lane["next"] for lane in batch["lanes"].values())


def never_dispatched_count(batch: BatchItem) -> int:
    """How many of the batch's requests its lanes have not dispatched (those rejected at intake never are)."""
    return batch["total"] - batch.get("rejected", 0) - dispatched_count(batch)


def undispatched_count(batch: BatchItem) -> int:
    """How many of the batch's requests are still to be dispatched: none while a retry left its
    never-dispatched ones as they ended (`parked`: counted then, and in no lane)."""
    return 0 if batch.get("parked") else never_dispatched_count(batch)


def stop_batch(svc: Services, batch: BatchItem, stop: Stop, error: dict | None = None, listed: bool = False) -> bool:
    """Stop a batch from starting requests. Returns False if it was already stopped or finished. `error`:
    why, on the batch (a cancel by its spending cap says so); `listed`: in its `errors` list too."""
    # The lanes go in the same transaction, so a stopped batch never keeps a turn at dispatch.
    if stop is Stop.FAIL and error is None:
        error = OWNER_UNAUTHORIZED
    ops = [Batch.stop(svc.table, batch["id"], stop, svc.now(), error, listed)]
    ops += [Lane.remove(svc.table, m, batch) for m in batch["lanes"]]
    try:
        svc.table.transact(ops)
    except ConditionFailed:
        return False
    return True


def _out_of_time(deadline: float | None) -> bool:
    return deadline is not None and time.monotonic() >= deadline


def _close_waiting(svc: Services, batch: BatchItem, stop: Stop, deadline: float | None = None) -> None:
    """Requests waiting to run again when their batch stops: those that never ran become unstarted; those
    that ran keep their last error as their outcome. Stops at `deadline`; the next sweep closes the rest."""
    for req in Request.waiting_of(svc.table, batch):
        if _out_of_time(deadline):
            return
        to = RequestState.UNSTARTED if req.get("attempt", 0) == 0 else RequestState.FAILED
        try:
            settle(svc, req, Settlement(to=to, error=req.get("error") if to is RequestState.FAILED else None),
                   stop=stop)
        except ConditionFailed:
            pass  # a worker or dispatcher moved it first; the next sweep looks again


def settle_batch(svc: Services, batch_id: str, deadline: float | None = None,
                 failing: dict | None = None) -> BatchItem | None:
    """Give a batch its final status once nothing of it is running or left to start. `deadline`
    (time.monotonic()): when writing its result files or export must stop, to carry on in the next run.
    `failing`: the batch is being failed for this error (`fail_batch`) after its ending kept raising: it ends
    without result files or export (its results stay readable page by page), `failed` even if it was
    finalizing."""
    batch = Batch.get(svc.table, batch_id)
    if batch is None or batch["status"] in FINAL_BATCH or batch.get("deleting"):
        return batch
    if batch.get("retrying"):
        return batch  # a retry is still re-queueing its requests (service.steering.retry carries it on)
    stop = Stop(batch["stop"]) if batch.get("stop") else None
    if batch.get("awaiting_validation") and stop is None:
        return batch  # a file batch whose lines are still being checked
    if batch.get("in_flight", 0) > 0 or batch.get("offloaded", 0) > 0:  # running, or held by a provider job
        return batch
    if stop is None and (undispatched_count(batch) > 0 or batch.get("open", 0) > 0):
        return batch
    if stop is not None and batch.get("open", 0) > 0:
        _close_waiting(svc, batch, stop, deadline)
        batch = Batch.get(svc.table, batch_id)
        # Another settler (a worker whose last work of the batch is done, another sweeper) may have ended it
        # meanwhile: an ended batch is not ended again (its never-started requests would count twice).
        if _ended_or_moved(batch) or batch.get("open", 0) > 0 or batch.get("in_flight", 0) > 0:
            return batch
    now = svc.now()
    # What the batch leaves behind is written first, resumably (service.background.finalize): its output and error
    # files if it came from a file; output.jsonl in S3 if it is too large for a Lambda answer.
    kinds = ("output", "error") if batch.get("input_file_id") else ()
    if batch.get("result_bytes", 0) > svc.settings.export_redirect_bytes:
        kinds += ("export",)
    sets: dict = {}
    if failing is not None:
        kinds = ()
        sets["errors"] = {"object": "list", "data": [{**failing, "param": None, "line": None}]}
        if stop is not Stop.CANCEL:
            sets["error"] = failing
    if kinds:
        batch = _prepare_writers(svc, batch, now, with_files=bool(batch.get("input_file_id")))
        batch = finalize.write(svc, batch, kinds, deadline) if batch else None
        if batch is None:  # out of time, or another run is writing: the next run carries on
            return Batch.get(svc.table, batch_id)
        writing = batch["writing"]
        if "export" in kinds:
            sets["export_object"] = export_object(batch_id)
        if batch.get("input_file_id"):
            sets["output_file_id"], sets["error_file_id"] = writing["output"]["file"], writing["error"]["file"]
    if _ended_or_moved(batch):  # ended, deleted or retried since the first read (see above)
        return batch
    never_started = undispatched_count(batch)
    if batch.get("retry_count") and (never_started or int(batch.get("unstarted", 0))):
        sets["unstarted_by"] = _unstarted_by_stop(svc, batch, stop, never_started)
    # A retried batch whose never-dispatched requests stayed as they were keeps the fate they ended with:
    # left undispatched (`parked`), or stored as unstarted items by an earlier ending (its retries left them).
    final = final_status(stop or (Stop(batch["parked"]) if batch.get("parked") else None)
                         or _earlier_fate(sets.get("unstarted_by")))
    if failing is not None and stop is None:  # finalizing: everything ran, but its ending cannot be written
        final = BatchStatus.FAILED
    # A retried batch is kept no longer than the request items of its first run (their TTL).
    retention_ends = min(now + svc.settings.batch_retention_seconds, int(batch.get("keep_until", now + 10**9)))
    ops = [Batch.finalize(svc.table, batch, final, stop, now,
                          retention_ends=retention_ends,
                          never_started_failed=never_started if counts_as_failed_unstarted(stop) else 0,
                          never_started=never_started, export=None, sets=sets),
           Account.release_unfinished(svc.table, batch["account_id"], batch["total"])]
    if batch.get("idempotency_key"):  # the key is remembered until a day after its batch ends
        ops.append(Idempotency.remember_until(svc.table, batch["account_id"], batch["idempotency_key"],
                                              now + svc.settings.idempotency_retention_seconds))
    event = _announcing(svc, batch, final, ops)
    try:
        svc.table.transact(ops)
    except ConditionFailed:
        return Batch.get(svc.table, batch_id)  # someone else settled it, or it changed: the fresh read says which
    webhooks.announce(svc, event)
    return Batch.get(svc.table, batch_id)


def _ended_or_moved(batch: BatchItem | None) -> bool:
    """Whether a batch read again while settling is no longer one this settle may end: gone, ended, being
    deleted, or being retried."""
    return batch is None or batch["status"] in FINAL_BATCH or bool(batch.get("deleting")) or bool(batch.get("retrying"))


def _unstarted_by_stop(svc: Services, batch: BatchItem, stop: Stop | None, never_started: int) -> dict[str, int]:
    """How many of a retried batch's requests that never ran ended under each stop: its runs may have ended
    differently (cancelled, then retried for its failed requests, then expired), and the ones a retry left
    keep their fate. From the request items (their error says which stop), the requests its lanes never
    dispatched (this ending's stop) and those a retry left undispatched (`parked`). Read once, at the end."""
    counts: Counter[str] = Counter()
    for item in svc.table.query_all("pk = :pk AND begins_with(sk, :r)",
                                    {":pk": batch["pk"], ":r": REQUEST_PREFIX, ":u": RequestState.UNSTARTED.value},
                                    filter_expression="#state = :u", projection="#error", consistent=True):
        counts[unstarted_stop(item.get("error")).value] += 1
    if never_started and stop is not None:
        counts[stop.value] += never_started
    if batch.get("parked"):
        counts[str(batch["parked"])] += never_dispatched_count(batch)
    return dict(counts)


def _earlier_fate(unstarted_by: dict[str, int] | None) -> Stop | None:
    """The stop that the most of a retried batch's never-run requests ended under (in earlier runs), or None
    when every request ran: what a run that ends without a stop of its own ends as."""
    counts = {Stop(name): n for name, n in (unstarted_by or {}).items() if n}
    return max(counts, key=lambda s: (counts[s], -list(Stop).index(s))) if counts else None


def _announcing(svc: Services, batch: BatchItem, final: BatchStatus, ops: list) -> dict | None:
    """The webhook event of this ending, put in the ending's own transaction: recorded if and only if the
    batch ends, and once."""
    event = webhooks.ending_event(svc, batch, final)
    if event is not None:
        ops.append(webhooks.event_put(svc, event))
    return event


def fail_batch(svc: Services, batch_id: str, error: dict, deadline: float | None = None) -> BatchItem | None:
    """End a batch `failed` with `error` (`internal_error`): one of the sweeper's steps on it kept raising. It
    stops as an owner's failure stops it (running requests finish, those not started count as failed, a retry
    walk ends where it is); then it settles, and, should its ending itself keep raising, settles without its
    result files. A batch already cancelling or expiring ends as its stop says. Returns the batch as it is now
    (not final yet while requests of it run: the next sweep settles it)."""
    batch = Batch.get(svc.table, batch_id)
    if batch is None or batch["status"] in FINAL_BATCH or batch.get("deleting"):
        return batch
    if not batch.get("stop") and batch["status"] in {s.value for s in STOPPABLE_BATCH}:
        stop_batch(svc, batch, Stop.FAIL, error, listed=True)
    if batch.get("retrying"):
        try:
            Batch.end_requeue(svc.table, batch_id, int(batch["retrying"]["n"]))
        except ConditionFailed:
            pass  # it ended meanwhile
    try:
        return settle_batch(svc, batch_id, deadline)
    except Exception as raised:  # its ending is what raises: end it without what it leaves behind
        log.warning("batch %s: its ending raised %s; ending it without result files", batch_id,
                    type(raised).__name__)
    return settle_batch(svc, batch_id, deadline, failing=error)


# What a failed file batch lists when its problems could not be stored with it (never expected: they are
# bounded, validation.ProblemList): the batch still ends, with this, rather than staying `validating`.
PROBLEMS_NOT_STORED = {"code": "invalid_file", "param": None, "line": None,
                       "message": "The input file is invalid; its problems are too large to list. Check each line "
                                  "holds exactly custom_id, method, url and body, with short values."}


def fail_validation(svc: Services, batch: BatchItem, problems: list[dict]) -> bool:
    """A file batch whose input is invalid: failed at once, nothing run, its problems in `errors` (bounded in
    count and size, the rest summarized). False if it had been validated, stopped or ended meanwhile."""
    listed = bounded_problems(problems)
    for data in (listed, [PROBLEMS_NOT_STORED]):
        now = svc.now()
        ops = [Batch.finalize(svc.table, batch, BatchStatus.FAILED, None, now,
                              retention_ends=now + svc.settings.batch_retention_seconds, never_started_failed=0,
                              export=None, sets={"errors": {"object": "list", "data": data}}),
               Account.release_unfinished(svc.table, batch["account_id"], 0)]
        if batch.get("idempotency_key"):
            ops.append(Idempotency.remember_until(svc.table, batch["account_id"], batch["idempotency_key"],
                                                  now + svc.settings.idempotency_retention_seconds))
        event = _announcing(svc, batch, BatchStatus.FAILED, ops)
        try:
            svc.table.transact(ops)
        except ConditionFailed:
            return False
        except ItemTooLarge:
            log.error("batch %s: its %d validation problems would not fit in its item; failed with a summary",
                      batch["id"], len(listed))
            continue
        webhooks.announce(svc, event)
        return True
    return False


def _prepare_writers(svc: Services, batch: BatchItem, now: int, with_files: bool) -> BatchItem | None:
    """Before the first writer runs: a batch in progress becomes finalizing; a batch from a file gets the
    ids of its result files, chosen once. Returns the batch as it is now, or None if it changed."""
    try:
        if with_files and not batch.get("result_file_ids"):
            ids = {"output": new_file_id(), "error": new_file_id()}
            if batch["status"] == BatchStatus.IN_PROGRESS.value:
                svc.table.transact([Batch.begin_finalizing(svc.table, batch, now, ids)])
            else:  # cancelling: no finalizing step
                Batch.reserve_result_files(svc.table, batch, ids)
        elif "writing" not in batch:
            Batch.prepare_writers(svc.table, batch["id"])
    except ConditionFailed:
        return None
    return Batch.get(svc.table, batch["id"])


def due_to_expire(batch: BatchItem, now: int) -> bool:
    """Whether the batch's window closed with requests of it not yet started (and nothing stopped it). A
    paused batch whose window closed expires too while requests of it wait (its retries would not run)."""
    if batch.get("stop") or now < batch["expires_at"]:
        return False
    waiting = int(batch.get("open", 0)) - int(batch.get("in_flight", 0))
    return undispatched_count(batch) > 0 or bool(batch.get("paused_at")) and waiting > 0


# What a cancel does before it answers: enough to end a small batch at once; closing the waiting requests and
# writing the result files of a large one go on in the sweeper, resumably.
CANCEL_SETTLE_SECONDS = 2.0
PURGE_PAGE = 1000  # a purge's DynamoDB page: keys of the batch's items read, then deleted
DELETES_PER_STEP = 100  # items deleted between two looks at the deadline


def cancel(svc: Services, batch: BatchItem) -> BatchItem:
    """Cancel: unstarted requests are cancelled, running ones finish. Returns the batch as it is now
    (cancelled, or cancelling while the sweeper finishes settling it)."""
    if batch["status"] in FINAL_BATCH or batch["status"] == BatchStatus.FINALIZING.value or batch.get("stop"):
        return batch
    stop_batch(svc, batch, Stop.CANCEL)
    settle_batch(svc, batch["id"], deadline=time.monotonic() + CANCEL_SETTLE_SECONDS)
    return Batch.get(svc.table, batch["id"])


def begin_purge(svc: Services, batch: BatchItem, purge_items: bool) -> bool:
    """Mark the batch deleting: it reads as not found from then on, starts nothing more, gives back its
    unfinished counts, and is due for the sweeper's purge at once (`purge_batch`). `purge_items`: its
    request items go too (a user's delete); after the retention their TTL removes them for free.

    True when this call marked it; False when it is gone or marked already (a delete and the retention, or
    two deletes, converge on one purge). Raises ConditionFailed while one of its requests holds a slot."""
    for _ in range(3):
        ops = [Batch.mark_deleting(svc.table, batch, svc.now(), purge_items)]
        if batch["status"] not in FINAL_BATCH:
            ops.append(Account.release_unfinished(svc.table, batch["account_id"], batch["total"]))
        try:
            svc.table.transact(ops)
            return True
        except ConditionFailed:
            current = Batch.get(svc.table, batch["id"])
            if current is None or current.get("deleting"):
                return False
            if current.get("in_flight", 0) > 0:
                raise
            batch = current  # it ended (or moved on) meanwhile: decide its counts again from what it is now
    raise ConditionFailed(f"batch {batch['id']} kept changing")


def delete(svc: Services, batch: BatchItem) -> None:
    """A user's delete: marked at once (with its result files, at most two, so they read as gone with it);
    the sweeper removes the rest. Raises ConditionFailed while one of its requests holds a slot."""
    if begin_purge(svc, batch, purge_items=True):
        _purge_result_files(svc, batch)


def _purge_result_files(svc: Services, batch: BatchItem) -> None:
    for file_id in (batch.get("result_file_ids") or {}).values():
        svc.blobs.abort_uploads(file_prefix(file_id))  # a writer cut off mid-file
        svc.blobs.delete_prefix(file_prefix(file_id))  # the file and its writer's carry objects
        File.delete(svc.table, file_id)


def purge_batch(svc: Services, batch: BatchItem, deadline: float | None = None) -> bool:
    """Remove a batch marked deleting (`begin_purge`), in steps each safe to repeat, the batch item last so
    that the batch stays due until everything of it is gone: lanes, its groups and request items a page at
    a time, its S3 objects, its result files, its Idempotency-Key. True once nothing of it is left; False
    when `deadline` (time.monotonic()) came first: the next run goes on where this one stopped."""
    t = svc.table
    if _out_of_time(deadline):
        return False
    for model_id in batch.get("lanes") or {}:
        Lane.delete(t, model_id, batch)
    if batch.get("purge_items"):
        while True:
            if _out_of_time(deadline):
                return False
            page = Batch.purge_page(t, batch, PURGE_PAGE)
            if not page:
                break
            if not _delete_page(svc, page, deadline):
                return False
    svc.blobs.abort_uploads(batch_prefix(batch["id"]))  # an export's writer cut off mid-upload
    while True:
        if _out_of_time(deadline):
            return False
        if not svc.blobs.delete_page(batch_prefix(batch["id"])):
            break
    _purge_result_files(svc, batch)
    if batch.get("idempotency_key"):  # a replay of its create answers 410 from now on
        try:
            Idempotency.mark_deleted(t, batch["account_id"], batch["idempotency_key"],
                                     svc.now() + svc.settings.idempotency_retention_seconds)
        except ConditionFailed:
            pass  # forgotten already
    Batch.delete(t, batch["id"])
    return True


def _delete_page(svc: Services, page: list[dict], deadline: float | None) -> bool:
    """Delete one page of a batch's items; False when the deadline came first or nothing could go."""
    t = svc.table
    gone = 0
    # A request waiting for a retry leaves the model's waiting count with it (one transaction each: few wait).
    for req in page:
        if req.get("state") == RequestState.WAITING.value and req["sk"].startswith(REQUEST_PREFIX):
            try:
                t.transact(Request.drop_waiting(t, req))
                gone += 1
            except ConditionFailed:
                pass  # gone already, or moved: the next page reads it again
    keys = [(i["pk"], i["sk"]) for i in page if i.get("state") != RequestState.WAITING.value
            or not i["sk"].startswith(REQUEST_PREFIX)]
    for at in range(0, len(keys), DELETES_PER_STEP):
        if _out_of_time(deadline):
            return False
        t.delete_many(keys[at:at + DELETES_PER_STEP])
        gone += len(keys[at:at + DELETES_PER_STEP])
    return gone > 0
