"""The worker: runs dispatched requests (a group at once, or one retry) on their backend and records each
outcome exactly once."""

from __future__ import annotations

import asyncio
import contextvars
import functools
import json
import logging
import math
import random
import time
from collections import Counter, deque
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from .. import protocols
from ..catalog import Model
from ..domain import (
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
from ..jsontext import Text, text_of, to_json
from ..layout import group_key, requests_object, result_object
from ..ledger import (
    Settlement,
    close_group,
    give_back_slots,
    grow_slots,
    position_item,
    queue_message,
    record_position,
    settle,
    start,
    start_group,
    start_group_in_lease,
    take_slots,
)
from ..records import Batch, Request, key_account_and_usage
from ..runtime import Services
from ..storage.dynamo import ConditionFailed, Throttled
from ..storage.secrets import BackendKeyNotSet
from . import inference
from .accounts import key_problem, may_use_model
from .capacity import Draws, InteractiveMemory, backend_throttled, effective_budget, read_budget
from .dispatch import LANE_QUANTUM, Dispatcher
from .inference import backend_key
from .lifecycle import settle_batch, stop_batch

log = logging.getLogger(__name__)
ACCESS_RECHECK_SECONDS = 60


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
    s = svc.settings
    cost = inference.cost_of(model, attempt)
    common = {"input_tokens": attempt.input_tokens, "output_tokens": attempt.output_tokens,
              "cached_tokens": attempt.cached_tokens, "reasoning_tokens": attempt.reasoning_tokens, "cost_usd": cost,
              "cost_unknown": 0 if attempt.cost_known else 1}
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
            return outcome.to.value
        except ConditionFailed:
            req = Request.get(svc.table, req["batch_id"], req["index"])
            if not req or req["state"] != RequestState.DISPATCHED.value or req["token"] != message["token"]:
                return "stale"
    return "stale"


async def _attempt(model: Model, batch: dict, body: dict, key: str | None, timeout: float) -> Attempt:
    """The batch request's attempt, through the very function an interactive call uses."""
    return await inference.attempt(model, batch["endpoint"], body, key, timeout,
                                   **protocols.of_batch(batch).backend_options(batch))


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
    if claimed is None and await asyncio.to_thread(_over_cap, svc, req["model"]):
        # Dispatched within the cap, delivered after it shrank (interactive load came, the backend said 429):
        # it does not start over the cap; back to waiting, due at once, its slot given back.
        await asyncio.to_thread(_hand_back_request, svc, req)
        return "handed_back"
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


def _over_cap(svc: Services, model_id: str) -> bool:
    """Whether the model has more batch slots taken than it may have now."""
    model = svc.catalog.lookup(model_id)
    if model is None:
        return False  # gone from the catalog: the precheck fails it
    budget = read_budget(svc, model, consistent=False)
    cap = effective_budget(model, budget, svc.settings.interactive_yield_per_request)
    return int((budget or {}).get("in_flight", 0)) > cap


def _hand_back_request(svc: Services, req: dict) -> None:
    """A dispatched request that did not start: waiting again, due at once (it keeps its last error)."""
    try:
        settle(svc, req, Settlement(to=RequestState.WAITING, error=req.get("error"), retry_at=svc.now()))
    except ConditionFailed:
        pass  # recovered meanwhile


def _backend_said_429(svc: Services, model: Model) -> None:
    """The backend is past its capacity: batch work on it backs off."""
    budget = read_budget(svc, model, consistent=False)
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


@dataclass
class _GroupRun:
    """A group the pump claimed: its members' outcomes as they are written, until every member is accounted
    for (ran and written, or handed back) and the group closes."""

    group: dict
    batch: dict
    left: int
    written: list[dict] = field(default_factory=list)
    handed_back: list[dict] = field(default_factory=list)
    lost: bool = False  # a write lost its condition: the sweeper recovered the group first


@dataclass
class _Member:
    """One claimed request waiting in the pump's queue for a slot: a group member, or a retry."""

    run: _GroupRun | None = None
    position: list | None = None
    body: dict | None = None
    retry: dict | None = None


class SlotPump:
    """Keeps a model's backend at its budget: a worker invocation holds some of the model's slots (a
    SlotLease, taken from the budget once, within its cap and fenced by a token) and keeps exactly that many
    backend calls in flight, from a small local queue of requests it has already claimed. When a call
    answers, the next claimed request starts at once; its outcome is written beside it (one conditional
    put per request, the group's close once all its members are written), not before the next call.

    Invariants:
    - calls in flight <= slots held <= what the budget granted: one runner per slot, and a runner starts a
      call only while it holds its slot; slots go back only when their runner has stopped;
    - work-conserving: claimed work never waits behind busy runners while the budget has free slots: the
      lease grows into them (fenced on the lease and conditional on the cap, as a claim) and a runner starts
      for each, so a long call holds one slot, never the requests queued behind it;
    - ownership of work is the ledger's, as for every claim: each claimed request is run at most once per
      claim and its outcome written exactly once, fenced by its group's token; a member that does not start
      (the invocation ends, the budget shrinks, its batch stopped or its window closed) is handed back in its
      group's close as waiting, due at once and never attempted, so it is claimed again like a retry;
    - claims run ahead of the slots by about one claim's round trip of work (`ahead`), so fairness between
      batches (the claims' round robin) and the interactive floor hold to within one claim;
    - the budget is read every `POLL_SECONDS` on a thread of its own (never behind a claim or a write): when
      it has shrunk (interactive load, 429 back-off) below what is in flight, runners stop after their
      current call and their slots go back, and the runners kept start no new call until the model is back
      within its cap (bounded, see `_holding`); the lease changes (grow, give back) one at a time;
    - a call starts only on a cap read less than `STALE_CAP_SECONDS` ago: when the poll is slow (a throttled
      or stalled store), runners wait for its answer rather than start calls on what the budget said before
      (the interactive load may have come meanwhile);
    - a worker that dies holding slots leaves a SlotLease whose lease runs out: the sweeper gives its slots
      back; its groups are recovered by their own leases, counting no budget slot (they held none).
    """

    POLL_SECONDS = 0.25  # the budget is read this often (interactive load, 429 back-off)
    IDLE_SECONDS = 1.0  # no work claimed for this long: the pump ends and gives its slots back
    STALE_CAP_SECONDS = 1.0  # four polls: no new call starts on a cap read longer ago than this
    SOON_MARGIN_SECONDS = 0.05  # a claim is sized for the slots free by the time it lands, and this margin
    AHEAD_SECONDS = 1.0  # claimed work queued beyond the slots never takes them longer than this to run

    def __init__(self, svc: Services, model: Model, deadline: float) -> None:
        self.svc, self.model, self.deadline = svc, model, deadline
        self.lease: dict | None = None
        self.slots = 0  # runners (and slots) still held
        self.queue: deque[_Member] = deque()
        self.calls_started: dict[int, float] = {}  # per call in flight: when it started (time.monotonic())
        self.release = 0  # runners that must stop and give their slot back (the budget shrank)
        self.releasing = 0  # slots on their way back (the give-back not yet written)
        self.done_claiming = False
        self.drained = False  # the last claim found no work: what is queued is the end of it
        self.wake = asyncio.Event()  # the claimer has work queued, or has stopped
        self.need = asyncio.Event()  # a runner took work: the claimer may claim more
        self.writes: set[asyncio.Task] = set()
        self.runners: set[asyncio.Task] = set()
        self.outcome: Counter = Counter()
        self.claim_seconds = 0.05  # moving averages: how long a claim and a call take
        self.call_seconds = 1.0
        self.batches: dict[str, dict] = {}  # the batches of queued work, shared by their groups
        self.looked_at: dict[str, float] = {}  # batch id -> when a stop was last looked for
        self.dispatcher = Dispatcher(svc, runs_what_it_claims=True)
        self.key: str | None = None
        self.lease_lock = asyncio.Lock()  # one change of the lease at a time: each is fenced on the last
        # Threads of its own for claims and for writes: a claim must never wait behind the writes of outcomes
        # (nor those behind the rest of the process) for a thread of the shared pool.
        self.claim_pool = ThreadPoolExecutor(1, thread_name_prefix="pump-claim")
        # The budget is polled on a thread and a clock of its own: a slow claim must not hold back the poll
        # that stops runners when interactive load arrives.
        self.poll_pool = ThreadPoolExecutor(1, thread_name_prefix="pump-poll")
        self.budget_item: dict | None = None  # as the last poll read it
        self.cap_read_at = time.monotonic()  # when the read behind `budget_item` was sent
        self.interactive = InteractiveMemory()  # the polls' own (the dispatcher's is read in the claim thread)
        self.closing = False
        self.stop_polling = asyncio.Event()
        self.over_since: float | None = None  # when the last polls began to find the model over its cap
        self.over_share = 0.0  # this lease's part of what was in flight then: it keeps that part of the cap
        self.write_pool = ThreadPoolExecutor(8, thread_name_prefix="pump-write")

    async def _claiming(self, fn, *args):  # noqa: ANN001, ANN202 - a thin wrapper of run_in_executor
        return await self._in(self.claim_pool, fn, *args)

    async def _writing(self, fn, *args):  # noqa: ANN001, ANN202
        return await self._in(self.write_pool, fn, *args)

    @staticmethod
    async def _in(pool: ThreadPoolExecutor, fn, *args):  # noqa: ANN001, ANN205
        # In the caller's context, as asyncio.to_thread runs it (loggers' and tracers' context go along).
        context = contextvars.copy_context()
        return await asyncio.get_running_loop().run_in_executor(pool, functools.partial(context.run, fn, *args))

    @property
    def ahead(self) -> int:
        """Requests claimed beyond the slots: what the slots use up while a claim is on its way, twice (the
        next claim starts when half of it is gone). Bounded in time, not in slots: calls shorter than a claim
        (embeddings, small models) need many queued per slot, or each slot idles through every claim; and at
        most AHEAD_SECONDS of work queued keeps fairness between batches within that."""
        during_claim = self.slots * self.claim_seconds / max(self.call_seconds, 1e-3)
        most = max(2 * self.slots, math.ceil(self.slots * self.AHEAD_SECONDS / max(self.call_seconds, 1e-3)))
        return max(2, min(most, 2 * math.ceil(during_claim) + 2))

    async def adopt(self, message: dict) -> Counter | None:
        """Run a dispatched group (a queue message) in a lease made of the slots its members hold: None once
        adopted (`run` goes on from it), or what happened instead (stale, closed without running)."""
        svc = self.svc
        group = await asyncio.to_thread(svc.table.get, *group_key(message["batch_id"], int(message["group"])))
        if not group or group["state"] != RequestState.DISPATCHED.value or group["token"] != message["token"]:
            return Counter(stale=1)
        batch = await asyncio.to_thread(Batch.get, svc.table, message["batch_id"])
        decided = await asyncio.to_thread(_close_without_running, svc, group, batch)
        if decided:
            return decided
        try:
            running, self.lease = await asyncio.to_thread(start_group_in_lease, svc, group)
        except ConditionFailed:  # the batch stopped (or its window closed) since the check
            return await asyncio.to_thread(_close_without_running, svc, group, None) or Counter(stale=1)
        self.slots = len(running["positions"])
        await self._queue_group(running, batch)
        return None

    async def run(self, most: int) -> Counter:
        """Keep the lease's slots busy (taking up to `most` free ones first if none were adopted) until the
        deadline or the work runs out, then give them back."""
        svc, model = self.svc, self.model
        if self.lease is None:
            read_at = time.monotonic()
            budget_item = await asyncio.to_thread(read_budget, svc, model)
            level = self.interactive.level(model.id, budget_item)
            # Interactive calls began or ended a moment ago: a new pump remembers none of that load yet, and
            # between one client's call and its next the count dips for a moment (to 0 when calls end
            # together). It watches over the memory's window before taking slots, as running pumps and the
            # dispatcher go by what they saw over it. (A count that stood still for the window needs no watch.)
            while not self.interactive.knows(model.id, budget_item, svc.now_ms()):
                await asyncio.sleep(self.POLL_SECONDS)
                read_at = time.monotonic()
                budget_item = await asyncio.to_thread(read_budget, svc, model)
                level = self.interactive.level(model.id, budget_item)
            cap = effective_budget(model, budget_item, svc.settings.interactive_yield_per_request, level)
            # From the budget's roomiest shards, as many as it needs (a lease may hold slots of several).
            parts = Draws(budget_item, cap).split(min(most, cap - int((budget_item or {}).get("in_flight", 0))))
            k = sum(n for _, n in parts)
            if k <= 0 or time.monotonic() >= self.deadline:
                return self.outcome
            try:
                self.lease = await asyncio.to_thread(take_slots, svc, model.id, parts)
            except (ConditionFailed, Throttled):
                return self.outcome  # another claimant took them first
            self.slots, self.budget_item, self.cap_read_at = k, budget_item, read_at
        else:
            # An adopted group was claimed in the budget as it stood then: look at it again before its first
            # call starts, so a group that waited on the queue while interactive load came does not start over.
            await self._poll_budget()
        self.key = await asyncio.to_thread(backend_key, svc, model)
        poller = asyncio.create_task(self._poll_loop())
        claimer = asyncio.create_task(self._claim_loop())
        failure: BaseException | None = None
        try:
            self._add_runners(self.slots)
            while self.runners:  # the lease may grow meanwhile, adding runners
                done, _ = await asyncio.wait(self.runners, return_when=asyncio.FIRST_COMPLETED)
                for task in done:
                    self.runners.discard(task)
                    if task.exception() is not None and failure is None:
                        # The others finish their current call (recorded) and start no more; then it is raised.
                        failure = task.exception()
                        self.deadline = 0.0
                        self.wake.set()
            if failure is not None:
                raise failure
        finally:
            self.done_claiming = True
            self.need.set()
            for problem in await asyncio.gather(claimer, return_exceptions=True):
                if isinstance(problem, Exception):  # its claims stand; what it queued still runs or goes back
                    log.error("the pump's claimer stopped: %r", problem)
            self.closing = True  # no more growth; a grow already written added runners: they end too
            self.stop_polling.set()
            for problem in await asyncio.gather(poller, return_exceptions=True):
                if isinstance(problem, Exception):
                    log.error("the pump's budget poll stopped: %r", problem)
            while self.runners:  # added by a grow the poll wrote as it stopped, or left by a failure
                done, _ = await asyncio.wait(self.runners)
                self.runners -= done
                for task in done:
                    if task.exception() is not None and task.exception() is not failure:
                        log.error("a pump runner stopped: %r", task.exception())
            while self.queue:  # claimed but never started: back to waiting, in their groups' close
                self._hand_back(self.queue.popleft())
            while self.writes:
                await asyncio.gather(*list(self.writes), return_exceptions=True)
            if self.lease is not None:
                await self._give_back(self.slots)
            self.claim_pool.shutdown(wait=False)
            self.poll_pool.shutdown(wait=False)
            self.write_pool.shutdown(wait=False)
        return self.outcome

    # --- Slots ---------------------------------------------------------------------------------------

    def _add_runners(self, n: int) -> None:
        for _ in range(n):
            self.runners.add(asyncio.create_task(self._runner()))

    async def _grow(self, budget_item: dict | None, cap: int) -> None:
        """Every runner busy and claimed work waiting: take free slots of the budget for it."""
        async with self.lease_lock:
            if (self.lease is None or self.closing or self.release or self.releasing
                    or time.monotonic() >= self.deadline):
                return
            waiting = len(self.queue) - (self.slots - self.busy)
            free = cap - int((budget_item or {}).get("in_flight", 0))
            parts = Draws(budget_item, cap).split(min(waiting, free))  # from whichever shards have room
            n = sum(m for _, m in parts)
            if n <= 0:
                return
            try:
                self.lease = await self._in(self.poll_pool, grow_slots, self.svc, self.lease, parts)
            except (ConditionFailed, Throttled):
                return  # taken by others meanwhile (or the lease was recovered): the next poll looks again
            self.slots += n
            self._add_runners(n)

    async def _give_back(self, n: int) -> None:
        async with self.lease_lock:
            if n <= 0 or self.lease is None:
                return
            try:
                self.lease = await asyncio.to_thread(give_back_slots, self.svc, self.lease, n)
            except ConditionFailed:  # the sweeper recovered the lease (its slots went back then)
                self.lease = None
            except Throttled:
                log.warning("could not give %d slots back now; the lease's recovery will", n)

    async def _runner(self) -> None:
        while True:
            member = await self._next()
            if member is None:
                return
            if member.retry is not None:  # a retry runs the single-request path (start, call, settle)
                self._call_starts(member)
                try:
                    self.outcome.update(await process(self.svc, queue_message(member.retry), claimed=member.retry))
                finally:
                    self._call_ended(member)
                continue
            run = member.run
            assert run is not None and member.position is not None
            if not self._may_start(run.batch):
                self._hand_back(member)
                continue
            started = self._call_starts(member)
            try:
                attempt = await _attempt(self.model, run.batch, member.body or {}, self.key,
                                         self.svc.settings.backend_timeout_seconds)
            finally:
                self._call_ended(member)
            self.call_seconds += 0.2 * (time.monotonic() - started - self.call_seconds)
            self._spawn(self._record(member, attempt))

    @property
    def busy(self) -> int:
        """Calls in flight."""
        return len(self.calls_started)

    def _call_starts(self, member: _Member) -> float:
        started = self.calls_started[id(member)] = time.monotonic()
        return started

    def _call_ended(self, member: _Member) -> None:
        self.calls_started.pop(id(member), None)

    def _ending_soon(self) -> tuple[int, float]:
        """How many calls in flight are expected to answer within the next claim's round trip (twice the
        average claim, and a margin), and in how many seconds the next of the others will be."""
        horizon = 2 * self.claim_seconds + self.SOON_MARGIN_SECONDS
        now = time.monotonic()
        soon, next_in = 0, math.inf
        for started in self.calls_started.values():
            left = started + self.call_seconds - now
            if left <= horizon:
                soon += 1
            else:
                next_in = min(next_in, left - horizon)
        return soon, next_in

    async def _next(self) -> _Member | None:
        """The next claimed request for a free slot, or None when this runner must stop (its slot goes back)."""
        while True:
            if self.release > 0:
                # Counted as on its way back until the budget says so, lest the claimer see the budget still
                # over its cap and stop one runner more.
                self.release -= 1
                self.releasing += 1
                await self._give_back(1)
                self.releasing -= 1
                self.slots -= 1
                return None
            if time.monotonic() >= self.deadline:
                return None
            if self.queue and (self._holding() or self._cap_stale()):
                self.wake.clear()
                try:
                    await asyncio.wait_for(self.wake.wait(), self.POLL_SECONDS)
                except TimeoutError:
                    pass
                continue
            if self.queue:
                self.need.set()
                return self.queue.popleft()
            if self.done_claiming:
                return None
            self.wake.clear()
            await self.wake.wait()

    def _holding(self) -> bool:
        """Over the cap (interactive load came, or the backend said 429): the slots this lease keeps start no
        new call until the calls running above the cap have ended and their slots gone back ("running calls
        may finish, new ones must not start"), whichever worker runs them. Bounded by the backend timeout, the
        longest a running call can take: slots still held past it are a dead worker's (given back when the
        sweeper recovers its lease), and must not stop the floor's own work until then."""
        return (self.over_since is not None
                and time.monotonic() - self.over_since < self.svc.settings.backend_timeout_seconds)

    def _free_when_claimed(self, soon: int) -> int:
        """What a claim made now should bring: the runners idle, those whose calls answer by the time it
        lands, and `ahead` more, less what is queued."""
        idle = self.slots - self.release - self.releasing - self.busy
        return idle + soon + self.ahead - len(self.queue)

    def _can_start_in_time(self) -> int:
        """How many more requests the slots can start before the deadline, past what is queued: work claimed
        beyond it would be handed back at the end (each one then waits as a retry, claimed and written alone)."""
        now = time.monotonic()
        # The slots' time left before the deadline, less what the calls in flight are expected to take of it.
        left = (self.slots - self.release) * (self.deadline - now) - sum(
            max(0.0, started + self.call_seconds - now) for started in self.calls_started.values())
        return math.floor(max(0.0, left) / max(self.call_seconds, 1e-3)) - len(self.queue)

    def _claim_at(self) -> int:
        return max(1, -(-self.ahead // 2))

    def _cap_stale(self) -> bool:
        return time.monotonic() - self.cap_read_at > self.STALE_CAP_SECONDS

    def _may_start(self, batch: dict) -> bool:
        """A first attempt starts only while its batch runs and its window is open (the claim checked both;
        a stop seen since, or the window closing, hands it back)."""
        return not batch.get("stop") and self.svc.now() < batch["expires_at"]

    # --- Claims --------------------------------------------------------------------------------------

    async def _claim_loop(self) -> None:
        idle_since: float | None = None
        polled = 0.0
        try:
            while time.monotonic() < self.deadline and self.slots > 0:
                if time.monotonic() - polled >= self.POLL_SECONDS:  # not at every wake: on its own clock
                    polled = time.monotonic()
                    await self._claiming(self._refresh_stops)
                # Claim for the slots that will be free when the claim lands (idle runners, and calls expected
                # to answer by then) and `ahead` more, once half of `ahead` is missing. Just in time, not a round
                # early: work claimed ahead runs before any batch that arrives after it, and a claim made a round
                # early kept a new batch waiting a whole round of calls. Claims cost the same whatever their
                # size (each makes a group, whose close costs the same): at least a batch's share of the slots
                # (a round while one batch has work; while many do, the dispatcher gives each lane it serves
                # a whole quantum, and a lane's last few requests with it, whatever this asks for).
                open_slots = self.slots - self.release
                threshold = max(1, min(LANE_QUANTUM, open_slots), open_slots // max(1, self.dispatcher.lanes_seen))
                soon, next_soon = self._ending_soon()
                want = self._free_when_claimed(soon)
                most = self._can_start_in_time()
                want = min(want, most)
                got = 0
                if want >= self._claim_at() or (want > 0 and not self.queue):
                    started = time.monotonic()
                    got = await self._claim(min(max(want, threshold), most), self.budget_item, most)
                    self.claim_seconds += 0.2 * (time.monotonic() - started - self.claim_seconds)
                self.drained = want > 0 and not got
                if got or self.queue or self.busy:
                    idle_since = None
                elif idle_since is None:
                    idle_since = time.monotonic()
                elif time.monotonic() - idle_since >= self.IDLE_SECONDS:
                    return  # no work for a while: the runners stop and the slots go back
                if got:
                    continue  # look again at once: the queue may still be short
                # Wait for runners to take work, a call to come within a claim's round trip of its answer, or
                # the next look for stopped batches.
                self.need.clear()
                until = min(polled + self.POLL_SECONDS, time.monotonic() + next_soon)
                while time.monotonic() < until:
                    soon, next_soon = self._ending_soon()
                    until = min(until, time.monotonic() + next_soon)
                    short = min(self._free_when_claimed(soon), self._can_start_in_time())
                    if short >= self._claim_at() or (short > 0 and not self.queue and idle_since is None):
                        break
                    try:
                        await asyncio.wait_for(self.need.wait(), max(0.0, until - time.monotonic()))
                    except TimeoutError:
                        break
                    self.need.clear()
        finally:
            self.done_claiming = True
            self.wake.set()

    async def _poll_loop(self) -> None:
        while not self.stop_polling.is_set():
            try:
                await asyncio.wait_for(self.stop_polling.wait(), self.POLL_SECONDS)
            except TimeoutError:
                pass
            if self.stop_polling.is_set():
                return
            try:
                await self._poll_budget()
            except Throttled:
                log.warning("could not read %s's budget now; polling again", self.model.id)

    async def _poll_budget(self) -> dict | None:
        """Read the budget; when it has shrunk, stop runners after their current call, this lease's share of
        the excess (other holders give back theirs), counting those already told to stop; when it has room
        and claimed work waits behind busy runners, grow into it."""
        svc, model = self.svc, self.model
        read_at = time.monotonic()
        budget_item = await self._in(self.poll_pool, read_budget, svc, model, False)
        stale = self._cap_stale()
        self.budget_item, self.cap_read_at = budget_item, read_at
        cap = effective_budget(model, budget_item, svc.settings.interactive_yield_per_request,
                               self.interactive.level(model.id, budget_item))
        in_flight = int((budget_item or {}).get("in_flight", 0)) - self.releasing
        mine = self.slots - self.releasing
        if stale:
            self.wake.set()  # runners held for a fresh cap: here it is
        if in_flight > cap and self.over_since is None:
            self.over_since = time.monotonic()
            self.over_share = mine / in_flight
        elif in_flight <= cap and self.over_since is not None:
            self.over_since = None
            self.wake.set()
        if in_flight > cap and mine > 0:
            # Its share of the excess, but never below its part of the cap as things stood when the model went
            # over: the slots other leases are giving back still count in in_flight until their calls end, and
            # a lease that read them as held would give the floor's slots back too. Those it keeps start nothing
            # until the model is within its cap (`_holding`); once it is, the lease grows back into it.
            share = math.ceil((in_flight - cap) * mine / in_flight)
            keep = math.floor(cap * self.over_share)
            self.release = max(self.release, min(share, mine - keep))
            self.wake.set()
        elif in_flight < cap:
            await self._grow(budget_item, cap)
        return budget_item

    async def _claim(self, want: int, budget_item: dict | None, most: int) -> int:
        """Claim about `want` requests (never more than `most`) in the lease's slots and queue them; returns
        how many were queued."""
        svc = self.svc
        try:
            units = await self._claiming(self.dispatcher.claim, self.model, want, self.lease, budget_item, most)
        except (ConditionFailed, Throttled):
            return 0
        queued = 0
        for unit in units:
            if "positions" not in unit:
                self._enqueue([_Member(retry=unit)])
                queued += 1
                continue
            batch = self.dispatcher.batches_seen.get(unit["batch_id"])
            decided = await self._claiming(_close_without_running, svc, unit, batch)
            if decided:  # its batch stopped or its owner lost access: closed without running
                self.outcome.update(decided)
                continue
            queued += await self._queue_group(unit, batch)
        return queued

    async def _queue_group(self, group: dict, batch: dict | None) -> int:
        if batch is None:
            batch = await self._claiming(Batch.get, self.svc.table, group["batch_id"])
        bodies = await self._claiming(_bodies, self.svc, group)
        shared = self.batches.setdefault(group["batch_id"], dict(batch or {}))
        run = _GroupRun(group=group, batch=shared, left=len(group["positions"]))
        self._enqueue([_Member(run=run, position=position, body=body)
                       for position, body in zip(group["positions"], bodies, strict=True)])
        return len(group["positions"])

    def _enqueue(self, members: list[_Member]) -> None:
        """Queue claimed work and wake the runners: the one way work enters the queue, so no claim (a group,
        or retries alone) can leave idle runners asleep beside it until the deadline."""
        self.queue.extend(members)
        self.wake.set()

    def _refresh_stops(self) -> None:
        """Look again, at most every half second, whether a batch with queued requests was stopped."""
        now = time.monotonic()
        for batch_id in {m.run.batch["id"] for m in self.queue if m.run is not None}:
            if now - self.looked_at.get(batch_id, 0.0) < 0.5:
                continue
            self.looked_at[batch_id] = now
            current = Batch.get(self.svc.table, batch_id) or {"deleting": True}
            if current.get("stop") or current.get("deleting"):
                self.batches[batch_id]["stop"] = current.get("stop") or "deleting"

    # --- Outcomes ------------------------------------------------------------------------------------

    def _spawn(self, coroutine) -> None:
        task = asyncio.create_task(coroutine)
        self.writes.add(task)
        task.add_done_callback(self.writes.discard)

    async def _record(self, member: _Member, attempt: Attempt) -> None:
        svc, run = self.svc, member.run
        assert run is not None and member.position is not None
        token = new_token()
        outcome = await self._writing(_outcome, svc, {"index": member.position[0], "attempt": 1, "token": token},
                                          run.group["batch_id"], self.model, attempt)
        item = position_item(svc, run.group, member.position, outcome, attempt=1, token=token)
        try:
            await self._writing(record_position, svc, item)
            run.written.append(item)
        except ConditionFailed:
            run.lost = True  # the sweeper recovered this group first
        if attempt.status_code == 429:
            await self._writing(_backend_said_429, svc, self.model)
        await self._member_done(run)

    def _hand_back(self, member: _Member) -> None:
        if member.retry is not None:  # a retry never started: waiting again (rare: at the end)
            self._spawn(self._writing(_hand_back_request, self.svc, member.retry))
            return
        run = member.run
        assert run is not None and member.position is not None
        item = position_item(self.svc, run.group, member.position,
                             Settlement(to=RequestState.WAITING, retry_at=self.svc.now()), attempt=0)
        run.handed_back.append(item)
        self._spawn(self._member_done(run))

    async def _member_done(self, run: _GroupRun) -> None:
        run.left -= 1
        if run.left > 0:
            return
        if run.lost:
            self.outcome["lease_lost"] += len(run.group["positions"])
            return
        try:
            await self._writing(close_group, self.svc, run.group, run.written, tuple(run.handed_back))
        except ConditionFailed:  # recovered meanwhile: the sweeper counted these outcomes from their items
            self.outcome["lease_lost"] += len(run.group["positions"])
            return
        self.outcome.update(item["state"] for item in run.written)
        if run.handed_back:
            self.outcome["handed_back"] += len(run.handed_back)
        if self.drained and not any(m.run is not None and m.run.batch is run.batch for m in self.queue):
            # Its last claimed work is done and nothing of it is left to claim: give it its final status now
            # rather than at the sweeper's next pass (a minute on AWS). Fenced like every settle.
            await self._writing(settle_batch, self.svc, run.group["batch_id"])


async def process_and_pull(svc: Services, message: dict, seconds_left: float) -> Counter:
    """Run the message's work, then keep the model's backend busy (`SlotPump`): while time is left, hold free
    slots of the model and refill each one the moment its call answers, from work claimed ahead, without a
    round trip through the dispatcher and the queue."""
    deadline = time.monotonic() + seconds_left - svc.settings.backend_timeout_seconds - 10
    model = svc.catalog.lookup(message["model"])
    if (not svc.settings.worker_pull or model is None or time.monotonic() >= deadline
            or await asyncio.to_thread(_backend_key_not_set, svc, model)):  # its requests fail unsent: no pump
        return await process(svc, message)
    pump = SlotPump(svc, model, deadline)
    # A group's slots become the pump's at its start (no slot goes back to the budget between its members
    # and the next work); a retry runs on its own, then the pump takes what the budget has free.
    outcome = (await pump.adopt(message)) if "group" in message else await process(svc, message)
    outcome = outcome or Counter()
    outcome.update(await pump.run(svc.settings.worker_pull_limit))
    return outcome
