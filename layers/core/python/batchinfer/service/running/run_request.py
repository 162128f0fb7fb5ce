"""Running dispatched work: one request (a retry) or one group of first attempts, on its backend. The checks
made before it may run, the call, its outcome, and the writes that settle it, each exactly once.

The worker's entry points are here too: `process` runs what a queue message names; `process_and_pull` then
keeps the model's backend busy with a slot pump (scheduling.pump), handing it `BatchRequests`, this module's
way of running what the pump claims.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import TypeVar

from ... import protocols
from ...catalog import Model
from ...domain import (
    Attempt,
    RequestState,
    Stop,
    backend_key_not_set_error,
    is_retryable,
    new_token,
    next_utc_midnight,
    retry_delay,
    utc_day,
)
from ...jsontext import Text, text_of, to_json
from ...layout import group_key, result_object
from ...ledger import (
    SETTLE_MAX,
    Settlement,
    close_group,
    paused_until,
    position_item,
    queue_message,
    record_position,
    settle,
    settle_many,
    start,
    start_group,
)
from ...records import ApiKey, Batch, Request, analytics, key_account_and_usage
from ...runtime import Services
from ...scheduling.capacity import backend_said_429, over_cap
from ...scheduling.config import scheduler_config
from ...scheduling.pump import SlotPump
from ...storage.dynamo import ConditionFailed, Throttled
from ...storage.secrets import BackendKeyNotSet
from ..accounts import key_problem, may_use_model
from ..lifecycle import settle_batch, stop_batch
from ..steering import pausing, spending_cap
from . import backend_call, request_file
from .backend_call import backend_key

log = logging.getLogger(__name__)
T = TypeVar("T")


def _stopped(svc: Services, batch: dict, stop: Stop) -> Stop:
    """Stop the batch for this reason, or learn the reason another caller stopped it with first."""
    if stop_batch(svc, batch, stop):
        return stop
    current = Batch.get(svc.table, batch["id"]) or {}
    return Stop(current["stop"]) if current.get("stop") else stop


def _precheck(svc: Services, req: dict, batch: dict, account_read: tuple | None = None
              ) -> tuple[Settlement, Stop | None] | None:
    """Checks made before every attempt: (what to record instead, the batch's stop) when the request must
    not run now, or None when it may run. `account_read`: (day, account, usage) as the claim of a group run at
    once has just read them (strongly consistent); the key is read again whatever (a revoked key stops the
    batch), and the account too when the day has turned since."""
    now = svc.now()
    never_ran = int(req.get("attempt", 0)) == 0

    def not_run(stop: Stop) -> tuple[Settlement, Stop]:
        # A request that never ran takes its batch's fate; one that ran before keeps its last error.
        to = RequestState.UNSTARTED if never_ran else RequestState.FAILED
        return Settlement(to=to, error=None if never_ran else req.get("error")), stop

    if batch.get("stop"):
        return not_run(Stop(batch["stop"]))
    if never_ran and now >= batch["expires_at"]:  # the completion window stops requests from starting
        return not_run(_stopped(svc, batch, Stop.EXPIRE))
    if batch.get("paused_at"):  # back to waiting, holding no slot, put off until a resume (or the window's end)
        return Settlement(to=RequestState.WAITING, retry_at=paused_until(batch, now), error=req.get("error"),
                          uncounted=True), None
    day = utc_day(now)
    if account_read is not None and account_read[0] == day and account_read[1] is not None:
        _, account, usage = account_read
        key_item = ApiKey.get(svc.table, batch["key_hash"])
    else:
        key_item, account, usage = key_account_and_usage(svc.table, batch["key_hash"], batch["account_id"], day)
    if key_problem(svc, key_item, account):
        return not_run(_stopped(svc, batch, Stop.FAIL))
    if not account.get("batch_access"):
        recheck = scheduler_config(svc.settings).access_recheck_seconds
        return Settlement(to=RequestState.WAITING, retry_at=now + recheck, error=req.get("error")), None
    if float((usage or {}).get("cost_usd", 0)) >= float(account.get("daily_quota_usd", 0)):
        return Settlement(to=RequestState.WAITING, retry_at=next_utc_midnight(now), error=req.get("error")), None
    model = svc.catalog.lookup(req["model"])
    if model is None or model.backend is None or not may_use_model(account, req["model"]):
        return Settlement(to=RequestState.FAILED, error={
            "code": "model_not_found", "message": f"Model '{req['model']}' is gone, or this key may no longer use it.",
            "status": 404}), None
    if _backend_key_not_set(svc, model):  # failed at once, unsent: retrying cannot help until the operator acts
        return Settlement(to=RequestState.FAILED, error=backend_key_not_set_error(model.id)), None
    return None


def _backend_key_not_set(svc: Services, model: Model) -> bool:
    """Whether the model's secret still holds the deploy's placeholder (never sent as a key)."""
    try:
        backend_key(svc, model)
    except BackendKeyNotSet:
        return True
    return False


def _outcome(svc: Services, req: dict, batch_id: str, model: Model, attempt: Attempt) -> Settlement:
    """What an answered attempt records, with what it adds to its batch's analytics."""
    outcome = _outcome_of(svc, req, batch_id, model, attempt)
    code = (outcome.error or {}).get("code") if outcome.to is not RequestState.COMPLETED else None
    outcome.attempt = analytics.attempt_tally(attempt.latency_ms, code, retry=analytics.is_retry(req))
    return outcome


def answered_outcome(svc: Services, req: dict, batch_id: str, model: Model, attempt: Attempt) -> Settlement:
    """What an answered attempt records (at the model's price): a direct call's, or a provider batch tier's
    answer to the request (service.offloading), which lands the same way."""
    return _outcome(svc, req, batch_id, model, attempt)


def _outcome_of(svc: Services, req: dict, batch_id: str, model: Model, attempt: Attempt) -> Settlement:
    s = svc.settings
    cost = backend_call.cost_of(model, attempt)
    common = {"input_tokens": attempt.input_tokens, "output_tokens": attempt.output_tokens,
              "cached_tokens": attempt.cached_tokens, "reasoning_tokens": attempt.reasoning_tokens, "cost_usd": cost,
              "cost_unknown": 0 if attempt.cost_known else 1,
              "cache_saved_usd": backend_call.cache_saving_of(model, attempt)}
    if attempt.ok:
        head = {"status_code": attempt.status_code, "request_id": attempt.request_id or f"req_{req['token']}"}
        # The body is kept as the text the backend sent (a string, never DynamoDB numbers, which would turn
        # 12500.0 into 12500): the result reads back byte for byte.
        body = text_of(attempt.body or {})
        raw = to_json({**head, "body": Text(attempt.body or {}, body)}).encode()
        if len(raw) > s.max_result_bytes:
            return Settlement(to=RequestState.FAILED, error={
                "code": "result_too_large", "status": attempt.status_code,
                "message": f"The response was {len(raw)} bytes, larger than a batch result may be "
                           f"({s.max_result_bytes} bytes)."}, **common)
        if len(raw) > s.inline_result_bytes:  # a DynamoDB item holds at most 400 KB: large bodies go to S3
            key = result_object(batch_id, req["index"])
            svc.blobs.put(key, body.encode(), "application/json")
            return Settlement(to=RequestState.COMPLETED, response=head, response_object=key, result_bytes=len(raw),
                              **common)
        return Settlement(to=RequestState.COMPLETED, response={**head, "body_text": body}, result_bytes=len(raw),
                          **common)
    error = attempt.error(s.max_error_body_bytes)
    if "request_id" in error:  # an error answer: named as a success would be when the backend names none
        error["request_id"] = attempt.request_id or f"req_{req['token']}"
    if is_retryable(attempt.status_code) and req["attempt"] < s.max_attempts:
        delay = retry_delay(req["attempt"], s.retry_base_seconds, s.retry_max_seconds, random.Random())
        if attempt.retry_after:
            delay = max(delay, min(attempt.retry_after, s.retry_max_seconds))
        return Settlement(to=RequestState.WAITING, error=error, retry_at=svc.now() + max(1, round(delay)), **common)
    return Settlement(to=RequestState.FAILED, error=error, **common)


def _settle_without_running(svc: Services, req: dict, message: dict, seen: dict | None = None) -> str:
    """Record why a dispatched request did not run (its batch stopped, it must wait, ...). `seen` receives
    the batch as read, for the caller to use if the request may run; if it already holds the batch (read
    a moment ago by the claim), the first check uses that copy: start() is fenced against a stop anyway."""
    for attempt in range(3):
        batch = dict(seen) if seen and attempt == 0 else Batch.get(svc.table, req["batch_id"])
        if batch is None:
            return "stale"
        early = _precheck(svc, req, batch)
        if early is None:
            if seen is not None:
                seen.update(batch)
            return "may_run"
        outcome, stop = early
        try:
            settle(svc, req, outcome, stop)
            if batch.get("paused_at") and outcome.to is RequestState.WAITING:  # put back while paused
                pausing.after_wait(svc, batch["id"], [req["index"]])
            return outcome.to.value
        except ConditionFailed:
            req = Request.get(svc.table, req["batch_id"], req["index"])
            if not req or req["state"] != RequestState.DISPATCHED.value or req["token"] != message["token"]:
                return "stale"
    return "stale"


async def _attempt(model: Model, batch: dict, body: dict, key: str | None, timeout: float) -> Attempt:
    """The batch request's attempt, through the very function an interactive call uses."""
    began = time.monotonic()
    attempt = await backend_call.attempt(model, batch["endpoint"], body, key, timeout,
                                      **protocols.of_batch(batch).backend_options(batch))
    return replace(attempt, latency_ms=1000 * (time.monotonic() - began))  # for the batch's analytics


async def process(svc: Services, message: dict, claimed: dict | None = None, batch: dict | None = None) -> Counter:
    """Run what a queue message names: a group of first attempts, or one request's retry (or a group or
    request this worker just `claimed`, with its `batch` as the claim read it). Returns how many requests
    ended how (for metrics, logs and tests)."""
    if "group" in message:
        return await process_group(svc, message, claimed, batch)
    return Counter([await _process_request(svc, message, claimed, batch)])


async def _process_request(svc: Services, message: dict, claimed: dict | None, batch: dict | None) -> str:
    started = await asyncio.to_thread(start_retry, svc, message, claimed, batch)
    if isinstance(started, str):
        return started
    attempt = await _attempt(started.model, started.batch, started.body, started.key,
                             svc.settings.backend_timeout_seconds)
    return await asyncio.to_thread(finish_retry, svc, started, attempt)


@dataclass
class StartedRetry:
    """A retried request that passed its checks and started: what its call needs, and what its outcome's
    write needs after it."""

    running: dict
    batch: dict
    body: dict
    model: Model
    key: str | None


def start_retry(svc: Services, message: dict, claimed: dict | None = None, batch: dict | None = None
                ) -> StartedRetry | str:
    """The steps of a retried request before its call: the checks made before every attempt, then its start
    (fenced against its batch stopping). Returns it started, or what happened instead (for metrics)."""
    batch_id, index = message["batch_id"], int(message["index"])
    req = claimed or Request.get(svc.table, batch_id, index)
    if not req or req["state"] != RequestState.DISPATCHED.value or req["token"] != message["token"]:
        return "stale"  # a duplicate delivery, or the lease was recovered and the request moved on
    if claimed is None and over_cap(svc, req["model"]):
        # Dispatched within the cap, delivered after it shrank (interactive load came, the backend said 429):
        # it does not start over the cap; back to waiting, due at once, its slot given back.
        _hand_back_request(svc, req)
        return "handed_back"
    batch = dict(batch or {})
    decided = _settle_without_running(svc, req, message, batch)
    if decided != "may_run":
        return decided
    for tries in range(START_ATTEMPTS):
        try:
            running = start(svc, req)
            break
        except ConditionFailed:
            # The batch changed between the check and the start (it stopped, was paused, its window closed):
            # record that instead, or start again when a resume came too and the request is still ours.
            current = Request.get(svc.table, batch_id, index)
            if (not current or current["state"] != RequestState.DISPATCHED.value
                    or current["token"] != message["token"]):
                return "stale"
            decided = _settle_without_running(svc, current, message)
            if decided != "may_run" or tries == START_ATTEMPTS - 1:
                return "stale" if decided == "may_run" else decided
            req = current
    model = svc.catalog.get(req["model"])
    body = request_file.bodies(svc, batch_id, [(int(req["offset"]), int(req["length"]))])[0]
    return StartedRetry(running=running, batch=batch, body=body, model=model, key=backend_key(svc, model))


def start_claimed_retries(svc: Services, running: list[dict], batch: dict, account_read: tuple | None = None
                          ) -> tuple[list[StartedRetry], Counter]:
    """Retries of one batch a pump claimed running (`ledger.claim_retries_running`): the checks made before
    every attempt, once for them all as for a group's members (`account_read`: the account as the claim read
    it), then their bodies in one read. Returns (those that may run, started; what happened to the others):
    when the checks refuse, each is recorded as a dispatched retry would be, its attempt not counted."""
    if _precheck(svc, _unclaimed(running[0]), batch, account_read) is not None:
        return [], Counter(_settle_claimed_without_running(svc, req, batch) for req in running)
    model = svc.catalog.get(running[0]["model"])
    key = backend_key(svc, model)
    bodies = _bodies(svc, {"batch_id": batch["id"],
                           "positions": [[r["index"], r.get("custom_id"), r["offset"], r["length"]] for r in running]})
    return [StartedRetry(running=req, batch=batch, body=body, model=model, key=key)
            for req, body in zip(running, bodies, strict=True)], Counter()


def _unclaimed(req: dict) -> dict:
    """A retry claimed running as it was before its claim counted its attempt."""
    return {**req, "attempt": int(req["attempt"]) - 1}


def _settle_claimed_without_running(svc: Services, req: dict, batch: dict) -> str:
    """Record why a retry claimed running must not run (the checks made before every attempt), its attempt not
    counted: what it became. Decided again on a fresh read when the batch was paused or resumed meanwhile (a
    request put back while paused is written only while its batch still is), so none is left running."""
    for _ in range(3):
        early = _precheck(svc, _unclaimed(req), batch)
        outcome, stop = early or (Settlement(to=RequestState.WAITING, error=req.get("error"), retry_at=svc.now()),
                                  None)
        try:
            settle(svc, req, replace(outcome, extra={**outcome.extra, "attempt": int(req["attempt"]) - 1}), stop)
        except ConditionFailed:
            batch = Batch.get(svc.table, req["batch_id"])
            if batch is None:
                return "stale"
            continue
        if batch.get("paused_at") and outcome.to is RequestState.WAITING:  # put back while paused
            pausing.after_wait(svc, batch["id"], [req["index"]])
        return outcome.to.value
    return "stale"  # it moved meanwhile (its lease recovered)


def finish_retries(svc: Services, answered: list[tuple[StartedRetry, Attempt]]) -> Counter:
    """Write started retries' answered attempts: those of one batch together (`settle_many`: one transaction
    and one entry of the finished-order log, not one each racing the others for the log's next number), each
    alone when one of them lost its lease. What they became."""
    by_batch: dict[str, list[tuple[dict, Settlement]]] = {}
    for started, attempt in answered:
        if attempt.status_code == 429:
            backend_said_429(svc, started.model)
        running = started.running
        by_batch.setdefault(running["batch_id"], []).append(
            (running, _outcome(svc, running, running["batch_id"], started.model, attempt)))
    outcomes: Counter = Counter()
    for settled in by_batch.values():
        for at in range(0, len(settled), SETTLE_MAX):
            part = settled[at:at + SETTLE_MAX]
            try:
                settle_many(svc, part)
                outcomes.update(outcome.to.value for _, outcome in part)
                continue
            except ConditionFailed:
                pass
            for running, outcome in part:
                try:
                    settle(svc, running, outcome)
                    outcomes[outcome.to.value] += 1
                except ConditionFailed:  # as in finish_retry
                    log.warning("request %s/%s lost its lease before its outcome was recorded",
                                running["batch_id"], running["index"])
                    outcomes["lease_lost"] += 1
    return outcomes


def finish_retry(svc: Services, started: StartedRetry, attempt: Attempt) -> str:
    """Write a started retry's answered attempt (fenced on its lease); what it became."""
    model, running = started.model, started.running
    if attempt.status_code == 429:
        backend_said_429(svc, model)
    outcome = _outcome(svc, running, running["batch_id"], model, attempt)
    try:
        settle(svc, running, outcome)
    except ConditionFailed:
        # The lease ran out while the backend worked; the sweeper already counted this attempt's cost as
        # unknown and put the request back, so this answer is dropped rather than recorded twice.
        log.warning("request %s/%s lost its lease before its outcome was recorded", running["batch_id"],
                    running["index"])
        return "lease_lost"
    _after_capped_settle(svc, running)
    return outcome.to.value


def _hand_back_request(svc: Services, req: dict) -> None:
    """A dispatched request that did not start, or a retry claimed running whose call never started: waiting
    again, due at once (it keeps its last error; the attempt its claim counted is not)."""
    uncounted = {"attempt": int(req["attempt"]) - 1} if req["state"] == RequestState.RUNNING.value else {}
    try:
        settle(svc, req, Settlement(to=RequestState.WAITING, error=req.get("error"), retry_at=svc.now(),
                                    extra=uncounted))
    except ConditionFailed:
        pass  # recovered meanwhile


def _close_without_running(svc: Services, group: dict, batch: dict | None,
                           account_read: tuple | None = None) -> Counter:
    """A group that must not run now (its batch stopped, its owner lost access, ...): every member gets the
    same outcome, written with the group's end in one transaction. Retried on a fresh read if the batch
    changed meanwhile. `account_read`: the account as the claim that made the group read it (`_precheck`)."""
    for _ in range(3):
        batch = batch or Batch.get(svc.table, group["batch_id"])
        if batch is None:
            return Counter(stale=1)
        early = _precheck(svc, {"attempt": 0, "model": group["model"]}, batch, account_read)
        account_read = None  # a second look reads everything afresh
        if early is None:
            return Counter()  # it may run after all
        outcome, stop = early
        items = [position_item(svc, group, p, outcome, attempt=0, stop=stop) for p in group["positions"]]
        try:
            close_group(svc, group, [], items)
            if batch.get("paused_at") and outcome.to is RequestState.WAITING:  # put back while paused
                pausing.after_wait(svc, batch["id"], [item["index"] for item in items])
            return Counter({outcome.to.value: len(items)})
        except ConditionFailed:
            current = svc.table.get(group["pk"], group["sk"])
            if not current or current["token"] != group["token"]:
                return Counter(stale=1)
            batch = None
    return Counter(stale=1)


START_ATTEMPTS = 3  # starts of one group (or retry) refused by its batch changing, each decided again on a fresh read


def start_or_close(svc: Services, group: dict, starts: Callable[[Services, dict], T]) -> T | Counter:
    """Start a dispatched group (`starts`: how), or record why it must not run. A start refused because its
    batch changed since the check (stopped, paused, its window closed) is decided again on a fresh read:
    closed without running when the batch still refuses it, started again when the group is still ours
    (dispatched with our token) and the batch lets it start (a pause and a resume both came between the check
    and the start), so that it does not sit dispatched until its lease runs out. Returns what `starts`
    returned, or what happened instead."""
    for _ in range(START_ATTEMPTS):
        try:
            return starts(svc, group)
        except ConditionFailed:
            pass
        current = svc.table.get(group["pk"], group["sk"])
        if not current or current["state"] != RequestState.DISPATCHED.value or current["token"] != group["token"]:
            return Counter(stale=1)  # recovered, or closed by another look
        decided = _close_without_running(svc, group, None)
        if decided:
            return decided
    return Counter(stale=1)  # kept losing: its lease's recovery sends it back


def _bodies(svc: Services, group: dict) -> list[dict]:
    """The members' request bodies, read together where they lie close in the batch's file."""
    return request_file.bodies(svc, group["batch_id"], [(int(p[2]), int(p[3])) for p in group["positions"]])


async def process_group(svc: Services, message: dict, claimed: dict | None = None,
                        batch: dict | None = None) -> Counter:
    """Run a group's requests at once (its slots are already taken), write each outcome as it comes, then
    close the group. A duplicate delivery or a recovered lease loses a condition and records nothing."""
    pk, sk = group_key(message["batch_id"], int(message["group"]))
    group = claimed or await asyncio.to_thread(svc.table.get, pk, sk)
    # A group this worker claimed to run itself was claimed running; one from the queue must be dispatched.
    expected = RequestState.RUNNING if claimed and claimed["state"] == RequestState.RUNNING else RequestState.DISPATCHED
    if not group or group["state"] != expected.value or group["token"] != message["token"]:
        return Counter(stale=1)
    batch = dict(batch) if batch else await asyncio.to_thread(Batch.get, svc.table, message["batch_id"])
    decided = await asyncio.to_thread(_close_without_running, svc, group, batch)
    if decided:
        return decided
    if expected is RequestState.RUNNING:
        running = group
    else:
        started = await asyncio.to_thread(start_or_close, svc, group, start_group)
        if isinstance(started, Counter):
            return started
        running = started
    model = svc.catalog.get(group["model"])
    bodies = await asyncio.to_thread(_bodies, svc, running)
    key = await asyncio.to_thread(backend_key, svc, model)

    async def run(position: list, body: dict) -> tuple[Attempt, dict | None]:
        attempt = await _attempt(model, batch, body, key, svc.settings.backend_timeout_seconds)
        return attempt, await asyncio.to_thread(_record, svc, running, position, model, attempt)

    ran = await asyncio.gather(*(run(p, b) for p, b in zip(running["positions"], bodies, strict=True)),
                               return_exceptions=True)
    for failure in ran:  # the others' outcomes are written; the lease recovers the rest of the group
        if isinstance(failure, BaseException):
            raise failure
    if any(attempt.status_code == 429 for attempt, _ in ran):
        await asyncio.to_thread(backend_said_429, svc, model)
    items = [item for _, item in ran if item is not None]
    if len(items) < len(ran):
        log.warning("group %s/%s lost its lease before all its outcomes were recorded", pk, sk)
        return Counter(lease_lost=len(ran))
    try:
        await asyncio.to_thread(close_group, svc, running, items)
    except ConditionFailed:  # recovered meanwhile: the sweeper counted these outcomes from their items
        return Counter(lease_lost=len(ran))
    await asyncio.to_thread(_after_capped_settle, svc, running)
    return Counter(item["state"] for item in items)


def _after_capped_settle(svc: Services, unit: dict) -> None:
    """A settled request or group of a batch with a spending cap (its claim committed a worst case): if
    nothing of the batch runs now and its next request cannot fit, it stops here rather than at the
    sweeper's next look."""
    if unit.get("worst_usd") is not None:
        try:
            spending_cap.stop_if_reached(svc, unit["batch_id"])
        except Throttled:  # what settled stays settled; the sweeper's next look stops the batch
            log.warning("throttled while looking at batch %s's spending cap", unit["batch_id"])


def _record(svc: Services, group: dict, position: list, model: Model, attempt: Attempt) -> dict | None:
    """Write a group member's outcome (one conditional put): its item, or None when the group's lease ran out
    and the sweeper recovered it first."""
    token = new_token()
    outcome = _outcome(svc, {"index": position[0], "attempt": 1, "token": token}, group["batch_id"], model, attempt)
    item = position_item(svc, group, position, outcome, attempt=1, token=token)
    try:
        record_position(svc, item)
    except ConditionFailed:
        return None
    return item


class BatchRequests:
    """How the slot pump runs what it claims (scheduling.claimed_work.RunsRequests): this module's steps, each looked
    up when it is taken."""

    def __init__(self, svc: Services) -> None:
        self.svc = svc

    async def call(self, model: Model, batch: dict, body: dict, api_key: str | None) -> Attempt:
        return await _attempt(model, batch, body, api_key, self.svc.settings.backend_timeout_seconds)

    async def run_retry(self, retry: dict) -> Counter:
        return await process(self.svc, queue_message(retry), claimed=retry)

    def start_retry(self, retry: dict) -> StartedRetry | str:
        return start_retry(self.svc, queue_message(retry), claimed=retry)

    def start_claimed_retries(self, running: list[dict], batch: dict, account_read: tuple | None = None
                              ) -> tuple[list[StartedRetry], Counter]:
        return start_claimed_retries(self.svc, running, batch, account_read)

    def finish_retries(self, answered: list[tuple[StartedRetry, Attempt]]) -> Counter:
        return finish_retries(self.svc, answered)

    def api_key(self, model: Model) -> str | None:
        return backend_key(self.svc, model)

    def close_without_running(self, group: dict, batch: dict | None, account_read: tuple | None = None) -> Counter:
        return _close_without_running(self.svc, group, batch, account_read)

    def start_or_close(self, group: dict, starts: Callable[[Services, dict], T]) -> T | Counter:
        return start_or_close(self.svc, group, starts)

    def bodies(self, group: dict) -> list[dict]:
        return _bodies(self.svc, group)

    def record(self, group: dict, position: list, model: Model, attempt: Attempt) -> dict | None:
        return _record(self.svc, group, position, model, attempt)

    def hand_back_retry(self, retry: dict) -> None:
        _hand_back_request(self.svc, retry)

    def close_group(self, group: dict, written: list[dict], handed_back: tuple[dict, ...]) -> None:
        close_group(self.svc, group, written, handed_back)
        _after_capped_settle(self.svc, group)

    def stop_at_cap(self, batch_id: str) -> None:
        spending_cap.stop_if_reached(self.svc, batch_id)

    def settle_batch(self, batch_id: str) -> None:
        settle_batch(self.svc, batch_id)


def slot_pump(svc: Services, model: Model, deadline: float) -> SlotPump:
    """A slot pump on the model until `deadline` (time.monotonic()) that runs what it claims here."""
    return SlotPump(svc, model, deadline, BatchRequests(svc))


async def process_and_pull(svc: Services, message: dict, seconds_left: float) -> Counter:
    """Run the message's work, then keep the model's backend busy (scheduling.pump.SlotPump): while time is
    left, hold free slots of the model and refill each one the moment its call answers, from work claimed
    ahead, without a round trip through the dispatcher and the queue."""
    margin = scheduler_config(svc.settings).end_margin_seconds
    deadline = time.monotonic() + seconds_left - svc.settings.backend_timeout_seconds - margin
    model = svc.catalog.lookup(message["model"])
    if (not svc.settings.worker_pull or model is None or time.monotonic() >= deadline
            or await asyncio.to_thread(_backend_key_not_set, svc, model)):  # its requests fail unsent: no pump
        return await process(svc, message)
    pump = slot_pump(svc, model, deadline)
    # A group's slots become the pump's at its start (no slot goes back to the budget between its members
    # and the next work); a retry runs on its own beside the pump, which takes what the budget has free at
    # once (the dispatcher sends one retry per pump to start: the pump claims the others).
    if "group" in message:
        outcome = await pump.adopt(message) or Counter()
        outcome.update(await pump.run(svc.settings.worker_pull_limit))
        return outcome
    both = await asyncio.gather(process(svc, message), pump.run(svc.settings.worker_pull_limit),
                                return_exceptions=True)  # neither is left running when the other fails
    for failure in both:
        if isinstance(failure, BaseException):
            raise failure
    return both[0] + both[1]
