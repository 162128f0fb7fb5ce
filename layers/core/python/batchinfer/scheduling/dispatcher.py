"""The dispatcher: the claim pass. Due requests of a model, within its budget and its accounts' tier limits:
retries first, then batches in turn (`lanes`); sent to the model's queue, or run in a worker's slot lease.
"""

from __future__ import annotations

import logging
import math
import time
from collections import Counter
from collections.abc import Callable

from ..catalog import Model
from ..domain import RequestState
from ..ledger import GROUP_MAX, claim_retries_running, claim_retry, defer_while_paused, queue_message
from ..observability import Bulkhead
from ..records import Batch, Request
from ..runtime import Services
from ..storage.dynamo import ConditionFailed, Throttled
from .capacity import Draws, InteractiveMemory, effective_budget, probe_up, read_budget
from .clock import REAL_CLOCK, Clock
from .config import SchedulerConfig, scheduler_config
from .lanes import AccountSlots, ClaimScope, Lanes
from .policy import walk_order

log = logging.getLogger(__name__)


def _model_key(model: Model) -> str:
    return f"model:{model.id}"


class Dispatcher:
    """Keeps a little state between passes inside one invocation: whose turn it is, lane positions
    (`lanes`), the interactive load seen lately."""

    def __init__(self, svc: Services, runs_what_it_claims: bool = False,
                 stop_at_cap: Callable[[str], object] | None = None, clock: Clock = REAL_CLOCK) -> None:
        self.svc = svc
        self.clock = clock  # what its memory of the interactive load is timed on (a test's, moved by hand)
        # What stops a capped batch that a claim finds can start nothing more (the service's, handed in: the
        # scheduler stays below it); without one, the sweeper's next look stops it.
        self.stop_at_cap = stop_at_cap
        # A worker pulling work runs it at once: its groups are claimed already running (one transaction
        # fewer per group; the claim is fenced against a stopped batch as a start is).
        self.runs_what_it_claims = runs_what_it_claims
        self.lanes = Lanes(svc)
        self.batches_seen: dict[str, dict] = {}  # the batches read by the last claims, for a worker to reuse
        self.emptied: set[str] = set()  # the batches whose lane on the model the last claim took the last of
        self.at_cap: set[str] = set()  # the capped batches the last claim found can start nothing more
        # The accounts the last claim read (`AccountSlots.read`), for a worker running its groups at once.
        self.accounts_read: dict[str, tuple[str, dict | None, dict | None]] = {}
        # The interactive load seen lately, per model.
        self.interactive = InteractiveMemory(self.config.interactive_window_seconds, clock)

    @property
    def config(self) -> SchedulerConfig:
        return scheduler_config(self.svc.settings)

    def run(self, seconds: float, time_left: Callable[[], float] | None = None) -> int:
        """Refill free slots until `seconds` have passed, or `time_left` (the invocation's, in seconds) is
        up; a freed slot waits at most one idle sleep."""
        deadline = time.monotonic() + seconds
        sent = 0
        while True:
            n = self.pass_once()
            sent += n
            if time.monotonic() >= deadline or (time_left is not None and time_left() <= 0):
                return sent
            if n == 0:
                time.sleep(self.config.idle_sleep_seconds)

    def pass_once(self) -> int:
        sent = 0
        # Each model in a bulkhead: one whose claim raises is logged, counted and passed over (taken last in
        # the next pass), and the other models are dispatched all the same.
        failed = self.svc.failed_last
        for model in walk_order(self.svc.catalog.runnable, _model_key, failed, turn=0):
            with Bulkhead("dispatcher", _model_key(model), "claim", failed):
                try:
                    sent += self.dispatch_model(model)
                except Throttled:
                    log.warning("throttled while dispatching %s", model.id)
        return sent

    def dispatch_model(self, model: Model) -> int:
        """Claim what the model has room for and send it to the model's queue."""
        dispatched = self.claim(model)
        self.stop_those_at_cap()
        if dispatched:
            try:
                failed = self.svc.queues.send(model.id, [queue_message(r) for r in dispatched])
            except Exception:  # the claims stand; their leases run out and the sweeper puts them back
                log.exception("could not send %d messages for %s", len(dispatched), model.id)
                failed = dispatched
            if failed:
                log.warning("SQS refused %d messages for %s; the lease recovers them", len(failed), model.id)
        return sum(len(unit.get("positions", [unit])) for unit in dispatched)

    def stop_those_at_cap(self) -> None:
        """Stop the capped batches the last claim found can start nothing more (see `stop_at_cap`)."""
        for batch_id in sorted(self.at_cap) if self.stop_at_cap is not None else ():
            # One batch whose stop raises does not keep the claimed work of the others from being sent.
            with Bulkhead("dispatcher", batch_id, "stop at its spending cap"):
                try:
                    self.stop_at_cap(batch_id)
                except Throttled:  # the sweeper's next look stops it
                    log.warning("throttled while stopping batch %s at its spending cap", batch_id)

    def claim(self, model: Model, limit: int | None = None, slot_lease: dict | None = None,
              budget_item: dict | None = None, most: int | None = None,
              standing: dict[str, int] | None = None, wave: int | None = None,
              here: dict[str, int] | None = None) -> list[dict]:
        """Claim up to `limit` due requests of the model within its budget and the accounts' tier limits,
        retries first, then batches in turn. Returns what was dispatched (not yet sent): retried requests,
        and groups of first attempts. With `slot_lease` (and the `budget_item` its holder just read), they
        run in the lease's slots: about `limit` of them, whatever the budget has free (while many lanes
        wait, a whole quantum for each lane served: its holder queues what its slots cannot run yet), and
        never more than `most` (what its holder can start in time), if given; `standing`: where each batch
        with work in the holder's pump stands there (its turns go to the lowest first); `wave` and `here`:
        what the holder's slots run in about a wave and, per batch, its requests running or queued there
        (while other lanes have work, a lane gives it no more than the difference: `policy.lane_most_in_pump`)."""
        svc = self.svc
        self.batches_seen = {}
        self.emptied = set()
        self.at_cap = set()
        self.accounts_read = {}
        if slot_lease is None:
            budget_item = read_budget(svc, model)
            probe_up(svc, model, budget_item)
        level = self.interactive.level(model.id, budget_item)
        if slot_lease is None and not self.interactive.knows(model.id, budget_item, svc.now_ms()):
            return []  # interactive load moved a moment ago and this dispatcher is new: it watches first
        cap = effective_budget(model, budget_item, self.config.interactive_yield_per_request, level)
        # The budget's shards as this claim read them (without a lease), the lease its work runs in (if any),
        # the most it may take in that lease.
        scope = ClaimScope(draws=Draws(budget_item, cap), slot_lease=slot_lease,
                           most=math.inf if most is None else most, running=self.runs_what_it_claims,
                           batches_seen=self.batches_seen, emptied=self.emptied, standing=standing or {},
                           at_cap=self.at_cap, wave=wave, here=dict(here or {}))
        free = cap - int((budget_item or {}).get("in_flight", 0)) if slot_lease is None else int(limit or 0)
        if limit is not None:
            free = min(free, limit)
        if free <= 0:
            return []
        accounts = AccountSlots(svc)  # read once per pass
        self.accounts_read = accounts.read
        dispatched: list[dict] = []

        # Requests waiting for a retry go first: they have already waited their turn. The model's
        # `waiting` count says whether there are any, so an idle retry set costs no index query.
        waiting: list[dict] = []
        if int((budget_item or {}).get("waiting", 0)) > 0:
            waiting = Request.due_retries(svc.table, model.id, svc.now(), limit=free)
        # Where workers pull work, a retry sent to the queue seeds a worker whose pump takes up to
        # `worker_pull_limit` free slots and claims the other due retries in them, ahead of its calls, as a
        # group's worker does. One message per retry would start a pump per slot, each claiming the same due
        # retries against the others (and a retried batch is all retries).
        seeds = (math.ceil(free / svc.settings.worker_pull_limit) if slot_lease is None and svc.settings.worker_pull
                 else free)
        # The index holds keys only: the requests as they are now, in strongly consistent reads of up to 100
        # (BatchGetItem's most) rather than one each; a claim is fenced on the state and token it read anyway.
        keys = [(stale["pk"], stale["sk"]) for stale in waiting]
        current: dict = {}
        for at in range(0, len(keys), 100):
            current.update(svc.table.get_many(keys[at:at + 100]))
        if slot_lease is not None and self.runs_what_it_claims:
            # A pump that runs what it claims takes the due retries of a batch together, already running, as it
            # takes a lane's requests: one transaction for up to a group's worth, not a claim and a start each.
            # Those it could not take so (one moved meanwhile) go on below, one at a time.
            together, waiting, throttled = self._retries_together(waiting, current, free, accounts, slot_lease)
            dispatched += together
            free = 0 if throttled else free - len(together)
        for stale in waiting:
            if free <= 0:
                break
            if len(dispatched) >= seeds:
                free = 0  # the rest of the free slots are the seeded pumps': retries still go first
                break
            req = current.get((stale["pk"], stale["sk"]))
            if not req or req.get("state") != RequestState.WAITING.value or accounts.free(req["account_id"]) <= 0:
                continue
            one = None if slot_lease else scope.draws.split(1)  # a slot of the roomiest shard
            if one == []:
                break
            take = one[0][0] if one else None
            try:
                dispatched.append(claim_retry(svc, req, take, accounts.cap(req["account_id"]), slot_lease=slot_lease))
                if take is not None:
                    scope.draws.took(take.shard, 1)
            except ConditionFailed:
                # Another dispatcher took it, the budget filled, or the batch stopped; look again next pass.
                # A paused batch's request is put off until its window's end (a resume brings it back), so
                # that it does not stand at the head of the due retries pass after pass.
                batch = Batch.get(svc.table, req["batch_id"])
                if batch and batch.get("paused_at") and not batch.get("stop"):
                    defer_while_paused(svc, req, batch)
                continue
            except Throttled:
                free = 0  # DynamoDB is busy: stop claiming this pass, but send what was claimed
                break
            free -= 1
            accounts.took(req["account_id"], 1)

        if free > 0:
            try:
                dispatched += self.lanes.serve(model, free, accounts, scope)
            except Throttled:
                log.warning("throttled while claiming for %s", model.id)
        return dispatched

    def _retries_together(self, waiting: list[dict], current: dict, free: int, accounts: AccountSlots,
                          slot_lease: dict) -> tuple[list[dict], list[dict], bool]:
        """Claim the due retries (`waiting`, as the index has them; `current`: as they are now) within `free`
        and their accounts' free slots, a batch's together (`ledger.claim_retries_running`), running in the
        slot lease. Returns (those claimed, the index entries left for a claim one at a time, whether DynamoDB
        said it was busy: then the claim stops, and sends what it claimed)."""
        svc = self.svc
        of_batch: dict[str, list[tuple[dict, dict]]] = {}
        taking: Counter = Counter()
        reached = 0
        for stale in waiting:
            if sum(taking.values()) >= free:
                break
            reached += 1
            req = current.get((stale["pk"], stale["sk"]))
            if not req or req.get("state") != RequestState.WAITING.value:
                continue
            if accounts.free(req["account_id"]) - taking[req["account_id"]] <= 0:
                continue
            of_batch.setdefault(req["batch_id"], []).append((stale, req))
            taking[req["account_id"]] += 1
        claimed: list[dict] = []
        left: list[dict] = waiting[reached:]
        try:
            for batch_id, entries in of_batch.items():
                batch = Batch.get(svc.table, batch_id)
                if batch is None or batch.get("stop") or batch.get("paused_at"):
                    left += [stale for stale, _ in entries]  # decided one at a time, as ever
                    continue
                self.batches_seen[batch_id] = batch
                for at in range(0, len(entries), GROUP_MAX):
                    part = entries[at:at + GROUP_MAX]
                    try:
                        claimed += claim_retries_running(svc, batch, [req for _, req in part],
                                                         accounts.cap(batch["account_id"]), slot_lease)
                        accounts.took(batch["account_id"], len(part))
                    except ConditionFailed:
                        left += [stale for stale, _ in part]
        except Throttled:
            return claimed, [], True
        return claimed, left, False
