"""A pump's outcomes: each answered call's outcome written beside the next call (never before it), a group
closed once all its members are written or handed back, and a batch given its final status as soon as its
last claimed work here is done and nothing of it is left to claim.
"""

from __future__ import annotations

import asyncio
import logging
from collections import Counter
from concurrent.futures import ThreadPoolExecutor

from ..catalog import Model
from ..domain import Attempt, RequestState
from ..ledger import Settlement, position_item
from ..runtime import Services
from ..storage.dynamo import ConditionFailed
from .capacity import backend_said_429
from .claimed_work import GroupRun, Member, RunsRequests
from .fair_queue import FairQueue
from .threads import on_pool

log = logging.getLogger(__name__)


class Outcomes:
    """The writes that settle what a pump ran, on threads of their own (a claim never waits behind them),
    and the counts of what happened."""

    def __init__(self, svc: Services, model: Model, requests: RunsRequests, queue: FairQueue) -> None:
        self.svc, self.model, self.requests, self.queue = svc, model, requests, queue
        self.counts: Counter = Counter()
        self.drained = False  # the last claim found no work: what is queued is the end of it
        self.emptied: set[str] = set()  # batches whose lane on the model a claim here took the last of
        self.pool = ThreadPoolExecutor(8, thread_name_prefix="pump-write")
        self.writes: set[asyncio.Task] = set()
        self.retries_answered: list[tuple] = []  # retries whose call answered, their outcomes not yet written
        self.writing_retries = False

    async def on_thread(self, fn, *args):  # noqa: ANN001, ANN201 - a thin wrapper of run_in_executor
        """`fn` on the writers' threads."""
        return await on_pool(self.pool, fn, *args)

    def spawn(self, coroutine) -> None:  # noqa: ANN001 - any write's coroutine
        """A write beside the calls: awaited only when the pump stops (`finish`)."""
        task = asyncio.create_task(coroutine)
        self.writes.add(task)
        task.add_done_callback(self.writes.discard)

    async def finish(self) -> None:
        """Every write spawned so far (and those they spawn) done; the writers' threads let go."""
        while self.writes:
            await asyncio.gather(*list(self.writes), return_exceptions=True)

    def answered(self, member: Member, attempt: Attempt) -> None:
        self.spawn(self._record(member, attempt))

    async def _record(self, member: Member, attempt: Attempt) -> None:
        svc, run = self.svc, member.run
        assert run is not None and member.position is not None
        item = await self.on_thread(self.requests.record, run.group, member.position, self.model, attempt)
        if item is not None:
            run.written.append(item)
        else:
            run.lost = True  # the sweeper recovered this group first
        if attempt.status_code == 429:
            await self.on_thread(backend_said_429, svc, self.model)
        await self._member_done(run)

    def hand_back(self, member: Member) -> None:
        """A claimed request that did not start: waiting again, due at once and never attempted."""
        if member.retry is not None:  # a retry never started: waiting again (rare: at the end)
            self.spawn(self.on_thread(self.requests.hand_back_retry, member.retry))
            return
        run = member.run
        assert run is not None and member.position is not None
        item = position_item(self.svc, run.group, member.position,
                             Settlement(to=RequestState.WAITING, retry_at=self.svc.now()), attempt=0)
        run.handed_back.append(item)
        self.spawn(self._member_done(run))

    async def _member_done(self, run: GroupRun) -> None:
        run.left -= 1
        if run.left > 0:
            return
        if run.lost:
            self.counts["lease_lost"] += len(run.group["positions"])
            return
        try:
            await self.on_thread(self.requests.close_group, run.group, run.written, tuple(run.handed_back))
        except ConditionFailed:  # recovered meanwhile: the sweeper counted these outcomes from their items
            self.counts["lease_lost"] += len(run.group["positions"])
            return
        self.counts.update(item["state"] for item in run.written)
        if run.handed_back:
            self.counts["handed_back"] += len(run.handed_back)
        if ((self.drained or run.group["batch_id"] in self.emptied) and not self.queue.running_of[run.batch.get("id")]
                and not any(m.run is not None and m.run.batch is run.batch for m in self.queue)):
            # Its last claimed work is done here and nothing of it is left to claim (the pump found no work,
            # or a claim here took its lane's last: other batches may still have work): give it its final
            # status now rather than at the sweeper's next pass (a minute on AWS). Fenced like every settle:
            # work of it still running elsewhere keeps it open.
            await self.on_thread(self.requests.settle_batch, run.group["batch_id"])

    def retry_answered(self, started, attempt: Attempt) -> None:  # noqa: ANN001 - the service's own type
        self.spawn(self._finish_retry(started, attempt))

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
                    self.counts.update(await self.on_thread(self.requests.finish_retries, answered))
                except Exception as problem:  # as if this worker died writing them: their leases run out and
                    # the sweeper puts them back; the answers that came in meanwhile are still written
                    log.error("writing %d answered retries failed: %r", len(answered), type(problem))
                    continue
                if self.drained and not any(m.retry is not None for m in self.queue):
                    # Nothing left to claim: as after a group's close, the batches' final status now rather
                    # than at the sweeper's next pass (fenced like every settle: work still running keeps it open).
                    for batch_id in {started.running["batch_id"] for started, _ in answered}:
                        await self.on_thread(self.requests.settle_batch, batch_id)
        finally:
            self.writing_retries = False
