"""The ledger: every change of a request's state, with the counters it moves, written atomically.

Each write is one DynamoDB transaction fenced by the request's current state and token, so a duplicate
SQS delivery, a worker that lost its lease or a second dispatcher loses the condition instead of
recording an outcome twice. Slots (model and account `in_flight`) are taken and given back in the same
transactions, so budgets can never drift from the requests that hold them.

First attempts travel in groups (a lease over up to GROUP_MAX requests of one batch): the claim, the start
and the outcome of a group are one transaction each whatever its size, and each member's result is one
plain conditional put, so a request costs a few write units rather than one transaction per change.
Retries travel alone, request by request, but for the due retries of a batch that a pump claims together,
already running (`claim_retries_running`), and whose answers it writes together (`settle_many`).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field, replace

from .domain import RequestState, Stop, counts_as_failed_unstarted, new_token, request_transition, unstarted_error
from .layout import group_key, lease_due, request_key, retry_due
from .records import (
    Account,
    Batch,
    BatchItem,
    Budget,
    Group,
    GroupItem,
    Lane,
    Request,
    RequestItem,
    SlotLease,
    Usage,
    analytics,
    finished_members,
    group_shards,
    lease_shards,
    shards_map,
    transact_counted,
)
from .runtime import Services
from .spending import settled_delta
from .storage.dynamo import ConditionFailed

SLOT_HOLDERS = (RequestState.DISPATCHED, RequestState.RUNNING)
GROUP_MAX = 25  # requests per group (the outcome transaction of a group that never ran writes each of them)


@dataclass
class Position:
    """One undispatched request read from a batch's index."""

    index: int
    custom_id: str
    offset: int
    length: int
    worst_usd: float | None = None  # the most one attempt can cost, when its batch has a spending cap
    prefix: str | None = None  # its prefix key (what a prompt cache shares), kept fifth in its group's positions

    def stored(self) -> list:
        """Its place in its group's `positions`: [index, custom_id, offset, length(, prefix key)]."""
        kept = [self.index, self.custom_id, self.offset, self.length]
        return kept if self.prefix is None else [*kept, self.prefix]


@dataclass(frozen=True)
class ShardTake:
    """Where a take of the model's batch slots comes from: one shard of its budget, within the shard's share
    of the cap (`cap`), fenced on the shard's interactive count as the taker read it (`interactive_seen`);
    `room`: how many it had free then (scheduling.capacity.Draws picks them)."""

    shard: int
    cap: int
    interactive_seen: int | None
    room: int


@dataclass
class Settlement:
    """What an ended attempt (or a decision not to run) adds to the batch."""

    to: RequestState
    error: dict | None = None
    response: dict | None = None
    response_object: str | None = None
    input_tokens: int = 0
    output_tokens: int = 0
    cached_tokens: int = 0
    reasoning_tokens: int = 0
    cost_usd: float = 0.0
    cache_saved_usd: float = 0.0  # what its cached input cost less than uncached input would have
    cost_unknown: int = 0
    retry_at: int | None = None  # for WAITING
    result_bytes: int = 0  # size of a stored result, so the export knows when to go through S3
    committed_usd: float = 0.0  # what it gives back of its batch's committed worst case (spending.settled_delta)
    extra: dict = field(default_factory=dict)
    attempt: dict | None = None  # the attempt it ends, for the batch's analytics (records.analytics.attempt_tally)
    # WAITING because its batch is paused: put off from the start (`Request.put_off`), out of its model's
    # `waiting` count, in the write that puts it back, fenced on the batch still paused; so that a worker
    # dying after that write leaves no count to fix.
    uncounted: bool = False
    # A request run on a provider's batch tier (service.offloading): what it saved against the model's price,
    # and -1 as it leaves its job's hold (the batch's `offloaded` count).
    saved_usd: float = 0.0
    offloaded: int = 0


# The Settlement figures that add to the batch's counters (a group member's item keeps them in `tally`).
TALLIED = ("input_tokens", "output_tokens", "cached_tokens", "reasoning_tokens", "cost_usd", "cost_unknown",
           "result_bytes", "committed_usd", "cache_saved_usd", "saved_usd", "offloaded")


@dataclass
class CounterDeltas:
    """What a set of request state changes adds to each counter (the batch's, the model's budget, the
    account's slots and usage), summed so that one transaction writes them."""

    batch: dict[str, float] = field(default_factory=dict)
    model: dict[str, int] = field(default_factory=dict)
    account_in_flight: int = 0
    cost_usd: float = 0.0
    answered: bool = False  # an attempt was answered: the batch's last finish moves (records.analytics)

    def add(self, was: RequestState, outcome: Settlement, stop: Stop | None, leased: bool = False,
            counted: bool = True) -> None:
        """`leased`: the request ran in a SlotLease's slots, which go back to the budget with the lease;
        `counted`: a waiting request is in its model's `waiting` count (a pause takes its batch's out)."""
        def bump(counters: dict, name: str, by: float) -> None:
            counters[name] = counters.get(name, 0) + by

        request_transition(was, outcome.to)
        if was in SLOT_HOLDERS:  # the slot goes back
            bump(self.batch, "in_flight", -1)
            if not leased:
                bump(self.model, "in_flight", -1)
            self.account_in_flight -= 1
        if outcome.to in (RequestState.COMPLETED, RequestState.FAILED, RequestState.UNSTARTED):
            bump(self.batch, "#open", -1)
        if outcome.to is RequestState.COMPLETED:
            bump(self.batch, "completed", 1)
        elif outcome.to is RequestState.FAILED or (outcome.to is RequestState.UNSTARTED
                                                    and counts_as_failed_unstarted(stop)):
            bump(self.batch, "failed", 1)
        if outcome.to is RequestState.UNSTARTED:  # a Message Batch shows these as canceled or expired
            bump(self.batch, "unstarted", 1)
        for name in TALLIED:
            value = getattr(outcome, name)
            if value:
                bump(self.batch, "cost_unknown_attempts" if name == "cost_unknown" else name, value)
        self.cost_usd += outcome.cost_usd
        if outcome.attempt is not None:
            ended = outcome.to in (RequestState.COMPLETED, RequestState.FAILED)
            for name, by in analytics.counters(outcome.attempt, ended).items():
                bump(self.batch, name, by)
            self.answered = self.answered or outcome.attempt.get("ms") is not None
        # `waiting` counts requests waiting for a retry, so that dispatchers only look for due retries
        # when there are any.
        if outcome.to is RequestState.WAITING and was is not RequestState.WAITING:
            if not outcome.uncounted:
                bump(self.model, "waiting", 1)
        elif was is RequestState.WAITING and outcome.to is not RequestState.WAITING and counted:
            bump(self.model, "waiting", -1)

    def ops(self, svc: Services, batch_id: str, model_id: str, account_id: str,
            shards: dict[int, int] | None = None, still_paused: bool = False) -> list[dict]:
        """`shards`: how many of the requests' own slots came from which budget shard (they go back there);
        `still_paused`: the batch's write is fenced on it still being paused (`Settlement.uncounted`)."""
        t = svc.table
        ops = [analytics.add_with_finish(t, batch_id, self.batch, svc.now() if self.answered else None,
                                         Batch.STILL_PAUSED if still_paused else None)]
        counters = dict(self.model)
        back = -int(counters.pop("in_flight", 0))
        parts = dict(shards) if shards else {0: back}
        for shard, held in parts.items():  # the other counters (waiting) go with the first shard's
            given = min(held, back) if shard != list(parts)[-1] else back
            back -= given
            ops.append(Budget.add(t, model_id, {**counters, "in_flight": -given}, shard))
            counters = {}
        if self.account_in_flight:
            ops.append(Account.add_in_flight(t, account_id, self.account_in_flight))
        if self.cost_usd:
            ops.append(Usage.add_cost(t, account_id, self.cost_usd, svc.now()))
        return [op for op in ops if op is not None]


def settle(svc: Services, req: RequestItem, outcome: Settlement, stop: Stop | None = None) -> None:
    """Move a request from its current state (and token) to `outcome.to`, with every counter it moves."""
    settle_many(svc, [(req, outcome)], stop)


# Requests of one batch `settle_many` writes in one transaction at most: with their counters and the log entry
# it stays far below DynamoDB's 100 items (and, their results inline, below its 4 MB).
SETTLE_MAX = 10


def settle_many(svc: Services, settled: list[tuple[RequestItem, Settlement]], stop: Stop | None = None) -> None:
    """`settle` for requests of one batch on one model (at most SETTLE_MAX), in one transaction: their
    counters summed and one entry of the finished-order log, as a group's close writes its members'. Any of
    them moved meanwhile (a lease recovered): ConditionFailed, and none is written."""
    now = svc.now()
    first = settled[0][0]
    ops, deltas, shards, finished = [], CounterDeltas(), Counter(), []
    for req, outcome in settled:
        if outcome.to is RequestState.UNSTARTED:
            outcome.error = unstarted_error(stop)
        due = (retry_due(req["model"]), outcome.retry_at or now) if outcome.to is RequestState.WAITING else None
        fields = {name: value for name in ("error", "response", "response_object")
                  if (value := getattr(outcome, name)) is not None}
        token = new_token()
        extra = {**outcome.extra, "uncounted": True} if outcome.uncounted else outcome.extra
        ops.append(Request.move(svc.table, req, outcome.to, token, now, due=due, fields=fields, extra=extra))
        if req.get("worst_usd") is not None and req["state"] in (RequestState.DISPATCHED.value,
                                                                 RequestState.RUNNING.value):
            # Its claim committed its worst case against the batch's cap: the settle gives back what it did not
            # spend.
            outcome = replace(outcome, committed_usd=settled_delta(
                float(req["worst_usd"]), req["state"] == RequestState.RUNNING.value, outcome.cost_usd,
                not outcome.cost_unknown))
        deltas.add(RequestState(req["state"]), outcome, stop, leased=bool(req.get("slot_lease")),
                  counted=not req.get("uncounted"))
        shards[int(req.get("budget_shard", 0))] += 1
        finished.append({**req, "state": outcome.to.value, "token": token})
    # A final outcome joins the batch's finished-order log in the transaction that counts it. One put back to
    # wait while its batch is paused is written only while the batch still is.
    paused = any(outcome.uncounted for _, outcome in settled)
    transact_counted(svc.table, first["batch_id"],
                     ops + deltas.ops(svc, first["batch_id"], first["model"], first["account_id"], dict(shards),
                                     still_paused=paused),
                     finished_members(finished), now, first.get("ttl"))


def start(svc: Services, req: RequestItem) -> RequestItem:
    """dispatched -> running: the worker is about to call the backend. Returns the new request.

    Fenced against its batch stopping: a request that has not started by the time its batch is cancelled,
    failed or out of its window must not start, even if the worker checked a moment earlier."""
    now = svc.now()
    running = {**req, "state": RequestState.RUNNING.value, "attempt": int(req.get("attempt", 0)) + 1,
               "due_at": now + svc.settings.lease_seconds, "started_at": now, "token": new_token()}
    first_attempt = int(req.get("attempt", 0)) == 0
    svc.table.transact([Request.start(svc.table, req, running),
                        Batch.may_start(svc.table, req["batch_id"], now, first_attempt=first_attempt)])
    return running


def _budget_takes(svc: Services, model_id: str, parts: list[tuple[ShardTake, int]], from_waiting: bool = False
                  ) -> list[dict]:
    """So many of the model's slots from each take's shard, within its cap (see `Budget.take`)."""
    return [Budget.take(svc.table, model_id, take.shard, n, take.cap, take.interactive_seen, from_waiting)
            for take, n in parts]


def _take_ops(svc: Services, model_id: str, account_id: str, parts: list[tuple[ShardTake, int]], account_cap: int,
              from_waiting: bool = False) -> list[dict]:
    """Take slots of the model (so many from each take's shard) and as many of the account, within their caps."""
    return _budget_takes(svc, model_id, parts, from_waiting) + [
        Account.take(svc.table, account_id, sum(n for _, n in parts), account_cap)]


def claim_from_lane(svc: Services, batch: BatchItem, model_id: str, positions: list[Position], lane_next: int,
                    parts: list[tuple[ShardTake, int]] | None, account_cap: int, running: bool = False,
                    slot_lease: dict | None = None) -> list[GroupItem]:
    """Dispatch the lane's next positions as groups: take their slots, advance the lane, create the groups.

    A group is one lease over up to GROUP_MAX requests: one item, one queue message, one start and one
    outcome transaction for all of them. Request items are written only when a request has an outcome.
    `running`: the claimant runs the groups itself at once, so they start now (no separate start).
    `slot_lease`: they run in that SlotLease's slots, so only the account's slots are taken; without one,
    `parts` says how many of the model's slots come from which shard (as many in all as positions)."""
    now = svc.now()
    t = svc.table
    k = len(positions)
    lane = batch["lanes"][model_id]
    worst = [p.worst_usd for p in positions] if batch.get("max_cost_usd") is not None else None
    ops = [Batch.claim_lane(t, batch, model_id, lane_next, k, now, sum(worst) if worst else None)]
    if slot_lease is None:
        assert parts is not None and sum(n for _, n in parts) == k
        ops += _take_ops(svc, model_id, batch["account_id"], parts, account_cap)
    else:
        ops.append(Account.take(t, batch["account_id"], k, account_cap))
    groups = []
    left = [[take.shard, n] for take, n in parts or []]  # the slots each group's members take, in order
    for at in range(0, k, GROUP_MAX):
        members = positions[at:at + GROUP_MAX]
        held: dict[int, int] = {}
        while left and sum(held.values()) < len(members):
            n = min(left[0][1], len(members) - sum(held.values()))
            held[left[0][0]] = held.get(left[0][0], 0) + n
            left[0][1] -= n
            if left[0][1] == 0:
                left.pop(0)
        pk, sk = group_key(batch["id"], members[0].index)
        group = Group.new(pk=pk, sk=sk, batch=batch, model_id=model_id,
                          positions=[p.stored() for p in members], running=running,
                          token=new_token(), now=now, lease_ends=now + svc.settings.lease_seconds,
                          item_ttl=_items_ttl(svc, batch), slot_lease=slot_lease["id"] if slot_lease else None,
                          budget_shards=held)
        if worst:  # each member's worst case, given back as it settles (position_item)
            group["worst_usd"] = worst[at:at + GROUP_MAX]
        groups.append(group)
        ops.append(Group.create(t, group))
    if lane_next + k >= lane["total"]:
        ops.append(Lane.remove(t, model_id, batch))
    t.transact(ops)
    return groups


def _items_ttl(svc: Services, batch: BatchItem) -> int:
    """When DynamoDB may delete the batch's request items on its own (TTL deletes cost nothing). The batch
    and its results go from the API when its retention ends (the sweeper's purge); a batch ends at most
    about an hour after its window closes (retries of requests that had started), so a day after the
    window plus the retention is always later."""
    return int(batch["expires_at"]) + svc.settings.batch_retention_seconds + 86400


def start_group(svc: Services, group: GroupItem) -> GroupItem:
    """dispatched -> running for a whole group, fenced against its batch stopping (see `start`)."""
    return _start_group(svc, group, None)


def start_group_in_lease(svc: Services, group: GroupItem) -> tuple[GroupItem, dict]:
    """Start a group and turn the budget slots its members hold into a SlotLease, in one transaction: the
    worker that runs it keeps those slots busy after its members end. Returns (the group, the lease)."""
    now = svc.now()
    lease = SlotLease.new(group["model"], new_token(), group_shards(group), new_token(), now,
                          now + svc.settings.lease_seconds)
    return _start_group(svc, group, lease), lease


def _start_group(svc: Services, group: GroupItem, lease: dict | None) -> GroupItem:
    now = svc.now()
    running = {**group, "state": RequestState.RUNNING.value, "due_at": now + svc.settings.lease_seconds,
               "started_at": now, "token": new_token()}
    ops = [Group.start(svc.table, group, running["token"], now, running["due_at"],
                       slot_lease=lease["id"] if lease else None),
           Batch.may_start(svc.table, group["batch_id"], now, first_attempt=True)]
    if lease:
        ops.append(SlotLease.create(svc.table, lease))
        running["slot_lease"] = lease["id"]
    svc.table.transact(ops)
    return running


def position_item(svc: Services, group: GroupItem, position: list, outcome: Settlement, attempt: int,
                  stop: Stop | None = None, token: str | None = None) -> RequestItem:
    """The request item a group member's outcome creates. `tally` keeps what the outcome adds to the
    counters, so that a group whose worker died after writing it is counted from its items, once."""
    index, custom_id, offset, length = position[:4]
    now = svc.now()
    pk, sk = request_key(group["batch_id"], index)
    item = {"pk": pk, "sk": sk, "batch_id": group["batch_id"], "index": index, "custom_id": custom_id,
            "model": group["model"], "account_id": group["account_id"], "offset": offset, "length": length,
            "state": outcome.to.value, "token": token or new_token(), "attempt": attempt, "created_at": now,
            "updated_at": now, "group_token": group["token"]}
    if group.get("item_ttl"):
        item["ttl"] = group["item_ttl"]
    if len(position) > 4 and position[4]:  # its prefix key: a retry of it is ordered by it too
        item["prefix"] = position[4]
    error = unstarted_error(stop) if outcome.to is RequestState.UNSTARTED else outcome.error
    for name, value in (("error", error), ("response", outcome.response),
                        ("response_object", outcome.response_object)):
        if value is not None:
            item[name] = value
    if outcome.to is RequestState.WAITING:
        item["due_pk"], item["due_at"] = retry_due(group["model"]), outcome.retry_at or now
    tally = {name: value for name in TALLIED if (value := getattr(outcome, name))}
    if outcome.to is RequestState.WAITING and outcome.uncounted:
        item["uncounted"] = tally["uncounted"] = True
    if group.get("worst_usd") is not None:  # its batch has a spending cap: what the claim committed comes back
        worst = float(group["worst_usd"][[p[0] for p in group["positions"]].index(index)])
        item["worst_usd"] = worst  # committed again if it is retried
        tally["committed_usd"] = settled_delta(worst, attempt > 0, outcome.cost_usd, not outcome.cost_unknown)
        tally = {name: value for name, value in tally.items() if value}
    item["tally"] = {"to": outcome.to.value, **({"stop": stop.value} if stop else {}), **tally,
                     **({"attempt": outcome.attempt} if outcome.attempt is not None else {})}
    return item


def tallied(item: RequestItem) -> tuple[Settlement, Stop | None]:
    """The outcome a group member's item recorded (see `position_item`)."""
    tally = item["tally"]
    stop = Stop(tally["stop"]) if tally.get("stop") else None
    return Settlement(to=RequestState(tally["to"]), **{k: tally[k] for k in TALLIED if k in tally},
                      attempt=tally.get("attempt"), uncounted=bool(tally.get("uncounted"))), stop


def record_position(svc: Services, item: RequestItem) -> None:
    """Write one group member's outcome. Raises ConditionFailed if the group's lease was recovered first."""
    Request.put_outcome(svc.table, item)


def close_group(svc: Services, group: GroupItem, written: list[RequestItem],
                new: tuple[RequestItem, ...] = ()) -> None:
    """End a group: give its slots back and add its members' outcomes to the counters, in one transaction
    fenced by the group's token. `written`: members' request items already stored; `new`: members' items
    this same transaction writes."""
    t = svc.table
    ops = [Group.end(t, group)] + [Request.create(t, item) for item in new]
    deltas = CounterDeltas()
    for item in (*written, *new):
        outcome, stop = tallied(item)
        deltas.add(RequestState(group["state"]), outcome, stop, leased=bool(group.get("slot_lease")))
    # Its members' final outcomes join the batch's finished-order log in the same transaction.
    # Members put off because the batch is paused: while it still is.
    paused = any(item.get("uncounted") for item in new)
    transact_counted(t, group["batch_id"], ops + deltas.ops(svc, group["batch_id"], group["model"], group["account_id"],
                                                           group_shards(group), still_paused=paused),
                     finished_members((*written, *new)), svc.now(), group.get("item_ttl"))


def claim_retry(svc: Services, req: RequestItem, shard_take: ShardTake | None, account_cap: int,
                slot_lease: dict | None = None) -> RequestItem:
    """waiting -> dispatched: a request whose wait is over takes a slot again (from `shard_take`'s shard), or runs
    in `slot_lease`'s."""
    now = svc.now()
    t = svc.table
    token = new_token()
    lease_id = slot_lease["id"] if slot_lease else None
    # Under a lease, the count of retries waiting goes down on one of the lease's shards (only the sum is read).
    shard = next(iter(lease_shards(slot_lease))) if slot_lease else shard_take.shard if shard_take else 0
    # A request a pause put off left the model's `waiting` count then (`put_off`): it does not leave it twice.
    counted = not req.get("uncounted")
    # A capped batch's retry commits its worst case against the cap it reads now (a read only for those).
    capped = Batch.get(t, req["batch_id"]) if req.get("worst_usd") is not None else None
    ops = [Request.dispatch_retry(t, req, token, now + svc.settings.lease_seconds, slot_lease=lease_id,
                                  budget_shard=shard),
           Batch.take_retry_slot(t, req["batch_id"], capped, float(req["worst_usd"]) if capped else None)]
    if slot_lease is None:
        assert shard_take is not None
        ops += _take_ops(svc, req["model"], req["account_id"], [(shard_take, 1)], account_cap, from_waiting=counted)
    else:
        ops.append(Account.take(t, req["account_id"], 1, account_cap))
        if counted:
            ops.append(Budget.add(t, req["model"], {"waiting": -1}, shard))
    t.transact(ops)
    claimed = {**req, "state": RequestState.DISPATCHED.value, "token": token}
    claimed.pop("slot_lease", None)
    if lease_id:
        return {**claimed, "slot_lease": lease_id}
    return {**claimed, "budget_shard": shard}


def claim_retries_running(svc: Services, batch: BatchItem, reqs: list[RequestItem], account_cap: int,
                          slot_lease: dict) -> list[RequestItem]:
    """waiting -> running for due retries of one batch on one model (at most GROUP_MAX) that a pump claims in its
    SlotLease's slots and runs at once: one transaction for them all, their start in their claim, as a group's
    (`batch`: as the claimant read it, for a spending cap). Fenced on each request's state and token and on
    the batch letting them start (not stopped, paused or being deleted; its window open when one of them never
    ran); ConditionFailed when any of them moved meanwhile, and none is claimed. Returns them running."""
    now = svc.now()
    t = svc.table
    lease_ends = now + svc.settings.lease_seconds
    ops, running = [], []
    for req in reqs:
        claimed = {**req, "state": RequestState.RUNNING.value, "token": new_token(),
                   "attempt": int(req.get("attempt", 0)) + 1, "due_pk": lease_due(req["pk"], req["sk"]),
                   "due_at": lease_ends, "started_at": now, "slot_lease": slot_lease["id"]}
        claimed.pop("uncounted", None)
        ops.append(Request.claim_running(t, req, claimed))
        running.append(claimed)
    worst = [float(req["worst_usd"]) for req in reqs if req.get("worst_usd") is not None]
    capped = batch if worst and batch.get("max_cost_usd") is not None else None
    never_ran = any(int(req.get("attempt", 0)) == 0 for req in reqs)
    ops.append(Batch.take_retry_slot(t, batch["id"], capped, sum(worst) if capped else None, k=len(reqs),
                                     window_open_at=now if never_ran else None))
    ops.append(Account.take(t, batch["account_id"], len(reqs), account_cap))
    # The count of retries waiting goes down on one of the lease's shards (only the sum is read), but for those
    # a pause put off, which left it then (`put_off`).
    counted = sum(1 for req in reqs if not req.get("uncounted"))
    if counted:
        ops.append(Budget.add(t, reqs[0]["model"], {"waiting": -counted}, next(iter(lease_shards(slot_lease)))))
    t.transact([op for op in ops if op is not None])
    return running


# A request of a paused batch whose window has already closed is due again this long after it was put back:
# the sweeper expires such a batch by then.
PAUSED_RECHECK_SECONDS = 60


def paused_until(batch: BatchItem, now: int) -> int:
    """When a request of a paused batch, put back to wait, is due again: at its window's end, when the
    sweeper expires the batch if it is still paused (a resume makes it due at once before that)."""
    return max(int(batch["expires_at"]), now + PAUSED_RECHECK_SECONDS)


def defer_while_paused(svc: Services, req: RequestItem, batch: BatchItem) -> bool:
    """A waiting request of a paused batch: due again only when `paused_until` says, so that dispatchers
    stop looking at it, and out of its model's `waiting` count until the resume (`Request.put_off`). Fenced on
    the batch still being paused (a resume that came first leaves it due) and on the request still waiting as
    read (a request that moved meanwhile is read once more). False when either changed."""
    t = svc.table
    for _ in range(2):
        if req.get("uncounted"):  # put off already; made due meanwhile (the quota's wake-up): off again
            if int(req.get("due_at", 0)) >= int(batch["expires_at"]):
                return True
            try:
                t.transact([Request.defer(t, req, paused_until(batch, svc.now())), Batch.still_paused(t, batch["id"])])
                return True
            except ConditionFailed:
                return False
        try:
            t.transact([Request.put_off(t, req, paused_until(batch, svc.now()), new_token()),
                        Batch.still_paused(t, batch["id"]), Budget.add(t, req["model"], {"waiting": -1})])
            return True
        except ConditionFailed:
            current = Request.get(t, req["batch_id"], req["index"])
            if current is None or current["state"] != RequestState.WAITING.value or current["token"] == req["token"]:
                return False  # claimed or closed, or the batch was resumed
            req = current
    return False


def take_slots(svc: Services, model_id: str, parts: list[tuple[ShardTake, int]]) -> dict:
    """A SlotLease of so many of the model's slots from each take's shard, within their caps (ConditionFailed:
    not that many are free)."""
    now = svc.now()
    lease = SlotLease.new(model_id, new_token(), {take.shard: n for take, n in parts}, new_token(), now,
                          now + svc.settings.lease_seconds)
    svc.table.transact(_budget_takes(svc, model_id, parts) + [SlotLease.create(svc.table, lease)])
    return lease


def grow_slots(svc: Services, lease: dict, parts: list[tuple[ShardTake, int]]) -> dict:
    """So many more free slots of each take's shard into the lease; returns the lease as it is now.
    ConditionFailed: not that many are free, or the sweeper recovered the lease."""
    more = {take.shard: n for take, n in parts}
    svc.table.transact([SlotLease.grow(svc.table, lease, more)] + _budget_takes(svc, lease["model"], parts))
    held = lease_shards(lease)
    for shard, n in more.items():
        held[shard] = held.get(shard, 0) + n
    return {**lease, "slots": int(lease["slots"]) + sum(more.values()), "shards": shards_map(held)}


def give_back_slots(svc: Services, lease: dict, n: int) -> dict | None:
    """n of the lease's slots back to the budget shards they came from (those it holds most of first);
    returns the lease as it is now (None once it has ended). ConditionFailed: the sweeper recovered it first
    (its slots went back then)."""
    held = lease_shards(lease)
    parts: dict[int, int] = {}
    for shard in sorted(held, key=lambda k: -held[k]):
        if sum(parts.values()) >= n:
            break
        parts[shard] = min(held[shard], n - sum(parts.values()))
    svc.table.transact(SlotLease.give_back(svc.table, lease, parts))
    left = int(lease["slots"]) - n
    if left <= 0:
        return None
    return {**lease, "slots": left, "shards": shards_map({k: m - parts.get(k, 0) for k, m in held.items()})}


def queue_message(unit: GroupItem | RequestItem) -> dict:
    """The queue message for a dispatched group, or for one request dispatched again for a retry."""
    if "positions" in unit:
        return {"batch_id": unit["batch_id"], "group": unit["first"], "token": unit["token"], "model": unit["model"]}
    return {k: unit[k] for k in ("batch_id", "index", "token", "model")}
