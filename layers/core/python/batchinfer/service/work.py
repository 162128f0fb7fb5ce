"""The worker: runs dispatched requests (a group at once, or one retry) on their backend and records each
outcome exactly once."""

from __future__ import annotations

import asyncio
import json
import logging
import random
import threading
import time
from collections import Counter

from ..catalog import Model
from ..domain import Attempt, RequestState, Stop, is_retryable, new_token, next_utc_midnight, retry_delay, utc_day
from ..layout import group_key, requests_object, result_object
from ..ledger import (
    Settlement,
    close_group,
    position_item,
    queue_message,
    record_position,
    settle,
    start,
    start_group,
)
from ..providers import call_backend
from ..records import Batch, Budget, Request, key_account_and_usage
from ..runtime import Services
from ..storage.dynamo import ConditionFailed
from ..storage.secrets import secret_value
from .accounts import key_problem, may_use_model
from .capacity import backend_throttled
from .dispatch import Dispatcher
from .lifecycle import stop_batch

log = logging.getLogger(__name__)
ACCESS_RECHECK_SECONDS = 60


def backend_key(svc: Services, model: Model) -> str | None:
    backend = model.backend
    if backend is None:
        return None
    secret = svc.settings.model_secrets.get(model.id) or backend.api_key_secret
    if secret:
        return secret_value(secret, svc.settings.aws_endpoint_url, svc.settings.aws_region)
    return svc.env.get(backend.api_key_env) if backend.api_key_env else None


def _stopped(svc: Services, batch: dict, stop: Stop) -> Stop:
    """Stop the batch for this reason, or learn the reason another caller stopped it with first."""
    if stop_batch(svc, batch, stop):
        return stop
    current = Batch.get(svc.table, batch["id"]) or {}
    return Stop(current["stop"]) if current.get("stop") else stop


def _precheck(svc: Services, req: dict, batch: dict) -> tuple[Settlement, Stop | None] | None:
    """Checks made before every attempt: (what to record instead, the batch's stop) when the request must
    not run now, or None when it may run."""
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
    key_item, account, usage = key_account_and_usage(svc.table, batch["key_hash"], batch["account_id"], utc_day(now))
    if key_problem(svc, key_item, account):
        return not_run(_stopped(svc, batch, Stop.FAIL))
    if not account.get("batch_access"):
        return Settlement(to=RequestState.WAITING, retry_at=now + ACCESS_RECHECK_SECONDS, error=req.get("error")), None
    if float((usage or {}).get("cost_usd", 0)) >= float(account.get("daily_quota_usd", 0)):
        return Settlement(to=RequestState.WAITING, retry_at=next_utc_midnight(now), error=req.get("error")), None
    model = svc.catalog.lookup(req["model"])
    if model is None or model.backend is None or not may_use_model(account, req["model"]):
        return Settlement(to=RequestState.FAILED, error={
            "code": "model_not_found", "message": f"Model '{req['model']}' is gone, or this key may no longer use it.",
            "status": 404}), None
    return None


def _outcome(svc: Services, req: dict, batch_id: str, model: Model, attempt: Attempt) -> Settlement:
    s = svc.settings
    cost = model.cost_usd(attempt.input_tokens, attempt.output_tokens) if attempt.cost_known else 0.0
    common = {"input_tokens": attempt.input_tokens, "output_tokens": attempt.output_tokens, "cost_usd": cost,
              "cost_unknown": 0 if attempt.cost_known else 1}
    if attempt.ok:
        response = {"status_code": attempt.status_code, "request_id": attempt.request_id or f"req_{req['token']}",
                    "body": attempt.body}
        raw = json.dumps(response, separators=(",", ":")).encode()
        if len(raw) > s.max_result_bytes:
            return Settlement(to=RequestState.FAILED, error={
                "code": "result_too_large", "status": attempt.status_code,
                "message": f"The response was {len(raw)} bytes, larger than a batch result may be "
                           f"({s.max_result_bytes} bytes)."}, **common)
        if len(raw) > s.inline_result_bytes:  # a DynamoDB item holds at most 400 KB: large results go to S3
            key = result_object(batch_id, req["index"])
            svc.blobs.put(key, raw, "application/json")
            return Settlement(to=RequestState.COMPLETED, response_object=key, result_bytes=len(raw), **common)
        return Settlement(to=RequestState.COMPLETED, response=response, result_bytes=len(raw), **common)
    error = attempt.error()
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
            return outcome.to.value
        except ConditionFailed:
            req = Request.get(svc.table, req["batch_id"], req["index"])
            if not req or req["state"] != RequestState.DISPATCHED.value or req["token"] != message["token"]:
                return "stale"
    return "stale"


async def _attempt(model: Model, batch: dict, body: dict, key: str | None, timeout: float) -> Attempt:
    try:
        return await call_backend(model, batch["endpoint"], body, key, timeout, version=batch.get("anthropic_version"))
    except Exception as error:  # a bug or an odd answer must not strand the request until its lease ends
        log.exception("backend call failed")
        return Attempt(status_code=None, cost_known=False, message=f"The call failed: {type(error).__name__}")


async def process(svc: Services, message: dict, claimed: dict | None = None, batch: dict | None = None) -> Counter:
    """Run what a queue message names: a group of first attempts, or one request's retry (or a group or
    request this worker just `claimed`, with its `batch` as the claim read it). Returns how many requests
    ended how (for metrics, logs and tests)."""
    if "group" in message:
        return await process_group(svc, message, claimed, batch)
    return Counter([await _process_request(svc, message, claimed, batch)])


async def _process_request(svc: Services, message: dict, claimed: dict | None, batch: dict | None) -> str:
    batch_id, index = message["batch_id"], int(message["index"])
    req = claimed or await asyncio.to_thread(Request.get, svc.table, batch_id, index)
    if not req or req["state"] != RequestState.DISPATCHED.value or req["token"] != message["token"]:
        return "stale"  # a duplicate delivery, or the lease was recovered and the request moved on
    batch = dict(batch or {})
    decided = await asyncio.to_thread(_settle_without_running, svc, req, message, batch)
    if decided != "may_run":
        return decided
    try:
        running = await asyncio.to_thread(start, svc, req)
    except ConditionFailed:
        # The batch stopped (or its window closed) between the check and the start: record that instead.
        current = await asyncio.to_thread(Request.get, svc.table, batch_id, index)
        if not current or current["state"] != RequestState.DISPATCHED.value or current["token"] != message["token"]:
            return "stale"
        decided = await asyncio.to_thread(_settle_without_running, svc, current, message)
        return "stale" if decided == "may_run" else decided
    model = svc.catalog.get(req["model"])
    body = json.loads(await asyncio.to_thread(svc.blobs.get_range, requests_object(batch_id), req["offset"],
                                              req["length"]))["body"]
    key = await asyncio.to_thread(backend_key, svc, model)
    attempt = await _attempt(model, batch, body, key, svc.settings.backend_timeout_seconds)
    if attempt.status_code == 429:
        await asyncio.to_thread(_backend_said_429, svc, model)
    outcome = _outcome(svc, running, batch_id, model, attempt)
    try:
        await asyncio.to_thread(settle, svc, running, outcome)
    except ConditionFailed:
        # The lease ran out while the backend worked; the sweeper already counted this attempt's cost as
        # unknown and put the request back, so this answer is dropped rather than recorded twice.
        log.warning("request %s/%s lost its lease before its outcome was recorded", batch_id, index)
        return "lease_lost"
    return outcome.to.value


def _backend_said_429(svc: Services, model: Model) -> None:
    """The backend is past its capacity: batch work on it backs off."""
    budget = Budget.get(svc.table, model.id, consistent=False)
    backend_throttled(svc, model, int((budget or {}).get("in_flight", 1)))


def _close_without_running(svc: Services, group: dict, batch: dict | None) -> Counter:
    """A group that must not run now (its batch stopped, its owner lost access, ...): every member gets the
    same outcome, written with the group's end in one transaction. Retried on a fresh read if the batch
    changed meanwhile."""
    for _ in range(3):
        batch = batch or Batch.get(svc.table, group["batch_id"])
        if batch is None:
            return Counter(stale=1)
        early = _precheck(svc, {"attempt": 0, "model": group["model"]}, batch)
        if early is None:
            return Counter()  # it may run after all
        outcome, stop = early
        items = [position_item(svc, group, p, outcome, attempt=0, stop=stop) for p in group["positions"]]
        try:
            close_group(svc, group, [], items)
            return Counter({outcome.to.value: len(items)})
        except ConditionFailed:
            current = svc.table.get(group["pk"], group["sk"])
            if not current or current["token"] != group["token"]:
                return Counter(stale=1)
            batch = None
    return Counter(stale=1)


def _bodies(svc: Services, group: dict) -> list[dict]:
    """The members' request bodies: one ranged read when they lie close together in the batch's file."""
    positions = group["positions"]
    low = min(p[2] for p in positions)
    high = max(p[2] + p[3] for p in positions)
    key = requests_object(group["batch_id"])
    if high - low <= 4 * sum(p[3] for p in positions):
        span = svc.blobs.get_range(key, low, high - low)
        return [json.loads(span[p[2] - low:p[2] - low + p[3]])["body"] for p in positions]
    return [json.loads(svc.blobs.get_range(key, p[2], p[3]))["body"] for p in positions]


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
        try:
            running = await asyncio.to_thread(start_group, svc, group)
        except ConditionFailed:  # the batch stopped (or its window closed) since the check: record that instead
            return await asyncio.to_thread(_close_without_running, svc, group, None) or Counter(stale=1)
    model = svc.catalog.get(group["model"])
    bodies = await asyncio.to_thread(_bodies, svc, running)
    key = await asyncio.to_thread(backend_key, svc, model)

    async def run(position: list, body: dict) -> tuple[Attempt, dict | None]:
        attempt = await _attempt(model, batch, body, key, svc.settings.backend_timeout_seconds)
        token = new_token()
        outcome = await asyncio.to_thread(_outcome, svc, {"index": position[0], "attempt": 1, "token": token},
                                          running["batch_id"], model, attempt)
        item = position_item(svc, running, position, outcome, attempt=1, token=token)
        try:
            await asyncio.to_thread(record_position, svc, item)
        except ConditionFailed:
            return attempt, None  # the lease ran out and the sweeper recovered this request first
        return attempt, item

    ran = await asyncio.gather(*(run(p, b) for p, b in zip(running["positions"], bodies, strict=True)),
                               return_exceptions=True)
    for failure in ran:  # the others' outcomes are written; the lease recovers the rest of the group
        if isinstance(failure, BaseException):
            raise failure
    if any(attempt.status_code == 429 for attempt, _ in ran):
        await asyncio.to_thread(_backend_said_429, svc, model)
    items = [item for _, item in ran if item is not None]
    if len(items) < len(ran):
        log.warning("group %s/%s lost its lease before all its outcomes were recorded", pk, sk)
        return Counter(lease_lost=len(ran))
    try:
        await asyncio.to_thread(close_group, svc, running, items)
    except ConditionFailed:  # recovered meanwhile: the sweeper counted these outcomes from their items
        return Counter(lease_lost=len(ran))
    return Counter(item["state"] for item in items)


_pullers = threading.local()  # one Dispatcher per thread: its caches and turn are not shared


def _claim_next(svc: Services, model_id: str, limit: int) -> list[tuple[dict, dict | None]]:
    """The model's next due work (retries first, then batches in turn), claimed for this worker to run
    directly, each with its batch as the claim read it (None for a retry)."""
    puller = getattr(_pullers, "dispatcher", None)
    if puller is None or puller.svc is not svc:
        puller = _pullers.dispatcher = Dispatcher(svc, runs_what_it_claims=True)
    model = svc.catalog.lookup(model_id)
    if model is None:
        return []
    return [(unit, puller.batches_seen.get(unit["batch_id"])) for unit in puller.claim(model, limit=limit)]


async def process_and_pull(svc: Services, message: dict, seconds_left: float) -> Counter:
    """Run the message's work, then keep its slots busy: while time is left, claim the model's next due
    work and run it here, without a round trip through the dispatcher and the queue. A freed slot is
    refilled as soon as it is freed, which is what keeps a backend at its budget."""
    deadline = time.monotonic() + seconds_left - svc.settings.backend_timeout_seconds - 10
    outcome = await process(svc, message)
    while svc.settings.worker_pull and time.monotonic() < deadline:
        pulled = await asyncio.to_thread(_claim_next, svc, message["model"], svc.settings.worker_pull_limit)
        if not pulled:
            break
        for done in await asyncio.gather(*(process(svc, queue_message(unit), claimed=unit, batch=batch)
                                           for unit, batch in pulled)):
            outcome.update(done)
    return outcome
