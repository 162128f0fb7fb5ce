"""The sweeper: the scheduled scan. It recovers leases that ran out and walks unfinished and expired
batches; every change it makes to a batch goes through `lifecycle`."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

from ...domain import FINAL_BATCH, RequestState, Stop
from ...layout import due_lateness, is_lease_due, request_key
from ...ledger import Settlement, close_group, give_back_slots, position_item, settle
from ...observability import Bulkhead
from ...records import Batch, GroupItem, InteractiveLease, Request, analytics
from ...runtime import Services
from ...scheduling.policy import walk_order
from ...storage.dynamo import ConditionFailed, Throttled
from ..creating.intake import validate_file_batch
from ..lifecycle import begin_purge, due_to_expire, fail_batch, internal_error, purge_batch, settle_batch, stop_batch
from ..offloading import jobs
from ..steering import pausing, retry, spending_cap
from . import webhooks

log = logging.getLogger(__name__)


LOST = {"code": "timeout", "message": "The worker running this request stopped before it answered."}
# A group member whose worker died after it started: counted once in the batch's analytics as an attempt with
# no answer (no latency), under LOST's code; its run again counts as a retry.
ABANDONED = analytics.attempt_tally(None, LOST["code"], retry=False)
PURGES_PER_RUN = 50  # batches one run works on purging at most (each only while the run's time lasts)
# Checking a file batch's lines is one step, not resumable (50,000 lines, 9 MB: about 5 s of CPU here): it
# starts only with this much time left before the run's deadline, and the handler keeps 15 s more in hand.
VALIDATION_RESERVE_SECONDS = 30.0


@dataclass
class Overdue:
    """How far behind the sweeper is: the seconds past its due time of the most overdue item a run found (a
    lease that ran out, a webhook event to send again, a batch to expire). Read from what the run queries and
    reads anyway: the by_due pages (oldest first) carry `due_at`, a batch its `expires_at`. None until the run
    has looked; purges are left out (a large one takes several runs by design)."""

    seconds: int | None = None

    def saw(self, late: int) -> None:
        self.seconds = max(self.seconds or 0, late)


def _out_of_time(deadline: float | None) -> bool:
    return deadline is not None and time.monotonic() >= deadline


def _recover_group(svc: Services, group: GroupItem) -> None:
    """A group whose lease ran out. Members whose outcome was written are counted from their items; the
    others wait to run again, alone. If the group had started, those may have run: their cost is unknown
    and they used up an attempt."""
    now = svc.now()
    started = group["state"] == RequestState.RUNNING.value
    keys = [request_key(group["batch_id"], p[0]) for p in group["positions"]]
    found = svc.table.get_many(keys) if started else {}
    written, new = [], []
    for key, position in zip(keys, group["positions"], strict=True):
        item = found.get(key)
        if item is not None and item.get("group_token") == group["token"]:
            written.append(item)
            continue
        if not started:
            outcome, attempt = Settlement(to=RequestState.WAITING, retry_at=now), 0
        elif svc.settings.max_attempts <= 1:
            outcome, attempt = Settlement(to=RequestState.FAILED, error=LOST, cost_unknown=1, attempt=ABANDONED), 1
        else:
            outcome, attempt = Settlement(to=RequestState.WAITING, error=LOST, cost_unknown=1, retry_at=now,
                                          attempt=ABANDONED), 1
        new.append(position_item(svc, group, position, outcome, attempt))
    close_group(svc, group, written, new)


def recover_leases(svc: Services, limit: int = 100, deadline: float | None = None,
                   overdue: Callable[[int], None] | None = None) -> int:
    """Requests, groups and slot leases whose lease ran out: the message was lost or the worker died. Put them
    back (none after `deadline`, time.monotonic(): the next run goes on). `overdue` hears how late the most
    overdue of them is."""
    now = svc.now()
    recovered = 0
    due = Request.due_leases(svc.table, now, limit)
    if overdue:
        overdue(due_lateness(due, now))
    for stale in walk_order(due, _item_key, svc.failed_last, walk_turn(svc)):
        if _out_of_time(deadline):
            break
        # One lease whose recovery raises is logged, counted and passed over (taken last next time); its
        # lease stays due, so a later run tries again.
        with Bulkhead("lease recovery", _item_key(stale), "recovery", svc.failed_last):
            recovered += _recover_one(svc, stale, now)
    return recovered


def _item_key(item: dict) -> str:
    return f"{item['pk']}|{item['sk']}"


def walk_turn(svc: Services) -> int:
    """This process's turn counter for the walks' rotating start (`policy.walk_order`): from the clock at its
    first run (instances started at different times start at different places), one more per call."""
    turn = svc.last_ran.get("walk_turn", svc.now()) + 1
    svc.last_ran["walk_turn"] = turn
    return turn


def _recover_one(svc: Services, stale: dict, now: int) -> int:
    """Recover one lease the index found due; returns how many requests it put back or settled."""
    req = svc.table.get(stale["pk"], stale["sk"])
    if not req or not is_lease_due(req.get("due_pk")) or req["due_at"] > now:
        return 0
    if req.get("interactive"):  # an interactive request whose process died: batch work may have its slot
        try:
            svc.table.transact(InteractiveLease.end(svc.table, req["model"], req["sk"].split("#", 1)[1],
                                                     svc.now_ms(), int(req.get("shard", 0))))
        except (ConditionFailed, Throttled):
            pass  # it ended meanwhile, or DynamoDB is busy
        return 0
    if "slots" in req:  # a SlotLease whose worker died: its slots go back to the budget
        try:
            give_back_slots(svc, req, int(req["slots"]))
        except (ConditionFailed, Throttled):
            pass  # released meanwhile, or DynamoDB is busy
        return 0
    if "positions" in req:
        try:
            _recover_group(svc, req)
        except (ConditionFailed, Throttled):
            return 0  # ended or written meanwhile, or DynamoDB is busy: the next pass looks again
        return len(req["positions"])
    if req["state"] == RequestState.RUNNING.value:
        # The backend may have run it: its cost is unknown, and it used up an attempt.
        # For the batch's analytics, an attempt abandoned unanswered: counted once, here, with no latency.
        abandoned = analytics.attempt_tally(None, LOST["code"], retry=analytics.is_retry(req))
        if req.get("attempt", 0) >= svc.settings.max_attempts:
            outcome = Settlement(to=RequestState.FAILED, error=req.get("error") or LOST, cost_unknown=1,
                                 attempt=abandoned)
        else:
            outcome = Settlement(to=RequestState.WAITING, error=req.get("error") or LOST, cost_unknown=1,
                                 retry_at=now, attempt=abandoned)
    else:
        outcome = Settlement(to=RequestState.WAITING, retry_at=now)
    try:
        settle(svc, req, outcome)
    except (ConditionFailed, Throttled):
        return 0  # moved on meanwhile, or DynamoDB is busy: the next pass looks again
    return 1


def _lease_scan_due(svc: Services, now: int) -> bool:
    """Whether this run looks for leases that ran out: at most every `lease_scan_seconds` in this process
    (a lease runs for minutes; a look reads every lease shard)."""
    last = svc.last_ran.get("lease_scan")
    if last is not None and 0 <= now - last < svc.settings.lease_scan_seconds:
        return False
    svc.last_ran["lease_scan"] = now
    return True


def sweep_once(svc: Services, deadline: float | None = None, overdue: Overdue | None = None) -> dict:
    """One pass of the sweeper. Safe to run in several places at once: every change is conditional.
    `deadline` (time.monotonic()): no step starts after it (past already: the run starts nothing), and the
    long ones (result files, exports, purges) stop at it; the next run goes on where this one stopped.
    `overdue` collects how late the run found its most overdue item (the SweepLagSeconds metric)."""
    now = svc.now()
    saw = overdue.saw if overdue else None
    counts = {"recovered": 0, "settled": 0, "expired": 0, "purged": 0, "webhook_events_resent": 0}
    if _out_of_time(deadline):
        return counts
    # Each walk in a bulkhead too (its query may raise): the others still run.
    with Bulkhead("lease recovery", "due leases", "query"):
        try:
            if _lease_scan_due(svc, now):
                counts["recovered"] = recover_leases(svc, deadline=deadline, overdue=saw)
        except Throttled:
            pass
    # Relays are few and quick, and a late one keeps a receiver waiting: before the long steps.
    with Bulkhead("webhook relay", "due events", "query"):
        try:
            counts["webhook_events_resent"] = webhooks.relay_due(svc, deadline=deadline, overdue=saw)
        except Throttled:
            pass
    # Provider jobs (service.offloading), each in a bulkhead of its own: one that raises never stops the others.
    with Bulkhead("provider jobs", "due jobs", "query"):
        try:
            counts["provider_jobs"] = jobs.run_due(svc, deadline)
        except Throttled:
            pass
    # Each batch, then each purge, in a bulkhead: one whose step raises is logged, counted and passed over
    # (taken last next time), and the walk goes on; a batch that raises run after run ends failed.
    turn = walk_turn(svc)
    active: list[dict] = []
    with Bulkhead("sweeper", "unfinished batches", "query"):
        try:
            active = list(Batch.active(svc.table))
        except Throttled:
            log.warning("throttled while reading the unfinished batches; next pass")
    for item in walk_order(active, _batch_id, svc.failed_last, turn):
        if _out_of_time(deadline):
            break  # the batches not reached are still active: the next run walks them
        with Bulkhead("sweeper", item["id"], "finalization", svc.failed_last) as guard:
            try:
                counts_for = _sweep_batch(svc, item["id"], now, deadline, saw, guard)
            except Throttled:
                log.warning("throttled while sweeping batch %s; next pass", item["id"])
                continue
            for name in counts_for:
                counts[name] += 1
        if guard.error is not None and _failed_too_often(svc, item["id"], guard.step, now, deadline):
            counts["settled"] += 1
    for item in walk_order(Batch.due_for_purge(svc.table, now, limit=PURGES_PER_RUN), _batch_id, svc.failed_last,
                           turn):
        if _out_of_time(deadline):
            break
        with Bulkhead("sweeper", _batch_id(item), "purge", svc.failed_last):
            try:
                if _purge(svc, item, deadline):
                    counts["purged"] += 1
            except (ConditionFailed, Throttled):
                log.warning("batch %s could not be purged yet", _batch_id(item))
    return counts


def _batch_id(item: dict) -> str:
    return item.get("id") or item["pk"]


def _failed_too_often(svc: Services, batch_id: str, step: str, now: int, deadline: float | None) -> bool:
    """One more consecutive failure of the batch's sweep, counted on the batch; at the setting's count
    (`sweep_failures_to_fail`) the batch ends failed with `internal_error`, so that it does not come back at
    every run, its account's unfinished slot held, forever. True when it ended here."""
    with Bulkhead("sweeper", batch_id, f"counting a failure of its {step} step"):
        times = Batch.count_step_failure(svc.table, batch_id, step, now)
        if times < svc.settings.sweep_failures_to_fail:
            return False
        log.error("batch %s: its %s step failed %d times in a row; failing the batch", batch_id, step, times)
        after = fail_batch(svc, batch_id, internal_error(step, times), deadline)
        return after is not None and after["status"] in FINAL_BATCH
    return False


def _purge(svc: Services, item: dict, deadline: float | None) -> bool:
    """Go on with the purge of a batch due for one: deleted by its owner, or its retention ended (marked
    here first). True once it is gone."""
    batch = svc.table.get(item["pk"], item["sk"])
    if batch is None:
        return False
    if not batch.get("deleting") and batch["status"] not in FINAL_BATCH:
        return False  # retried in place since it was read as due: it runs again, its retention clock stopped
    if not batch.get("deleting"):  # its retention ended: request items are left to their TTL
        begin_purge(svc, batch, purge_items=False)
        batch = svc.table.get(item["pk"], item["sk"])
        if batch is None or not batch.get("deleting"):
            return False
    return purge_batch(svc, batch, deadline)


def _sweep_batch(svc: Services, batch_id: str, now: int, deadline: float | None = None,
                 overdue: Callable[[int], None] | None = None, guard: Bulkhead | None = None) -> list[str]:
    """Settle one unfinished batch; expire it if its window closed with requests not yet started. `guard`
    hears which step it is at (for the log and the batch's error, should one raise); when every step went
    through, the batch's tally of consecutive failures starts again."""
    guard = guard or Bulkhead("sweeper", batch_id, "finalization")
    done: list[str] = []
    after = settle_batch(svc, batch_id, deadline)
    failures = bool(after and after.get("step_failures"))
    if after is not None and after.get("retrying"):  # a retry still re-queueing its requests: carry it on
        if retry.call_walking(after, now):  # once the call that retried it has stopped walking
            return _went_through(svc, batch_id, failures, done)
        guard.step = "retry"
        after = retry.carry_on(svc, after, deadline)
        if after is None or after.get("retrying"):
            return _went_through(svc, batch_id, failures, done)
        guard.step = "finalization"
        after = settle_batch(svc, batch_id, deadline)
    if after is not None and after.get("pause_walk"):  # a pause or resume still walking its waiting requests
        guard.step = "pause"
        after = pausing.carry_on(svc, after, deadline)
    if after is not None and after.get("awaiting_validation") and not after.get("stop"):
        if deadline is not None and time.monotonic() + VALIDATION_RESERVE_SECONDS > deadline:
            return done  # not enough time left for the whole step (fenced, safe to repeat): the next run
        guard.step = "validation"
        if validate_file_batch(svc, after) == "failed":
            done.append("settled")
        return _went_through(svc, batch_id, failures, done)
    if after is None or after["status"] in FINAL_BATCH:
        return ["settled"] if after else []
    guard.step = "expiry" if due_to_expire(after, now) else "spending cap"
    expiring = guard.step == "expiry"
    if expiring:
        if overdue:
            overdue(now - int(after["expires_at"]))
        if stop_batch(svc, after, Stop.EXPIRE):
            done.append("expired")
        guard.step = "finalization"
        after = settle_batch(svc, batch_id, deadline)
        if after and after["status"] in FINAL_BATCH:
            done.append("settled")
    elif spending_cap.reached(svc, after):  # the next request would pass the cap: it stops as a cancel does
        spending_cap.stop(svc, after)
        guard.step = "finalization"
        after = settle_batch(svc, batch_id, deadline)
        if after and after["status"] in FINAL_BATCH:
            done.append("settled")
    return _went_through(svc, batch_id, failures, done)


def _went_through(svc: Services, batch_id: str, failures: bool, done: list[str]) -> list[str]:
    """Every step of the batch's sweep went through: the tally of its consecutive failures, if any, is cleared."""
    if failures:
        Batch.clear_step_failures(svc.table, batch_id)
    return done
