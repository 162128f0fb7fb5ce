"""The slot pump: a worker invocation keeps a model's backend at its budget from slots it holds (a SlotLease)
and work it claims ahead, refilling each slot the moment its call answers.

The pump decides what runs when (how many slots to hold, how much to claim and when, when to give slots
back, what may start); how one request runs (its checks, its call, its outcome, the writes that settle it)
is the service's, handed in as `RunsRequests` by the worker's entry point (service.running.run_request), so this
package stays below the service.
"""

from __future__ import annotations

import asyncio
import logging
import math
from collections import Counter
from concurrent.futures import ThreadPoolExecutor

from ..catalog import Model
from ..domain import RequestState
from ..layout import group_key
from ..ledger import start_group_in_lease
from ..observability import item_failed
from ..records import Batch
from ..runtime import Services
from ..storage.dynamo import ConditionFailed, Throttled
from . import policy
from .batch_views import BatchViews
from .budget_watch import BudgetWatch
from .call_timing import CallTiming
from .capacity import Draws, note_call_seconds, read_budget
from .claimed_work import GroupRun, Member, RunsRequests
from .clock import REAL_CLOCK, Clock
from .config import SchedulerConfig, scheduler_config
from .dispatcher import Dispatcher
from .fair_queue import FairQueue, created_us, prefix_of
from .held_slots import HeldSlots
from .outcomes import Outcomes
from .threads import on_pool

log = logging.getLogger(__name__)

__all__ = ["SlotPump", "created_us"]


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
      group's close as waiting, due at once and never attempted, so it is claimed again like a retry; none
      starts on a look at its batch older than `stale_stop_seconds` (`_seen_lately`), so a cancel or a pause
      stops the work queued behind the calls in flight within that time;
    - claims run ahead of the slots by about one claim's round trip of work (`lookahead`), so fairness between
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

    def __init__(self, svc: Services, model: Model, deadline: float, requests: RunsRequests,
                 clock: Clock = REAL_CLOCK) -> None:
        """`deadline` on `clock`'s monotonic seconds; `requests` runs what the pump claims."""
        self.svc, self.model, self.deadline, self.requests, self.clock = svc, model, deadline, requests, clock
        config = self.config
        self.held = HeldSlots(svc, model.id)  # the lease and its slots
        self.timing = CallTiming(lambda: self.config, clock)
        self.fair = FairQueue(clock, self.timing.memory, model.cache_kind)
        self.watch = BudgetWatch(svc, model, config, clock)
        self.done_claiming = False
        self.work_queued = asyncio.Event()  # the claimer has work queued, or has stopped
        self.room_made = asyncio.Event()  # a runner took work: the claimer may claim more
        self.runners: set[asyncio.Task] = set()
        self.outcomes = Outcomes(svc, model, requests, self.fair)
        self.views = BatchViews(svc, clock, lambda: self.config)  # the batches of queued work, as it goes by them
        self.claim_began = -math.inf  # when the claim whose batches are being queued began
        self.dispatcher = Dispatcher(svc, runs_what_it_claims=True, stop_at_cap=getattr(requests, "stop_at_cap", None),
                                     clock=clock)
        self.api_key: str | None = None
        # Threads of its own for claims and for writes: a claim must never wait behind the writes of outcomes
        # (nor those behind the rest of the process) for a thread of the shared pool.
        self.claim_pool = ThreadPoolExecutor(1, thread_name_prefix="pump-claim")
        self.closing = False
        # Retries' checks and starts: never behind the writes of outcomes, which may be slow on a busy batch.
        self.start_pool = ThreadPoolExecutor(4, thread_name_prefix="pump-start")

    @property
    def queue(self) -> FairQueue:
        """Claimed requests waiting for a runner."""
        return self.fair

    @property
    def queued_of(self) -> Counter:
        return self.fair.queued_of

    @property
    def served(self) -> dict[str, int]:
        return self.fair.served

    @property
    def outcome(self) -> Counter:
        """What happened to the work this pump claimed, counted."""
        return self.outcomes.counts

    @property
    def busy(self) -> int:
        """Calls in flight."""
        return self.timing.busy

    @property
    def config(self) -> SchedulerConfig:
        return scheduler_config(self.svc.settings)

    async def _claiming(self, fn, *args):  # noqa: ANN001, ANN202 - a thin wrapper of run_in_executor
        return await on_pool(self.claim_pool, fn, *args)


    @property
    def lookahead(self) -> int:
        """Requests claimed beyond the slots (`policy.lookahead`)."""
        return self.timing.lookahead(self.held.slots)

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
            read_at = self.clock.monotonic()
            budget_item = await asyncio.to_thread(read_budget, svc, model)
            # Interactive calls began or ended a moment ago: a new pump remembers none of that load yet, and
            # between one client's call and its next the count dips for a moment (to 0 when calls end
            # together). It watches over the memory's window before taking slots, as running pumps and the
            # dispatcher go by what they saw over it. (A count that stood still for the window needs no watch.)
            while not self.watch.interactive.knows(model.id, budget_item, svc.now_ms()):
                await self.clock.sleep(self.config.poll_seconds)
                read_at = self.clock.monotonic()
                budget_item = await asyncio.to_thread(read_budget, svc, model)
            cap = self.watch.cap(budget_item, self.config.interactive_yield_per_request)
            # From the budget's roomiest shards, as many as it needs (a lease may hold slots of several).
            in_flight = int((budget_item or {}).get("in_flight", 0))
            parts = Draws(budget_item, cap).split(policy.slots_to_take(most, cap, in_flight))
            if sum(n for _, n in parts) <= 0 or self.clock.monotonic() >= self.deadline:
                return self.outcome
            if not await self.held.take(parts):
                return self.outcome  # another claimant took them first
            self.watch.seen(budget_item, read_at)
        else:
            # An adopted group was claimed in the budget as it stood then: look at it again before its first
            # call starts, so a group that waited on the queue while interactive load came does not start over.
            await self._poll_budget()
        self.api_key = await asyncio.to_thread(self.requests.api_key, model)
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
                        self.work_queued.set()
            if failure is not None:
                raise failure
        finally:
            self.done_claiming = True
            self.room_made.set()
            for problem in await asyncio.gather(claimer, return_exceptions=True):
                if isinstance(problem, Exception):  # its claims stand; what it queued still runs or goes back
                    item_failed("pump", model.id, "claim", problem)
            self.closing = True  # no more growth; a grow already written added runners: they end too
            self.watch.stop.set()
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
                self.outcomes.hand_back(self.fair.leftover())
            await self.outcomes.finish()
            await self.held.give_back(self.held.slots)
            try:
                await self._note_latency(stopping=True)
            except Exception as problem:  # a figure for estimates: never worth failing the pump
                log.warning("could not note %s's call time: %r", self.model.id, problem)
            self.claim_pool.shutdown(wait=False)
            self.watch.pool.shutdown(wait=False)
            self.outcomes.pool.shutdown(wait=False)
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
            if self.closing or held.release or held.releasing or self.clock.monotonic() >= self.deadline:
                return
            waiting = policy.waiting_for_a_runner(len(self.queue), held.slots, self.busy)
            in_flight = int((budget_item or {}).get("in_flight", 0))
            # From whichever shards have room.
            parts = Draws(budget_item, cap).split(policy.slots_to_take(waiting, cap, in_flight))
            self._add_runners(await held.grow(parts, self.watch.on_thread))

    async def _runner(self) -> None:
        after = None  # the prefix key of the call this runner ran last: its backend slot holds it
        while True:
            member = await self._next(after)
            if member is None:
                return
            after = prefix_of(member)
            if member.started is not None:
                await self._run_started_retry(member)
                continue
            if member.retry is not None:
                await self._run_retry(member)
                continue
            run = member.run
            assert run is not None and member.position is not None
            if not await self._seen_lately(member, run.batch["id"]) or not self._may_start(run.batch):
                self.outcomes.hand_back(member)
                continue
            started = self._call_starts(member)
            try:
                attempt = await self.requests.call(self.model, run.batch, member.body or {}, self.api_key)
            finally:
                self._call_ended(member)
            self._measured(started)
            self.outcomes.answered(member, attempt)

    async def _run_retry(self, member: Member) -> None:
        """A retried request: its checks and start on the pump's threads, its call in the slot, and its outcome
        written beside the next call, not before it, as a group member's is (the slot is the lease's: the
        settle gives none back to the budget)."""
        assert member.retry is not None
        started = await on_pool(self.start_pool, self.requests.start_retry, member.retry)
        if isinstance(started, str):  # did not start (its batch stopped or paused, ...): recorded so
            self.outcome[started] += 1
            return
        began = self._call_starts(member)
        try:
            attempt = await self.requests.call(self.model, started.batch, started.body, self.api_key)
        finally:
            self._call_ended(member)
        self._measured(began)
        self.outcomes.retry_answered(started, attempt)

    async def _run_started_retry(self, member: Member) -> None:
        """A retry claimed running and checked with others of its batch: its call in the slot, unless its batch
        stopped or paused meanwhile (or its window closed, for one that never ran): then it is handed back."""
        started = member.started
        batch = started.batch
        never_ran = int(started.running.get("attempt", 1)) <= 1
        if (not await self._seen_lately(member, batch["id"]) or batch.get("stop") or batch.get("paused_at")
                or (never_ran and self.svc.now() >= batch["expires_at"])):
            self.outcomes.hand_back(member)
            return
        began = self._call_starts(member)
        try:
            attempt = await self.requests.call(self.model, batch, started.body, self.api_key)
        finally:
            self._call_ended(member)
        self._measured(began)
        self.outcomes.retry_answered(started, attempt)

    def _measured(self, started: float) -> None:
        """A call answered: how long calls take moves (the first answer replaces the guess)."""
        self.timing.measured(started)

    def _call_starts(self, member: Member) -> float:
        started = self.timing.starts(member)
        self.fair.started(member)
        return started

    def _call_ended(self, member: Member) -> None:
        if self.timing.ends(member):
            self.fair.ended(member)

    def _take_next(self, after: str | None = None) -> Member:
        return self.fair.take_next(after)

    async def _next(self, after: str | None = None) -> Member | None:
        """The next claimed request for a free slot, or None when this runner must stop (its slot goes back)."""
        while True:
            if self.held.release > 0:
                await self.held.release_one()
                return None
            if self.clock.monotonic() >= self.deadline:
                return None
            if self.queue and (self._holding() or self._cap_stale()):
                self.work_queued.clear()
                await self.clock.wait(self.work_queued, self.config.poll_seconds)
                continue
            if self.queue:
                self.room_made.set()
                return self._take_next(after)
            if self.done_claiming:
                return None
            self.room_made.set()  # a runner with nothing to run: the claim loop looks again
            self.work_queued.clear()
            await self.work_queued.wait()

    def _holding(self) -> bool:
        """Over the cap (interactive load came, or the backend said 429): the slots this lease keeps start no
        new call until the calls running above the cap have ended and their slots gone back ("running calls
        may finish, new ones must not start"), whichever worker runs them. Bounded by the backend timeout, the
        longest a running call can take: slots still held past it are a dead worker's (given back when the
        sweeper recovers its lease), and must not stop the floor's own work until then."""
        return self.watch.holding(self.config.backend_timeout_seconds)

    def _wanted(self, soon: int, most: int) -> int:
        """What a claim made now should bring, within what can start in time (`policy.wanted`)."""
        return policy.wanted(self.held.idle(self.busy), soon, self.lookahead, len(self.queue), most)

    def _can_start_in_time(self) -> int:
        """How many more requests the slots can start before the deadline, past what is queued."""
        return self.timing.can_start_in_time(self.held.open, self.deadline, len(self.queue))

    def _claim_at(self) -> int:
        return policy.claim_at(self.lookahead)

    def _cap_stale(self) -> bool:
        return self.watch.stale(self.config.stale_cap_seconds)

    def _may_start(self, batch: dict) -> bool:
        """A first attempt starts only while its batch runs, unpaused, and its window is open (the claim
        checked all three; a stop or a pause a look has seen since (`_seen_lately`), or the window closing, hands
        it back)."""
        return not batch.get("stop") and not batch.get("paused_at") and self.svc.now() < batch["expires_at"]

    # --- Claims --------------------------------------------------------------------------------------

    async def _claim_loop(self) -> None:
        idle_since: float | None = None
        polled = 0.0
        try:
            while self.clock.monotonic() < self.deadline and self.held.slots > 0:
                config = self.config
                if self.clock.monotonic() - polled >= config.poll_seconds:  # not at every wake: on its own clock
                    polled = self.clock.monotonic()
                    await self._claiming(self._refresh_stops)
                # Claim for the slots that will be free when the claim lands (idle runners, and calls expected
                # to answer by then) and `ahead` more, once half of `lookahead` is missing. Just in time, not a round
                # early: work claimed ahead runs before any batch that arrives after it, and a claim made a round
                # early kept a new batch waiting a whole round of calls. Claims cost the same whatever their
                # size (each makes a group, whose close costs the same): at least a batch's share of the slots
                # (a round while one batch has work; while many do, the dispatcher gives each lane it serves
                # a whole quantum, and a lane's last few requests with it, whatever this asks for).
                floor = policy.claim_floor(self.held.open, config.lane_quantum,
                                           self.dispatcher.lanes.seen, self.timing.ahead_most(self.held.open))
                soon, next_soon = self.timing.ending_soon()
                most = self._can_start_in_time()
                want = self._wanted(soon, most)
                got = 0
                if policy.should_claim(want, self._claim_at(), len(self.queue)):
                    started = self.clock.monotonic()
                    got = await self._claim(policy.claim_size(want, floor, most), self.watch.item, most)
                    self.timing.claim_took(self.clock.monotonic() - started)
                drained = self.outcomes.drained = want > 0 and not got
                if got or self.queue or self.busy:
                    idle_since = None
                elif idle_since is None:
                    idle_since = self.clock.monotonic()
                elif self.clock.monotonic() - idle_since >= config.idle_seconds:
                    return  # no work for a while: the runners stop and the slots go back
                if got:
                    continue  # look again at once: the queue may still be short
                # Wait for runners to take work, a call to come within a claim's round trip of its answer, or
                # the next look for stopped batches. A claim that found nothing it may start (the lanes empty,
                # the account at its limit) is not made again at once: only once a call of this pump ends
                # (room for one more, its account's too) or at the next poll, so that an empty claim never
                # repeats as fast as the table answers.
                self.room_made.clear()
                until = min(polled + config.poll_seconds, self.clock.monotonic() + (math.inf if drained else next_soon))
                while self.clock.monotonic() < until:
                    if not drained:
                        soon, next_soon = self.timing.ending_soon()
                        until = min(until, self.clock.monotonic() + next_soon)
                        short = self._wanted(soon, self._can_start_in_time())
                        if policy.should_claim(short, self._claim_at(), len(self.queue),
                                               idle=idle_since is not None):
                            break
                    if not await self.clock.wait(self.room_made, max(0.0, until - self.clock.monotonic())):
                        break
                    self.room_made.clear()
                    if drained:
                        break
        finally:
            self.done_claiming = True
            self.work_queued.set()

    async def _poll_loop(self) -> None:
        while not self.watch.stop.is_set():
            await self.clock.wait(self.watch.stop, self.config.poll_seconds)
            if self.watch.stop.is_set():
                return
            try:
                await self._poll_budget()
                await self._note_latency()
            except Throttled:
                log.warning("could not read %s's budget now; polling again", self.model.id)

    async def _note_latency(self, stopping: bool = False) -> None:
        """What the calls that answered here since the last note teach, on the budget, where estimates of a
        batch's end read it: every few seconds while the pump runs, at once when the budget has no fresh
        figure, and when the pump stops (a short batch's calls count too)."""
        seconds = self.timing.note_due(stopping, self.watch.noted_call_seconds(self.config.latency_fresh_seconds))
        if seconds is None:
            return
        await asyncio.to_thread(note_call_seconds, self.svc, self.model, seconds)
        if self.watch.item is not None:  # until the next poll reads it back
            self.watch.item = {**self.watch.item, "call_seconds": seconds, "call_seconds_at": self.svc.now()}

    async def _poll_budget(self) -> dict | None:
        """Read the budget; when it has shrunk, stop runners after their current call, this lease's share of
        the excess (other holders give back theirs), counting those already told to stop; when it has room
        and claimed work waits behind busy runners, grow into it."""
        svc, model = self.svc, self.model
        read_at = self.clock.monotonic()
        budget_item = await self.watch.on_thread(read_budget, svc, model, False)
        stale = self._cap_stale()
        self.watch.seen(budget_item, read_at)
        cap = self.watch.cap(budget_item, self.config.interactive_yield_per_request)
        in_flight = int((budget_item or {}).get("in_flight", 0)) - self.held.releasing
        mine = self.held.kept
        if stale:
            self.work_queued.set()  # runners held for a fresh cap: here it is
        if self.watch.over(in_flight, cap, mine):
            self.work_queued.set()  # back within the cap: the runners kept may start again
        if in_flight > cap and mine > 0:
            # Its share of the excess, never below its part of the cap as things stood when the model went over
            # (`policy.give_back`). Those it keeps start nothing until the model is within its cap
            # (`_holding`); once it is, the lease grows back into it.
            self.held.release = max(self.held.release, policy.give_back(in_flight, cap, mine, self.watch.over_share))
            self.work_queued.set()
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
            here = {batch: n for batch, n in (self.queued_of + Counter(self.timing.running_past())).items()
                    if batch is not None}
            wave = policy.pump_wave(self.held.open, self.lookahead, self.model.batch_budget)
            self.claim_began = self.clock.monotonic()
            units = await self._claiming(self.dispatcher.claim, self.model, want, self.held.lease, budget_item, most,
                                         standing, wave, here)
        except (ConditionFailed, Throttled):
            return 0
        self.outcomes.emptied |= self.dispatcher.emptied
        await self.outcomes.on_thread(self.dispatcher.stop_those_at_cap)
        if log.isEnabledFor(logging.DEBUG):  # which pump claims what, in how many slots, with what queued
            log.debug("claim pump=%x slots=%d busy=%d queued=%s asked=%d took=%s", id(self), self.held.open,
                      self.busy, dict(+self.queued_of), want,
                      dict(Counter(u.get("batch_id", "retry") for u in units for _ in u.get("positions", [u]))))
        queued = 0
        claimed_running: dict[str, list[dict]] = {}  # batch id -> its retries claimed running, checked together
        for unit in units:
            if "positions" not in unit and unit["state"] == RequestState.RUNNING.value:
                claimed_running.setdefault(unit["batch_id"], []).append(unit)
                continue
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
        for batch_id, running in claimed_running.items():
            queued += await self._queue_started_retries(running, self.dispatcher.batches_seen[batch_id])
        return queued

    async def _queue_started_retries(self, running: list[dict], batch: dict) -> int:
        """Retries of one batch claimed running: checked once for them all (the account as the claim read it),
        their bodies read together, then queued ready for their calls."""
        shared = self._shared_batch(batch["id"], batch)
        started, decided = await self._claiming(self.requests.start_claimed_retries, running, shared,
                                                self.dispatcher.accounts_read.get(batch["account_id"]))
        self.outcome.update(decided)
        if started:
            self._enqueue([Member(retry=one.running, started=one) for one in started])
        return len(started)

    async def _queue_group(self, group: dict, batch: dict | None) -> int:
        if batch is None:
            batch = await self._claiming(Batch.get, self.svc.table, group["batch_id"])
        bodies = await self._claiming(self.requests.bodies, group)
        shared = self._shared_batch(group["batch_id"], batch)
        run = GroupRun(group=group, batch=shared, left=len(group["positions"]))
        self._enqueue([Member(run=run, position=position, body=body)
                       for position, body in zip(group["positions"], bodies, strict=True)])
        return len(group["positions"])

    def _shared_batch(self, batch_id: str, read: dict | None) -> dict:
        """The one dict of a batch that its queued work here shares, made current with the claim's read."""
        return self.views.claimed(batch_id, read, self.claim_began)

    def _enqueue(self, members: list[Member]) -> None:
        """Queue claimed work and wake the runners: the one way work enters the queue, so no claim (a group,
        or retries alone) can leave idle runners asleep beside it until the deadline."""
        self.fair.add(members, self.views.shared)
        self.work_queued.set()

    def _refresh_stops(self) -> None:
        """Look again, every `stop_look_seconds`, whether a batch with queued requests was stopped or paused."""
        self.views.refresh({m.run.batch["id"] if m.run is not None else m.started.batch["id"] for m in self.queue
                            if m.run is not None or m.started is not None})

    async def _seen_lately(self, member: Member, batch_id: str) -> bool:
        """Whether the member may go by its batch as last seen: a look at it began at most `stale_stop_seconds`
        ago, or else one begun now has answered (the runners free meanwhile share it), so no queued request
        starts on a view of its batch older than that, however slow the claims that look every
        `stop_look_seconds`. A look that fails: False, and the member is handed back, not started on an old
        view. Its slot counts busy meanwhile: a claim must not count it free."""
        if self.views.seen_lately(batch_id):
            return True
        self.timing.starts(member)
        try:
            await self.views.look_unless_seen_lately(batch_id, self.start_pool)
            return True
        except Exception as problem:  # a throttled or failing read: the member is claimed again later
            log.warning("could not look at batch %s before a call: %r", batch_id, problem)
            return False
        finally:
            self.timing.ends(member)  # the call's own timing starts with the call
