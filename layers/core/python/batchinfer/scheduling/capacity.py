"""How many batch requests a model may have in flight right now, and where a take of its slots comes from.

Three things shape it: the catalog's batch budget; interactive traffic on the model (the interactive
endpoints add to `interactive` while their requests run, and batch work gives way down to the model's
floor); and the backend itself: 429s halve the adaptive cap, and it probes back up one slot per quiet
second (additive increase, multiplicative decrease, as TCP does). The budget is split into shards (one
DynamoDB item each); `Draws` says which shards a take comes from. The arithmetic is `policy`'s; this module
reads and writes the budget.
"""

from __future__ import annotations

import random
from collections import deque

from ..catalog import Model
from ..layout import budget_share
from ..ledger import ShardTake
from ..records import Budget
from ..runtime import Services
from ..storage.dynamo import ConditionFailed
from . import policy
from .clock import REAL_CLOCK, Clock
from .config import scheduler_config


def budget_shards(svc: Services, model: Model) -> int:
    """How many shards the model's budget has: one per `budget_shard_slots` of its catalog budget."""
    return max(1, -(-model.batch_budget // svc.settings.budget_shard_slots))


def read_budget(svc: Services, model: Model, consistent: bool = True) -> dict:
    """The model's budget, every shard read in one round trip and summed (records.Budget.get)."""
    return Budget.get(svc.table, model.id, consistent, budget_shards(svc, model))


class Draws:
    """Where a reader of the budget may take slots from: each shard's room under its share of `cap`, as the
    read saw it, less what this reader has taken since. The roomiest shard first (ties at random, so that
    takers that read together spread out rather than race for one shard)."""

    def __init__(self, budget_item: dict | None, cap: int) -> None:
        shards = (budget_item or {}).get("shards") or [{}]
        self.cap = cap
        self.held = [int(shard.get("in_flight", 0)) for shard in shards]
        self.seen = [int(shard.get("interactive", 0)) for shard in shards]

    def of(self, shard: int) -> ShardTake:
        count = len(self.held)
        room = budget_share(self.cap, shard, count) - self.held[shard] if shard < count else 0
        return ShardTake(shard=shard, cap=budget_share(self.cap, shard, count), room=max(0, room),
                    interactive_seen=self.seen[shard] if shard < count else None)

    def split(self, k: int) -> list[tuple[ShardTake, int]]:
        """Up to k slots from the roomiest shards, as few shards as will do: (the shard's take, how many)."""
        takes = [self.of(shard) for shard in range(len(self.held))]
        return [(takes[shard], n) for shard, n in policy.split_take([take.room for take in takes], k)]

    def took(self, shard: int, k: int) -> None:
        self.held[shard] += k


def interactive_shard(svc: Services, model: Model) -> int:
    """The budget shard an interactive call is counted on (any: readers sum them; at random, to spread)."""
    return random.randrange(budget_shards(svc, model))


def effective_budget(model: Model, budget_item: dict | None, yield_per_request: int,
                     interactive: int | None = None) -> int:
    """The batch requests the model may have in flight now. `interactive`: the interactive load to make way
    for (default: the count on the budget item; a caller with an InteractiveMemory passes its level)."""
    item = budget_item or {}
    interactive = int(item.get("interactive", 0)) if interactive is None else interactive
    adaptive_cap = int(item["adaptive_cap"]) if "adaptive_cap" in item else None
    return policy.effective_cap(model.batch_budget, model.batch_floor, interactive, yield_per_request, adaptive_cap)


def note_call_seconds(svc: Services, model: Model, seconds: float) -> None:
    """The model's recent mean call duration, as a pump measured it (the last pump to write wins)."""
    Budget.note_latency(svc.table, model.id, seconds, svc.now())


def over_cap(svc: Services, model_id: str) -> bool:
    """Whether the model has more batch slots taken than it may have now."""
    model = svc.catalog.lookup(model_id)
    if model is None:
        return False  # gone from the catalog: the request's own checks fail it
    budget = read_budget(svc, model, consistent=False)
    cap = effective_budget(model, budget, scheduler_config(svc.settings).interactive_yield_per_request)
    return int((budget or {}).get("in_flight", 0)) > cap


class InteractiveMemory:
    """The highest interactive count a caller saw on each model over the last `window_seconds`
    (SchedulerConfig.interactive_window_seconds, which says why): batch work gives way to interactive load at
    once and takes the room back once the load has stayed lower for the window."""

    def __init__(self, window_seconds: float, clock: Clock = REAL_CLOCK) -> None:
        self.window_seconds, self.clock = window_seconds, clock
        self.seen: dict[str, deque[tuple[float, int]]] = {}
        self.watching_since: dict[str, float] = {}

    def level(self, model_id: str, budget_item: dict | None) -> int:
        now = self.clock.monotonic()
        self.watching_since.setdefault(model_id, now)
        seen = self.seen.setdefault(model_id, deque())
        seen.append((now, int((budget_item or {}).get("interactive", 0))))
        while seen and seen[0][0] < now - self.window_seconds:
            seen.popleft()
        return max(n for _, n in seen)

    def knows(self, model_id: str, budget_item: dict | None, now_ms: int) -> bool:
        """Whether `level` is the load over the whole window: this memory has watched the model that long, or
        the count has stood still that long (no interactive call began or ended: the item's `interactive_at`).
        A reader that cannot tell yet (a new dispatcher invocation) may be looking at a dip between one
        client's call and its next, and must not start batch work on it."""
        since = self.watching_since.get(model_id)
        if since is not None and self.clock.monotonic() - since >= self.window_seconds:
            return True
        return now_ms - int((budget_item or {}).get("interactive_at", 0)) >= self.window_seconds * 1000


def track_interactive(svc: Services, model_id: str, delta: int) -> None:
    """An interactive request started (+1) or ended (-1) on the model; batch work makes way for it."""
    Budget.track_interactive(svc.table, model_id, delta, svc.now_ms())


def backend_throttled(svc: Services, model: Model, in_flight: int) -> None:
    """The backend answered 429: halve the adaptive cap (not below the floor), at most once a second."""
    now = svc.now()
    cap = policy.backed_off_cap(model.batch_budget, model.batch_floor, in_flight)
    try:
        Budget.back_off(svc.table, model.id, cap, now)
    except ConditionFailed:
        pass  # another worker already backed off this second


def backend_said_429(svc: Services, model: Model) -> None:
    """The backend is past its capacity: batch work on it backs off."""
    budget = read_budget(svc, model, consistent=False)
    backend_throttled(svc, model, int((budget or {}).get("in_flight", 1)))


def probe_up(svc: Services, model: Model, budget_item: dict | None) -> None:
    """After a quiet spell, give the adaptive cap one more slot (once a second across all dispatchers)."""
    item = budget_item or {}
    if "adaptive_cap" not in item:
        return
    now = svc.now()
    probe_after = scheduler_config(svc.settings).probe_after_seconds
    if not policy.may_probe(now, int(item.get("throttled_at", 0)), int(item.get("probed_at", 0)), probe_after):
        return
    try:
        grown = policy.probed_cap(int(item["adaptive_cap"]), model.batch_budget)
        Budget.probe(svc.table, model.id, item["adaptive_cap"], grown, now)
    except ConditionFailed:
        pass
