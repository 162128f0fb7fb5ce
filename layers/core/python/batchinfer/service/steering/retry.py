"""Retry in place: an ended batch runs again the requests of it that did not succeed, keeping every success.

The call (`retry`) decides from the batch as it ended and changes it in one transaction fenced on the status
and retry count it read (`records.Batch.retry`): in progress again with a new window, back in `by_active`,
its ending undone (stop, ending times, retention clock, result files), its account's unfinished counts taken
again, its create call's Idempotency-Key held again. Nothing is re-queued by a second queue: requests that
ran and did not succeed have request items, and a walk over them (`retrying` on the batch: the filter and a
cursor) moves each one the filter takes to waiting, due at once, a page per transaction fenced on the
cursor, so the dispatcher serves them as it serves any retry (budgets, tier limits, key re-checks and the
window as ever): it sends one of them to start a worker whose slot pump takes the model's free slots and
claims the others in them ahead of its calls, writing the answers of the batch together
(scheduling.dispatcher, scheduling.pump), so a retried run keeps the model at its budget as a first run
does. Requests never dispatched (beyond their lane's cursor, after a cancel or an expiry) come back with their
lanes, re-created at their cursor when the walk ends, or stay as they ended (`parked`)
when the filter leaves them out.

The call walks for a few seconds (a batch holds up to 50,000 requests) and answers; the sweeper carries the
walk on where it stopped (`carry_on`) once the call has stopped walking (`call_walking`), and the batch does
not settle until the walk is over. The walk only
reads items ahead of its cursor, all of them from the earlier run: the lanes come back after it, and what it
re-queued lies behind it. The old result files and export go when the walk ends; new ones are written when
the batch ends again, under new ids.
"""

from __future__ import annotations

import json
import math
import time
from collections import Counter, OrderedDict
from collections.abc import Iterator
from dataclasses import dataclass

from ...domain import (
    FINAL_BATCH,
    RequestState,
    Stop,
    counts_as_failed_unstarted,
    new_token,
    public_request_status,
    unstarted_error,
    unstarted_stop,
)
from ...errors import BatchNotFound, Conflict, InvalidRequest, RateLimited, quoted
from ...layout import REQUEST_PREFIX, export_object, file_prefix, retry_filter_object
from ...records import Account, Batch, BatchItem, Budget, File, Idempotency, Lane, Request, RequestItem
from ...runtime import Services
from ...storage.dynamo import ConditionFailed, Table, Throttled
from ..accounts import Principal
from ..creating.intake import IdempotencyClaim, body_hash, check_idempotency_key, replay
from ..lifecycle import never_dispatched_count
from ..reading import analytics
from . import never_dispatched

RETRY_PAGE = 40  # requests re-queued per step: their moves, the batch's and each model's count fit one transaction
READ_PAGE = 400  # request items a step reads at most (most may be successes, which it passes over)
CALL_SECONDS = 5.0  # what the API call spends re-queueing before it answers; the sweeper does the rest
SCAN_SECONDS = 5.0  # what the API call spends looking for a request the filter takes (its 400)
# Errors that say the request itself cannot pass as written: retried only when named by custom id or code.
FINAL_FOR_INPUT = frozenset({"invalid_request", "model_not_found", "result_too_large"})
CANCELLED_CODE = "batch_cancelled"  # what a request its batch's cancel left unstarted is filed under
# The new run must end before the first run's request items reach their TTL (the batch's `keep_until`).
ENDING_ROOM_SECONDS = 3600

RETRIED_STATES = (RequestState.FAILED.value, RequestState.UNSTARTED.value)
MAX_CUSTOM_ID_CHARS = 512  # what a custom_id may be: a longer one names no request
MAX_ERROR_CODE_CHARS = 128  # an error code a filter names (the codes results show are a few words)
# A filter whose JSON is larger than this is not stored in the batch item (DynamoDB: 400 KB an item; 50,000
# custom ids of 512 characters are 25 MB): it is written to S3 once, and the walk holds its key.
INLINE_FILTER_BYTES = 4 * 1024
_FILTERS_KEPT = 16  # filters read from S3 that a process keeps (a walk reads its filter at every step)
_filters: OrderedDict[str, RetryFilter] = OrderedDict()


@dataclass(frozen=True)
class RetryFilter:
    """What a retry takes among the requests that did not succeed (None: no narrowing by that). `statuses`
    as results show them (failed, expired, cancelled); `error_codes` as results show them."""

    custom_ids: frozenset[str] | None = None
    error_codes: frozenset[str] | None = None
    statuses: frozenset[str] | None = None

    def stored(self) -> dict:
        return {name: sorted(value) for name in ("custom_ids", "error_codes", "statuses")
                if (value := getattr(self, name)) is not None}

    @staticmethod
    def of(stored: dict) -> RetryFilter:
        return RetryFilter(**{name: frozenset(value) for name, value in stored.items()})

    def takes(self, custom_id: str | None, status: str, code: str | None) -> bool:
        if self.custom_ids is not None and custom_id not in self.custom_ids:
            return False
        if self.error_codes is not None and code not in self.error_codes:
            return False
        if self.statuses is not None and status not in self.statuses:
            return False
        # A request whose input is at fault fails the same way again: only when the caller names it.
        return code not in FINAL_FOR_INPUT or self.custom_ids is not None or self.error_codes is not None


def never_ran_shown(stop: Stop) -> tuple[str, str]:
    """(status, error code) of a request its batch's stop left unstarted, as results show them."""
    return public_request_status(None, stop), (unstarted_error(stop) or {"code": CANCELLED_CODE})["code"]


def shown(item: RequestItem) -> tuple[str, str | None]:
    """(status, error code) of a failed or unstarted request item."""
    if item["state"] == RequestState.FAILED.value:
        return "failed", (item.get("error") or {}).get("code")
    return never_ran_shown(unstarted_stop(item.get("error")))


def _never_stop(batch: BatchItem) -> Stop | None:
    """The stop its never-dispatched requests ended under."""
    value = batch.get("parked") or batch.get("stop")
    return Stop(value) if value else None


def retry(svc: Services, principal: Principal, batch: BatchItem, wanted: RetryFilter, described: str,
          idem_key: str | None, cap: float | None = None) -> tuple[BatchItem, bool]:
    """Retry an ended batch in place. Returns (the batch as it is now, replayed): replayed is True when an
    earlier call with the same Idempotency-Key and body did it. `described`: the filter in the caller's
    words, for the 400 when it takes nothing. `cap`: a new spending cap (`max_cost_usd`) for a batch created
    with one: what lets a batch its cap stopped go on."""
    check_idempotency_key(idem_key)
    claim = (IdempotencyClaim(idem_key, body_hash({"retry": batch["id"], "body": wanted.stored(), "cap": cap}))
             if idem_key else None)
    if claim and (earlier := replay(svc, principal, claim)) is not None:
        return earlier, True
    if batch["status"] not in FINAL_BATCH or batch.get("retrying"):
        raise Conflict(f"Batch '{batch['id']}' has not ended (status '{batch['status']}'); only an ended batch can "
                       "be retried.", code="batch_not_ended")
    _check_cap(batch, cap)
    t, s = svc.table, svc.settings
    now = svc.now()
    window = int(batch.get("window_seconds") or batch["expires_at"] - batch["created_at"])
    keep_until = int(batch.get("keep_until") or batch["expires_at"] + s.batch_retention_seconds)
    if now + window + ENDING_ROOM_SECONDS > keep_until:
        raise Conflict(f"Batch '{batch['id']}' is too close to the end of its retention to run again: a new "
                       "completion window would outlast its results.", code="retention_ending")
    never = never_dispatched_count(batch)
    never_stop = _never_stop(batch)
    if wanted.custom_ids is not None and never > 0 and never_stop is not None:
        # A never-dispatched request has no request item for a custom id to name: they are filed as items first,
        # with the fate they ended with (`never_dispatched`); those not named stay as they are (`parked`).
        status, code = never_ran_shown(never_stop)
        batch = never_dispatched.file_if_named(svc, batch, never_stop, lambda c: wanted.takes(c, status, code),
                                               time.monotonic() + never_dispatched.CALL_SECONDS)
    lanes_back = (never > 0 and never_stop is not None and wanted.custom_ids is None
                  and wanted.takes(None, *never_ran_shown(never_stop)))
    nothing = f"No request of batch '{batch['id']}' that did not succeed matches {described}."
    # With nothing left to retry at all, a filter given is named too: the caller sees both why it took nothing.
    narrowed = f"No request of batch '{batch['id']}' matches {described}: " if _first_param(wanted) else ""
    if batch["total"] - batch.get("rejected", 0) <= 0:
        raise InvalidRequest(narrowed + f"{'it' if narrowed else 'Batch ' + repr(batch['id'])} holds no request that "
                             "could run, so nothing is left to retry.", code="nothing_to_retry",
                             param=_first_param(wanted))
    if batch["total"] - batch.get("completed", 0) - batch.get("rejected", 0) <= 0:
        raise InvalidRequest(narrowed + f"{'every' if narrowed else 'Every'} request of batch '{batch['id']}' that "
                             "could run succeeded, so nothing is left to retry.", code="nothing_to_retry",
                             param=_first_param(wanted))
    if not lanes_back and _any_item_taken(svc, batch, wanted, time.monotonic() + SCAN_SECONDS) is False:
        raise InvalidRequest(nothing, code="nothing_to_retry", param=_first_param(wanted))
    uncount = {}
    if lanes_back:
        assert never_stop is not None
        uncount = {"unstarted": never, "failed": never if counts_as_failed_unstarted(never_stop) else 0}
    lanes = sorted(m for m, lane in batch["lanes"].items() if lane["next"] < lane["total"]) if lanes_back else []
    walk = {"n": int(batch.get("retry_count", 0)) + 1, **_stored_filter(svc, batch, wanted), "lanes": lanes,
            "old_files": sorted(set((batch.get("result_file_ids") or {}).values())),
            "old_export": bool(batch.get("export_object"))}
    ops = [Account.reserve_unfinished(t, batch["account_id"], batch["total"], s.max_unfinished_batches,
                                      s.max_unfinished_requests)]
    forget = False
    if batch.get("idempotency_key"):  # the key that created it is held again while it runs, if still its
        record = Idempotency.get(t, batch["account_id"], batch["idempotency_key"])
        if record and record.get("batch_id") == batch["id"] and not record.get("deleted") \
                and not (record.get("ttl") and int(record["ttl"]) <= now):
            ops.append(Idempotency.hold(t, batch["account_id"], batch["idempotency_key"], batch["id"]))
        else:
            forget = True
    if claim:
        ops.append(Idempotency.claim_until(t, principal.account_id, claim.key, batch["id"], claim.body_hash, now,
                                           now + window + s.idempotency_retention_seconds))
    ops.insert(0, Batch.retry(t, batch, now=now, expires_at=now + window, window_seconds=window,
                              keep_until=keep_until, retrying=walk, uncount=uncount,
                              parked=None if lanes_back or never == 0 or never_stop is None else never_stop.value,
                              forget_idempotency_key=forget, cap=cap))
    try:
        t.transact(ops)
    except ConditionFailed:
        refusal = _refusal(svc, principal, batch, claim)
        if isinstance(refusal, _Replayed):
            return refusal.batch, True
        raise refusal from None
    analytics.after_retry(svc, batch)  # its time ended is not running time
    try:
        current = carry_on(svc, Batch.get(t, batch["id"]), time.monotonic() + CALL_SECONDS)
    except Throttled:  # the retry is made; the sweeper carries its walk on
        current = Batch.get(t, batch["id"])
    return current or batch, False


def _check_cap(batch: BatchItem, cap: float | None) -> None:
    """A new cap on a retry: only for a batch created with one (its stored requests carry the worst cases a
    cap is kept with), and never below what the batch has spent."""
    if cap is None:
        return
    if batch.get("max_cost_usd") is None:
        raise InvalidRequest(f"Batch '{batch['id']}' was created without a spending cap; a retry can raise a cap, "
                             "not add one.", param="max_cost_usd")
    spent = float(batch.get("committed_usd", batch.get("cost_usd", 0)))
    if cap < spent:
        raise InvalidRequest(f"max_cost_usd {cap} is below what batch '{batch['id']}' has spent already "
                             f"({spent:.6f} USD).", param="max_cost_usd")


def _refusal(svc: Services, principal: Principal, batch: BatchItem, claim: IdempotencyClaim | None) -> Exception:
    """Why the retry's transaction was refused, as the caller is told."""
    if claim and (earlier := replay(svc, principal, claim)) is not None:
        return _Replayed(earlier)
    current = Batch.get(svc.table, batch["id"])
    if current is None or current.get("deleting"):
        return BatchNotFound(batch["id"])
    if current["status"] not in FINAL_BATCH or current.get("retry_count", 0) != batch.get("retry_count", 0):
        return Conflict(f"Batch '{batch['id']}' is being retried by another call.", code="batch_not_ended")
    s = svc.settings
    account = Account.get(svc.table, batch["account_id"]) or {}
    if account.get("unfinished_batches", 0) >= s.max_unfinished_batches:
        return RateLimited(f"You already have {s.max_unfinished_batches} unfinished batches, the most allowed. "
                           "Wait for one to finish.", code="too_many_batches")
    if account.get("unfinished_requests", 0) + batch["total"] > s.max_unfinished_requests:
        return RateLimited(f"Retrying this batch would take your unfinished batch requests past the limit of "
                           f"{s.max_unfinished_requests}.", code="too_many_requests")
    return Conflict(f"Batch '{batch['id']}' changed while it was being retried; try again.", code="batch_changed")


class _Replayed(Exception):
    """A concurrent call with the same Idempotency-Key retried the batch first."""

    def __init__(self, batch: BatchItem) -> None:
        super().__init__(batch["id"])
        self.batch = batch


def _stored_filter(svc: Services, batch: BatchItem, wanted: RetryFilter) -> dict:
    """The walk's filter as the batch item holds it: itself when small, else the key of its S3 copy (a key of
    its own for each call: two racing retries never share one, and the loser's copy goes with the batch)."""
    stored = wanted.stored()
    text = json.dumps(stored, separators=(",", ":")).encode()
    if len(text) <= INLINE_FILTER_BYTES:
        return {"filter": stored}
    key = retry_filter_object(batch["id"], new_token())
    svc.blobs.put(key, text, "application/json")
    return {"filter_object": key}


def walk_filter(svc: Services, walk: dict) -> RetryFilter:
    """The filter of a retry walk: from the batch item, or from S3 (read once per process and kept)."""
    key = walk.get("filter_object")
    if key is None:
        return RetryFilter.of(walk["filter"])
    if key in _filters:
        _filters.move_to_end(key)
        return _filters[key]
    data = svc.blobs.get(key)
    if data is None:  # the batch is being deleted: its walk takes nothing more
        return RetryFilter(custom_ids=frozenset())
    found = RetryFilter.of(json.loads(data))
    _filters[key] = found
    while len(_filters) > _FILTERS_KEPT:
        _filters.popitem(last=False)
    return found


def filter_of(wanted: dict, statuses: dict[str, str]) -> RetryFilter:
    """The filter a retry call's body gives (custom_ids, error_codes, statuses; each None or absent for no
    narrowing). `statuses`: each status as the caller's API names it -> as results show it. An entry no
    request could match because of its length (a custom_id past 512 characters) is a 400 naming it."""
    for status in wanted.get("statuses") or ():
        if status not in statuses:
            raise InvalidRequest(f"statuses: {quoted(status)} is not one of {', '.join(statuses)}.",
                                 param="statuses")
    for name, limit, what in (("custom_ids", MAX_CUSTOM_ID_CHARS, "a custom_id"),
                              ("error_codes", MAX_ERROR_CODE_CHARS, "an error code")):
        for i, value in enumerate(wanted.get(name) or ()):
            if not 1 <= len(value) <= limit:
                raise InvalidRequest(f"{name}[{i}]: {what} has 1 to {limit} characters; this one has {len(value):,} "
                                     f"({quoted(value)}).", param=name)

    def given(name: str) -> frozenset[str] | None:
        return frozenset(wanted[name]) if wanted.get(name) is not None else None

    return RetryFilter(custom_ids=given("custom_ids"), error_codes=given("error_codes"),
                       statuses=frozenset(statuses[s] for s in wanted["statuses"])
                       if wanted.get("statuses") is not None else None)


FILTER_VALUES_NAMED = 5  # values of one filter field a message lists (each clipped); the rest are counted


def described(wanted: dict) -> str:
    """A retry call's filter in the caller's words, for the 400 that says it takes nothing: short, whatever
    the filter's size (the first few values of each field, clipped, and how many more)."""
    given = {k: v for k, v in wanted.items() if v is not None}

    def field(values: object) -> str:
        if not isinstance(values, list):
            return quoted(values)
        shown = ", ".join(quoted(v) for v in values[:FILTER_VALUES_NAMED])
        more = f", and {len(values) - FILTER_VALUES_NAMED:,} more" if len(values) > FILTER_VALUES_NAMED else ""
        return f"[{shown}{more}]"

    return ("the filter " + ", ".join(f"{k}={field(v)}" for k, v in sorted(given.items()))) if given else "the retry"


def _first_param(wanted: RetryFilter) -> str | None:
    return next((name for name in ("custom_ids", "error_codes", "statuses") if getattr(wanted, name) is not None),
                None)


def _any_item_taken(svc: Services, batch: BatchItem, wanted: RetryFilter, deadline: float) -> bool | None:
    """Whether a request item of the batch is one the retry takes; None when `deadline` came first."""
    start = None
    while time.monotonic() < deadline:
        items, start = svc.table.query(
            "pk = :pk AND begins_with(sk, :r)",
            {":pk": batch["pk"], ":r": REQUEST_PREFIX, ":f": RETRIED_STATES[0], ":u": RETRIED_STATES[1]},
            filter_expression="#state IN (:f, :u)", projection="#state, custom_id, #error", consistent=True,
            start=start)
        if any(wanted.takes(item.get("custom_id"), *shown(item)) for item in items):  # type: ignore[arg-type]
            return True
        if start is None:
            return False
    return None


# --- The walk -----------------------------------------------------------------------------------------

def call_walking(batch: BatchItem, now: int) -> bool:
    """Whether the call that retried the batch may still be walking (for CALL_SECONDS from its retry, stamped
    to the second): the sweeper leaves the walk to it until then, rather than race it for every step."""
    return CALL_SECONDS > 0 and now <= int(batch.get("retried_at", 0)) + math.ceil(CALL_SECONDS) + 1


def carry_on(svc: Services, batch: BatchItem | None, deadline: float | None) -> BatchItem | None:
    """Go on with the batch's retry walk until it is over or `deadline` (time.monotonic()) comes; returns the
    batch as it is now. Safe to run in several places at once: each step is fenced on the walk's cursor."""
    while batch is not None and batch.get("retrying"):
        if deadline is not None and time.monotonic() >= deadline:
            break
        batch = _step(svc, batch)
    return batch


def _step(svc: Services, batch: BatchItem) -> BatchItem | None:
    t = svc.table
    walk = batch["retrying"]
    n, cursor = int(walk["n"]), walk.get("cursor")
    if batch.get("stop") or batch.get("deleting"):  # stopped meanwhile: what is not re-queued stays as it ended
        try:
            Batch.end_requeue(t, batch["id"], n)
        except ConditionFailed:
            pass
        return Batch.get(t, batch["id"])
    wanted = walk_filter(svc, walk)
    now = svc.now()
    ops, counters, waiting = [], Counter(), Counter()
    last = cursor
    items = []
    for item in _items_ahead(t, batch["pk"], cursor):
        items.append(item)
        if len(ops) == RETRY_PAGE:
            break  # the step is full: the next one goes on from the last item it looked at
        last = item["sk"]
        if item["state"] not in RETRIED_STATES or not wanted.takes(item.get("custom_id"), *shown(item)):
            continue
        ops.append(Request.requeue(t, item, new_token(), now))
        if item["state"] == RequestState.FAILED.value:
            counters["failed"] -= 1
        else:
            counters["unstarted"] -= 1
            if counts_as_failed_unstarted(unstarted_stop(item.get("error"))):
                counters["failed"] -= 1
        counters["#open"] += 1
        waiting[item["model"]] += 1
    done = not items
    if done:  # what the ending it undoes wrote goes before the walk ends (safe to repeat)
        _drop_old_results(svc, batch, walk)
    ops.append(Batch.requeue_step(t, batch["id"], n, cursor, None if done else last, dict(counters)))
    ops += [op for model, k in waiting.items() if (op := Budget.add(t, model, {"waiting": k})) is not None]
    if done:
        ops += [Lane.create(t, model, batch) for model in walk.get("lanes", [])]
    try:
        t.transact(ops)
    except ConditionFailed:
        pass  # another walker moved this step first, or the batch stopped: read it again
    return Batch.get(t, batch["id"])


def _items_ahead(t: Table, pk: str, cursor: str | None) -> Iterator[RequestItem]:
    """The request items after the walk's cursor, up to READ_PAGE of them, read a step's worth at a time (a
    step of a batch whose requests all failed reads no more than it moves; one of a batch that mostly
    succeeded reads on past the successes it passes over)."""
    start, read = None, 0
    while read < READ_PAGE:
        items, start = t.query("pk = :pk AND sk > :after", {":pk": pk, ":after": cursor or REQUEST_PREFIX},
                               limit=RETRY_PAGE + 1, consistent=True, start=start)
        read += len(items)
        yield from (item for item in items if item["sk"].startswith(REQUEST_PREFIX))  # type: ignore[misc]
        if start is None:
            return


def _drop_old_results(svc: Services, batch: BatchItem, walk: dict) -> None:
    for file_id in walk.get("old_files", []):
        svc.blobs.abort_uploads(file_prefix(file_id))
        svc.blobs.delete_prefix(file_prefix(file_id))
        File.delete(svc.table, file_id)
    if walk.get("old_export"):
        svc.blobs.delete(export_object(batch["id"]))
