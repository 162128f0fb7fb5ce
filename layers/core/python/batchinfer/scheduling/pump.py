"""The slot pump: a worker invocation keeps a model's backend at its budget from slots it holds (a SlotLease)
and work it claims ahead, refilling each slot the moment its call answers.

The pump decides what runs when (how many slots to hold, how much to claim and when, when to give slots
back, what may start); how one request runs (its checks, its call, its outcome, the writes that settle it)
is the service's, handed in as `RunsRequests` by the worker's entry point (service.run_request), so this
package stays below the service.
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import logging
import math
import time
from collections import Counter, deque
from concurrent.futures import ThreadPoolExecutor

from ..catalog import Model
from ..domain import Attempt, RequestState
from ..layout import group_key, owner_sort_created_us
from ..ledger import Settlement, position_item, start_group_in_lease
from ..observability import item_failed
from ..records import Batch
from ..runtime import Services
from ..storage.dynamo import ConditionFailed, Throttled
from . import policy
from .capacity import Draws, InteractiveMemory, backend_said_429, effective_budget, note_call_seconds, read_budget
from .claimed_work import GroupRun, Member, RunsRequests
from .config import SchedulerConfig, scheduler_config
from .dispatcher import Dispatcher
from .held_slots import HeldSlots

log = logging.getLogger(__name__)


def created_us(batch: dict) -> int:
    """When a batch came to the turns, in microseconds: when it was created, to the microsecond its list key
    holds (its `created_at` is in seconds, and a batch created just after another is most often in the same
    second); or, for a batch retried in place since, when it was retried (`retried_at`, in seconds): its
    rejoin is an arrival, owed the calls the others run then as a new batch is."""
    created = (owner_sort_created_us(batch["owner_sk"]) if batch.get("owner_sk")
               else int(batch.get("created_at", 0)) * 1_000_000)
    return max(created, int(batch.get("retried_at", 0)) * 1_000_000)


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
    - the budget is read every `poll_seconds` on a thread of its own (never behind a claim or a write): when
      it has shrunk (interactive load, 429 back-off) below what is in flight, runners stop after their
      current call and their slots go back, and the runners kept start no new call until the model is back
      within its cap (bounded, see `_holding`); the lease changes (grow, give back) one at a time;
    - a call starts only on a cap read less than `stale_cap_seconds` ago: when the poll is slow (a throttled
      or stalled store), runners wait for its answer rather than start calls on what the budget said before
      (the interactive load may have come meanwhile);
    - a worker that dies holding slots leaves a SlotLease whose lease runs out: the sweeper gives its slots
      back; its groups are recovered by their own leases, counting no budget slot (they held none).

    Its knobs are SchedulerConfig's; its arithmetic is `policy`'s. `requests` runs what it claims.
    """

    def __init__(self, svc: Services, model: Model, deadline: float, requests: RunsRequests) -> None:
        self.svc, self.model, self.deadline, self.requests = svc, model, deadline, requests
        config = self.config
        self.held = HeldSlots(svc, model.id)  # the lease and its slots
        self.queue: deque[Member] = deque()
        self.calls_started: dict[int, float] = {}  # per call in flight: when it started (time.monotonic())
        self.call_batch: dict[int, str | None] = {}  # per call in flight: its batch (None: a retry)
        self.running_of: Counter = Counter()  # batch id -> its group members' calls in flight here
        self.queued_of: Counter = Counter()  # batch id (None: retries) -> its requests in the queue
        # batch id -> calls started here, counted from where its arrival put it (`policy.served_at_arrival`),
        # while it has work queued or running here.
        self.served: dict[str, int] = {}
        # When this pump's recent calls ended (wall clock, as batches' creation times are) and their batch:
        # the calls that ended since a newer batch was created are service the older ones had after it came.
        self.ends: deque[tuple[float, str]] = deque(maxlen=1024)
        self.left_with: dict[str, int] = {}  # batch id -> its count when its work here last ran out
        self.done_claiming = False
        self.drained = False  # the last claim found no work: what is queued is the end of it
        self.emptied: set[str] = set()  # batches whose lane on the model a claim here took the last of
        self.wake = asyncio.Event()  # the claimer has work queued, or has stopped
        self.need = asyncio.Event()  # a runner took work: the claimer may claim more
        self.writes: set[asyncio.Task] = set()
        self.runners: set[asyncio.Task] = set()
        self.outcome: Counter = Counter()
        self.claim_seconds = config.first_claim_seconds  # moving averages: how long a claim and a call take
        self.call_seconds = config.first_call_seconds
        # The calls that answered since their time was last noted on the budget: how many, and their seconds.
        self.calls_measured = 0
        self.measured_seconds = 0.0
        self.latency_noted = time.monotonic()
        self.answered = False  # a call has answered here: `call_seconds` is measured, not the first guess
        self.batches: dict[str, dict] = {}  # the batches of queued work, shared by their groups
        self.looked_at: dict[str, float] = {}  # batch id -> when a stop was last looked for
        self.dispatcher = Dispatcher(svc, runs_what_it_claims=True, stop_at_cap=getattr(requests, "stop_at_cap", None))
        self.key: str | None = None
        # Threads of its own for claims and for writes: a claim must never wait behind the writes of outcomes
        # (nor those behind the rest of the process) for a thread of the shared pool.
        self.claim_pool = ThreadPoolExecutor(1, thread_name_prefix="pump-claim")
        # The budget is polled on a thread and a clock of its own: a slow claim must not hold back the poll
        # that stops runners when interactive load arrives.
        self.poll_pool = ThreadPoolExecutor(1, thread_name_prefix="pump-poll")
        self.budget_item: dict | None = None  # as the last poll read it
        self.cap_read_at = time.monotonic()  # when the read behind `budget_item` was sent
        # The polls' own (the dispatcher's is read in the claim thread).
        self.interactive = InteractiveMemory(config.interactive_window_seconds)
        self.closing = False
        self.stop_polling = asyncio.Event()
        self.over_since: float | None = None  # when the last polls began to find the model over its cap
        self.over_share = 0.0  # this lease's part of what was in flight then: it keeps that part of the cap
        self.write_pool = ThreadPoolExecutor(8, thread_name_prefix="pump-write")
        self.retries_answered: list[tuple] = []  # retries whose call answered, their outcomes not yet written
        self.writing_retries = False
        # Retries' checks and starts: never behind the writes of outcomes, which may be slow on a busy batch.
        self.start_pool = ThreadPoolExecutor(4, thread_name_prefix="pump-start")

    @property
    def config(self) -> SchedulerConfig:
        return scheduler_config(self.svc.settings)

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
        """Requests claimed beyond the slots (`policy.ahead`)."""
        return policy.ahead(self.held.slots, self.claim_seconds, self.call_seconds, self.config.ahead_seconds)

    async def adopt(self, message: dict) -> Counter | None:
        """Run a dispatched group (a queue message) in a lease made of the slots its members hold: None once
        adopted (`run` goes on from it), or what happened instead (stale, closed without running)."""
        svc = self.svc
        group = await asyncio.to_thread(svc.table.get, *group_key(message["batch_id"], int(message["group"])))
        if not group or group["state"] != RequestState.DISPATCHED.value or group["token"] != message["token"]:
            return Counter(stale=1)
        batch = await asyncio.to_thread(Batch.get, svc.table, message["batch_id"])
        decided = await asyncio.to_thread(self.requests.close_without_running, group, batch)
        if decided:
            return decided
        started = await asyncio.to_thread(self.requests.start_or_close, group, start_group_in_lease)
        if isinstance(started, Counter):
            return started
        running, lease = started
        self.held.adopt(lease, len(running["positions"]))
        await self._queue_group(running, batch)
        return None

    async def run(self, most: int) -> Counter:
        """Keep the lease's slots busy (taking up to `most` free ones first if none were adopted) until the
        deadline or the work runs out, then give them back."""
        svc, model = self.svc, self.model
        if self.held.lease is None:
            read_at = time.monotonic()
            budget_item = await asyncio.to_thread(read_budget, svc, model)
            level = self.interactive.level(model.id, budget_item)
            # Interactive calls began or ended a moment ago: a new pump remembers none of that load yet, and
            # between one client's call and its next the count dips for a moment (to 0 when calls end
            # together). It watches over the memory's window before taking slots, as running pumps and the
            # dispatcher go by what they saw over it. (A count that stood still for the window needs no watch.)
            while not self.interactive.knows(model.id, budget_item, svc.now_ms()):
                await asyncio.sleep(self.config.poll_seconds)
                read_at = time.monotonic()
                budget_item = await asyncio.to_thread(read_budget, svc, model)
                level = self.interactive.level(model.id, budget_item)
            cap = effective_budget(model, budget_item, self.config.interactive_yield_per_request, level)
            # From the budget's roomiest shards, as many as it needs (a lease may hold slots of several).
            in_flight = int((budget_item or {}).get("in_flight", 0))
            parts = Draws(budget_item, cap).split(policy.slots_to_take(most, cap, in_flight))
            if sum(n for _, n in parts) <= 0 or time.monotonic() >= self.deadline:
                return self.outcome
            if not await self.held.take(parts):
                return self.outcome  # another claimant took them first
            self.budget_item, self.cap_read_at = budget_item, read_at
        else:
            # An adopted group was claimed in the budget as it stood then: look at it again before its first
            # call starts, so a group that waited on the queue while interactive load came does not start over.
            await self._poll_budget()
        self.key = await asyncio.to_thread(self.requests.key, model)
        poller = asyncio.create_task(self._poll_loop())
        claimer = asyncio.create_task(self._claim_loop())
        failure: BaseException | None = None
        try:
            self._add_runners(self.held.slots)
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
                    item_failed("pump", model.id, "claim", problem)
            self.closing = True  # no more growth; a grow already written added runners: they end too
            self.stop_polling.set()
            for problem in await asyncio.gather(poller, return_exceptions=True):
                if isinstance(problem, Exception):
                    item_failed("pump", model.id, "budget poll", problem)
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
            await self.held.give_back(self.held.slots)
            try:
                await self._note_latency(stopping=True)
            except Exception as problem:  # a figure for estimates: never worth failing the pump
                log.warning("could not note %s's call time: %r", self.model.id, problem)
            self.claim_pool.shutdown(wait=False)
            self.poll_pool.shutdown(wait=False)
            self.write_pool.shutdown(wait=False)
            self.start_pool.shutdown(wait=False)
        return self.outcome

    # --- Slots ---------------------------------------------------------------------------------------

    def _add_runners(self, n: int) -> None:
        for _ in range(n):
            self.runners.add(asyncio.create_task(self._runner()))

    async def _grow(self, budget_item: dict | None, cap: int) -> None:
        """Every runner busy and claimed work waiting: take free slots of the budget for it."""
        held = self.held
        async with held.lock:
            if self.closing or held.release or held.releasing or time.monotonic() >= self.deadline:
                return
            waiting = policy.waiting_for_a_runner(len(self.queue), held.slots, self.busy)
            in_flight = int((budget_item or {}).get("in_flight", 0))
            # From whichever shards have room.
            parts = Draws(budget_item, cap).split(policy.slots_to_take(waiting, cap, in_flight))
            self._add_runners(await held.grow(parts, functools.partial(self._in, self.poll_pool)))

    async def _runner(self) -> None:
        while True:
            member = await self._next()
            if member is None:
                return
            if member.retry is not None:
                await self._run_retry(member)
                continue
            run = member.run
            assert run is not None and member.position is not None
            if not self._may_start(run.batch):
                self._hand_back(member)
                continue
            started = self._call_starts(member)
            try:
                attempt = await self.requests.call(self.model, run.batch, member.body or {}, self.key)
            finally:
                self._call_ended(member)
            self._measured(started)
            self._spawn(self._record(member, attempt))

    async def _run_retry(self, member: Member) -> None:
        """A retried request: its checks and start on the pump's threads, its call in the slot, and its outcome
        written beside the next call, not before it, as a group member's is (the slot is the lease's: the
        settle gives none back to the budget)."""
        assert member.retry is not None
        started = await self._in(self.start_pool, self.requests.start_retry, member.retry)
        if isinstance(started, str):  # did not start (its batch stopped or paused, ...): recorded so
            self.outcome[started] += 1
            return
        began = self._call_starts(member)
        try:
            attempt = await self.requests.call(self.model, started.batch, started.body, self.key)
        finally:
            self._call_ended(member)
        self._measured(began)
        self._spawn(self._finish_retry(started, attempt))

    async def _finish_retry(self, started, attempt: Attempt) -> None:  # noqa: ANN001 - the service's own type
        """One writer at a time writes the retries answered meanwhile, a batch's together: settles of one
        batch written apart race each other for the next number of its finished-order log."""
        self.retries_answered.append((started, attempt))
        if self.writing_retries:
            return  # the writer running takes it in its next round
        self.writing_retries = True
        try:
            while self.retries_answered:
                answered, self.retries_answered = self.retries_answered, []
                try:
                    self.outcome.update(await self._writing(self.requests.finish_retries, answered))
                except Exception as problem:  # as if this worker died writing them: their leases run out and
                    # the sweeper puts them back; the answers that came in meanwhile are still written
                    log.error("writing %d answered retries failed: %r", len(answered), type(problem))
                    continue
                if self.drained and not any(m.retry is not None for m in self.queue):
                    # Nothing left to claim: as after a group's close, the batches' final status now rather
                    # than at the sweeper's next pass (fenced like every settle: work still running keeps it open).
                    for batch_id in {started.running["batch_id"] for started, _ in answered}:
                        await self._writing(self.requests.settle_batch, batch_id)
        finally:
            self.writing_retries = False

    def _measured(self, started: float) -> None:
        """A call answered: how long calls take moves (the first answer replaces the guess)."""
        elapsed = time.monotonic() - started
        self.call_seconds = (policy.moving_average(self.call_seconds, elapsed, self.config.average_weight)
                             if self.answered else elapsed)
        self.answered = True
        self.calls_measured += 1
        self.measured_seconds += elapsed

    @property
    def busy(self) -> int:
        """Calls in flight."""
        return len(self.calls_started)

    def _call_starts(self, member: Member) -> float:
        started = self.calls_started[id(member)] = time.monotonic()
        self.call_batch[id(member)] = None if member.run is None else member.run.batch.get("id")
        if member.run is not None:
            batch_id = member.run.batch.get("id")
            self.running_of[batch_id] += 1
            self.served[batch_id] = self.served.get(batch_id, 0) + 1
        return started

    def _call_ended(self, member: Member) -> None:
        self.call_batch.pop(id(member), None)
        if self.calls_started.pop(id(member), None) is not None and member.run is not None:
            self.running_of[member.run.batch.get("id")] -= 1
            self.ends.append((time.time(), member.run.batch.get("id")))
            while self.ends[0][0] < time.time() - self._memory():
                self.ends.popleft()

    def _memory(self) -> float:
        """How far back the ends of calls are remembered for a newcomer's arrival (`policy.arrival_moment`):
        two calls and a claim's round trip. A batch's work reaches a pump that serves it a call and a claim
        after its creation at most (the claim for a wave's end comes as it ends), some of it more on a busy
        machine; a batch first seen later than that is owed only the calls of that time."""
        return 2 * self.call_seconds + policy.claim_horizon(self.claim_seconds, self.config.soon_margin_seconds)

    def _take_next(self) -> Member:
        """The queued request a free runner starts (`policy.next_to_run`): the batches whose work is queued
        share the runners evenly, an account's higher-priority batches first, whatever order it was claimed in."""
        if len(self.queue) == 1 or len(+self.queued_of) <= 1:  # one batch's work (or retries alone): in order
            return self._dequeued(self.queue.popleft())
        queued = [policy.Queued(batch=None, account=None) if m.run is None
                  else policy.Queued(batch=m.run.batch.get("id"), account=m.run.batch.get("account_id"),
                                     rank=policy.rank(m.run.batch.get("priority"))) for m in self.queue]
        i = policy.next_to_run(queued, self.running_of, self.served)
        member = self.queue[i]
        del self.queue[i]
        return self._dequeued(member)

    def _dequeued(self, member: Member) -> Member:
        self.queued_of[None if member.run is None else member.run.batch.get("id")] -= 1
        return member

    def _calls_left(self, now: float) -> list[float]:
        return policy.calls_left(self.calls_started.values(), self.call_seconds, now)

    def _running_past(self) -> dict:
        """Per batch, its calls in flight expected to run past a claim made now (`policy.running_past`); all
        of them until a call has answered here (how long one takes is a guess until then)."""
        now = time.monotonic()
        horizon = (policy.claim_horizon(self.claim_seconds, self.config.soon_margin_seconds) if self.answered
                   else -math.inf)
        return policy.running_past(((self.call_batch.get(key), start + self.call_seconds - now)
                                    for key, start in self.calls_started.items()), horizon)

    def _ending_soon(self) -> tuple[int, float]:
        """How many calls in flight are expected to answer within the next claim's round trip (twice the
        average claim, and a margin), and in how many seconds the next of the others will be."""
        if not self.answered:
            # No call has answered here yet: how long one takes is a guess (`first_call_seconds`), and a guess
            # shorter than the calls made the first claims come a whole round early (work queued for the
            # batches there then, ahead of one that arrived meanwhile). The work queued ahead covers the first
            # answers; the claim for the others follows them.
            return 0, self.config.poll_seconds
        horizon = policy.claim_horizon(self.claim_seconds, self.config.soon_margin_seconds)
        return policy.ending_soon(self._calls_left(time.monotonic()), horizon)

    async def _next(self) -> Member | None:
        """The next claimed request for a free slot, or None when this runner must stop (its slot goes back)."""
        while True:
            if self.held.release > 0:
                await self.held.release_one()
                return None
            if time.monotonic() >= self.deadline:
                return None
            if self.queue and (self._holding() or self._cap_stale()):
                self.wake.clear()
                try:
                    await asyncio.wait_for(self.wake.wait(), self.config.poll_seconds)
                except TimeoutError:
                    pass
                continue
            if self.queue:
                self.need.set()
                return self._take_next()
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
        return policy.holding(self.over_since, time.monotonic(), self.config.backend_timeout_seconds)

    def _wanted(self, soon: int, most: int) -> int:
        """What a claim made now should bring, within what can start in time (`policy.wanted`)."""
        return policy.wanted(self.held.idle(self.busy), soon, self.ahead, len(self.queue), most)

    def _can_start_in_time(self) -> int:
        """How many more requests the slots can start before the deadline, past what is queued
        (`policy.can_start_in_time`)."""
        now = time.monotonic()
        return policy.can_start_in_time(self.held.open, self.deadline - now, self._calls_left(now),
                                        self.call_seconds, len(self.queue))

    def _ahead_most(self) -> int:
        """What the slots run in `ahead_seconds`: the most a claim's floor queues past what is missing."""
        return math.ceil(self.held.open * self.config.ahead_seconds
                         / max(self.call_seconds, 1e-3))

    def _claim_at(self) -> int:
        return policy.claim_at(self.ahead)

    def _cap_stale(self) -> bool:
        return time.monotonic() - self.cap_read_at > self.config.stale_cap_seconds

    def _may_start(self, batch: dict) -> bool:
        """A first attempt starts only while its batch runs, unpaused, and its window is open (the claim
        checked all three; a stop or a pause seen since, or the window closing, hands it back)."""
        return not batch.get("stop") and not batch.get("paused_at") and self.svc.now() < batch["expires_at"]

    # --- Claims --------------------------------------------------------------------------------------

    async def _claim_loop(self) -> None:
        idle_since: float | None = None
        polled = 0.0
        try:
            while time.monotonic() < self.deadline and self.held.slots > 0:
                config = self.config
                if time.monotonic() - polled >= config.poll_seconds:  # not at every wake: on its own clock
                    polled = time.monotonic()
                    await self._claiming(self._refresh_stops)
                # Claim for the slots that will be free when the claim lands (idle runners, and calls expected
                # to answer by then) and `ahead` more, once half of `ahead` is missing. Just in time, not a round
                # early: work claimed ahead runs before any batch that arrives after it, and a claim made a round
                # early kept a new batch waiting a whole round of calls. Claims cost the same whatever their
                # size (each makes a group, whose close costs the same): at least a batch's share of the slots
                # (a round while one batch has work; while many do, the dispatcher gives each lane it serves
                # a whole quantum, and a lane's last few requests with it, whatever this asks for).
                floor = policy.claim_floor(self.held.open, config.lane_quantum,
                                           self.dispatcher.lanes.seen, self._ahead_most())
                soon, next_soon = self._ending_soon()
                most = self._can_start_in_time()
                want = self._wanted(soon, most)
                got = 0
                if policy.should_claim(want, self._claim_at(), len(self.queue)):
                    started = time.monotonic()
                    got = await self._claim(policy.claim_size(want, floor, most), self.budget_item, most)
                    self.claim_seconds = policy.moving_average(self.claim_seconds, time.monotonic() - started,
                                                               config.average_weight)
                self.drained = want > 0 and not got
                if got or self.queue or self.busy:
                    idle_since = None
                elif idle_since is None:
                    idle_since = time.monotonic()
                elif time.monotonic() - idle_since >= config.idle_seconds:
                    return  # no work for a while: the runners stop and the slots go back
                if got:
                    continue  # look again at once: the queue may still be short
                # Wait for runners to take work, a call to come within a claim's round trip of its answer, or
                # the next look for stopped batches.
                self.need.clear()
                until = min(polled + config.poll_seconds, time.monotonic() + next_soon)
                while time.monotonic() < until:
                    soon, next_soon = self._ending_soon()
                    until = min(until, time.monotonic() + next_soon)
                    short = self._wanted(soon, self._can_start_in_time())
                    if policy.should_claim(short, self._claim_at(), len(self.queue), idle=idle_since is not None):
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
                await asyncio.wait_for(self.stop_polling.wait(), self.config.poll_seconds)
            except TimeoutError:
                pass
            if self.stop_polling.is_set():
                return
            try:
                await self._poll_budget()
                await self._note_latency()
            except Throttled:
                log.warning("could not read %s's budget now; polling again", self.model.id)

    def _noted(self) -> float | None:
        """The call time on the budget as the last poll read it, if fresh enough to count."""
        item = self.budget_item or {}
        if item.get("call_seconds") is None:
            return None
        age = self.svc.now() - int(item.get("call_seconds_at", 0))
        return float(item["call_seconds"]) if age <= self.config.latency_fresh_seconds else None

    async def _note_latency(self, stopping: bool = False) -> None:
        """What the calls that answered here since the last note teach, on the budget, where estimates of a
        batch's end read it: every few seconds while the pump runs, at once when the budget has no fresh
        figure, and when the pump stops (a short batch's calls count too)."""
        if not self.calls_measured:
            return
        noted = self._noted()
        due = time.monotonic() - self.latency_noted >= self.config.latency_note_seconds
        if not (stopping or due or noted is None):
            return
        mean = self.measured_seconds / self.calls_measured
        seconds = policy.noted_call_seconds(noted, mean, self.calls_measured, self.config.average_weight)
        self.latency_noted, self.calls_measured, self.measured_seconds = time.monotonic(), 0, 0.0
        await asyncio.to_thread(note_call_seconds, self.svc, self.model, seconds)
        if self.budget_item is not None:  # until the next poll reads it back
            self.budget_item = {**self.budget_item, "call_seconds": seconds, "call_seconds_at": self.svc.now()}

    async def _poll_budget(self) -> dict | None:
        """Read the budget; when it has shrunk, stop runners after their current call, this lease's share of
        the excess (other holders give back theirs), counting those already told to stop; when it has room
        and claimed work waits behind busy runners, grow into it."""
        svc, model = self.svc, self.model
        read_at = time.monotonic()
        budget_item = await self._in(self.poll_pool, read_budget, svc, model, False)
        stale = self._cap_stale()
        self.budget_item, self.cap_read_at = budget_item, read_at
        cap = effective_budget(model, budget_item, self.config.interactive_yield_per_request,
                               self.interactive.level(model.id, budget_item))
        in_flight = int((budget_item or {}).get("in_flight", 0)) - self.held.releasing
        mine = self.held.kept
        if stale:
            self.wake.set()  # runners held for a fresh cap: here it is
        if in_flight > cap and self.over_since is None:
            self.over_since = time.monotonic()
            self.over_share = mine / in_flight
        elif in_flight <= cap and self.over_since is not None:
            self.over_since = None
            self.wake.set()
        if in_flight > cap and mine > 0:
            # Its share of the excess, never below its part of the cap as things stood when the model went over
            # (`policy.give_back`). Those it keeps start nothing until the model is within its cap
            # (`_holding`); once it is, the lease grows back into it.
            self.held.release = max(self.held.release, policy.give_back(in_flight, cap, mine, self.over_share))
            self.wake.set()
        elif in_flight < cap:
            await self._grow(budget_item, cap)
        return budget_item

    async def _claim(self, want: int, budget_item: dict | None, most: int) -> int:
        """Claim about `want` requests (never more than `most`) in the lease's slots and queue them; returns
        how many were queued."""
        try:
            # The turns go to the batches this pump's runners would start next (those owed starts here).
            standing = policy.standing_in_pump(self.served, self.queued_of)
            # Of a lane, while others have work, no more than its slots run in a wave beside what its batch
            # runs and has queued here (`policy.lane_most_in_pump`): the rest stays for a pump with room.
            here = {batch: n for batch, n in (self.queued_of + Counter(self._running_past())).items()
                    if batch is not None}
            wave = policy.pump_wave(self.held.open, self.ahead, self.model.batch_budget)
            units = await self._claiming(self.dispatcher.claim, self.model, want, self.held.lease, budget_item, most,
                                         standing, wave, here)
        except (ConditionFailed, Throttled):
            return 0
        self.emptied |= self.dispatcher.emptied
        await self._writing(self.dispatcher.stop_those_at_cap)
        if log.isEnabledFor(logging.DEBUG):  # which pump claims what, in how many slots, with what queued
            log.debug("claim pump=%x slots=%d busy=%d queued=%s asked=%d took=%s", id(self), self.held.open,
                      self.busy, dict(+self.queued_of), want,
                      dict(Counter(u.get("batch_id", "retry") for u in units for _ in u.get("positions", [u]))))
        queued = 0
        for unit in units:
            if "positions" not in unit:
                self._enqueue([Member(retry=unit)])
                queued += 1
                continue
            batch = self.dispatcher.batches_seen.get(unit["batch_id"])
            # The account as this claim read it a moment ago: the checks before the start read only the key.
            decided = await self._claiming(self.requests.close_without_running, unit, batch,
                                           self.dispatcher.accounts_read.get(unit["account_id"]))
            if decided:  # its batch stopped or its owner lost access: closed without running
                self.outcome.update(decided)
                continue
            queued += await self._queue_group(unit, batch)
        return queued

    async def _queue_group(self, group: dict, batch: dict | None) -> int:
        if batch is None:
            batch = await self._claiming(Batch.get, self.svc.table, group["batch_id"])
        bodies = await self._claiming(self.requests.bodies, group)
        shared = self.batches.setdefault(group["batch_id"], dict(batch or {}))
        run = GroupRun(group=group, batch=shared, left=len(group["positions"]))
        self._enqueue([Member(run=run, position=position, body=body)
                       for position, body in zip(group["positions"], bodies, strict=True)])
        return len(group["positions"])

    def _enqueue(self, members: list[Member]) -> None:
        """Queue claimed work and wake the runners: the one way work enters the queue, so no claim (a group,
        or retries alone) can leave idle runners asleep beside it until the deadline."""
        # A batch with nothing queued or running here has left: its count goes, and comes back with its work.
        for gone in [b for b in self.served if not self.queued_of[b] and not self.running_of[b]]:
            self.left_with[gone] = self.served.pop(gone)
        created = {batch_id: created_us(batch) for batch_id, batch in self.batches.items()}
        now = time.time()
        for batch_id in {m.run.batch.get("id") for m in members if m.run is not None} - self.served.keys():
            came = policy.arrival_moment(created.get(batch_id, 0) / 1e6, now, batch_id not in self.left_with,
                                         self._memory())
            self.served[batch_id] = policy.served_at_arrival(self.served, self.running_of, created, batch_id,
                                                             policy.ended_since(self.ends, came),
                                                             self.left_with.pop(batch_id, None))
        self.queue.extend(members)
        self.queued_of.update(None if m.run is None else m.run.batch.get("id") for m in members)
        self.wake.set()

    def _refresh_stops(self) -> None:
        """Look again, at most every half second, whether a batch with queued requests was stopped or
        paused."""
        now = time.monotonic()
        for batch_id in {m.run.batch["id"] for m in self.queue if m.run is not None}:
            if now - self.looked_at.get(batch_id, 0.0) < self.config.stop_look_seconds:
                continue
            self.looked_at[batch_id] = now
            current = Batch.get(self.svc.table, batch_id) or {"deleting": True}
            if current.get("stop") or current.get("deleting"):
                self.batches[batch_id]["stop"] = current.get("stop") or "deleting"
            if current.get("paused_at"):
                self.batches[batch_id]["paused_at"] = current["paused_at"]
            else:
                self.batches[batch_id].pop("paused_at", None)

    # --- Outcomes ------------------------------------------------------------------------------------

    def _spawn(self, coroutine) -> None:
        task = asyncio.create_task(coroutine)
        self.writes.add(task)
        task.add_done_callback(self.writes.discard)

    async def _record(self, member: Member, attempt: Attempt) -> None:
        svc, run = self.svc, member.run
        assert run is not None and member.position is not None
        item = await self._writing(self.requests.record, run.group, member.position, self.model, attempt)
        if item is not None:
            run.written.append(item)
        else:
            run.lost = True  # the sweeper recovered this group first
        if attempt.status_code == 429:
            await self._writing(backend_said_429, svc, self.model)
        await self._member_done(run)

    def _hand_back(self, member: Member) -> None:
        if member.retry is not None:  # a retry never started: waiting again (rare: at the end)
            self._spawn(self._writing(self.requests.hand_back_retry, member.retry))
            return
        run = member.run
        assert run is not None and member.position is not None
        item = position_item(self.svc, run.group, member.position,
                             Settlement(to=RequestState.WAITING, retry_at=self.svc.now()), attempt=0)
        run.handed_back.append(item)
        self._spawn(self._member_done(run))

    async def _member_done(self, run: GroupRun) -> None:
        run.left -= 1
        if run.left > 0:
            return
        if run.lost:
            self.outcome["lease_lost"] += len(run.group["positions"])
            return
        try:
            await self._writing(self.requests.close_group, run.group, run.written, tuple(run.handed_back))
        except ConditionFailed:  # recovered meanwhile: the sweeper counted these outcomes from their items
            self.outcome["lease_lost"] += len(run.group["positions"])
            return
        self.outcome.update(item["state"] for item in run.written)
        if run.handed_back:
            self.outcome["handed_back"] += len(run.handed_back)
        if ((self.drained or run.group["batch_id"] in self.emptied) and not self.running_of[run.batch.get("id")]
                and not any(m.run is not None and m.run.batch is run.batch for m in self.queue)):
            # Its last claimed work is done here and nothing of it is left to claim (the pump found no work,
            # or a claim here took its lane's last: other batches may still have work): give it its final
            # status now rather than at the sweeper's next pass (a minute on AWS). Fenced like every settle:
            # work of it still running elsewhere keeps it open.
            await self._writing(self.requests.settle_batch, run.group["batch_id"])


