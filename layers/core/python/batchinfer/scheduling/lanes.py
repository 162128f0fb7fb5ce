"""Lanes: how batches take turns at a model's free slots.

Each batch has a lane per model (records.Lane), ordered in a ring. A claim reads only the lanes it can
serve, from the one after the lane served last (the ring cursor), and shares its free slots among them: a
quantum per lane in turn while more lanes wait than the slots give each a quantum, otherwise a slot at a time
to the batches holding fewest (the water-fill, `policy.water_fill`). Within an account, its higher-priority
lanes use its share first (`policy.by_priority`, `policy.turn_goes_to`). Claiming a lane's requests (the
ledger's `claim_from_lane`) happens here too, with the reads of the batch's index it needs.
"""

from __future__ import annotations

import json
import math
import random
from collections import defaultdict
from dataclasses import dataclass, field

from ..catalog import Model
from ..domain import utc_day
from ..layout import INDEX_CHUNK, IndexEntry, index_object, lane_created_at, lane_in_order, lane_object, lane_turn_at
from ..ledger import Position, claim_from_lane
from ..records import Account, Batch, Lane
from ..runtime import Services
from ..spending import fits, worst_usd
from ..storage.dynamo import ConditionFailed, Throttled
from . import policy
from .capacity import Draws
from .config import SchedulerConfig, scheduler_config


class AccountSlots:
    """Each account's free slots under its tier's limit, read once per claim (at the first lane or retry of
    the account it meets) and counted down as the claim takes them."""

    def __init__(self, svc: Services) -> None:
        self.svc = svc
        self.left: dict[str, int] = {}  # account id -> free account slots
        self.limits: dict[str, int] = {}  # account id -> its tier's limit
        # account id -> (the UTC day, the account, its usage that day) as this claim read them (strongly
        # consistent): the checks before its groups start go by them rather than read them again.
        self.read: dict[str, tuple[str, dict | None, dict | None]] = {}

    def free(self, account_id: str) -> int:
        if account_id not in self.left:
            day = utc_day(self.svc.now())
            account, usage = Account.with_usage(self.svc.table, account_id, day)
            self.read[account_id] = (day, account, usage)
            account = account or {}
            limit = self.svc.settings.tier_limits.get(account.get("tier", "free"), 0)
            self.limits[account_id] = limit
            # An account without batch access or quota left claims nothing: its requests stay in their lanes,
            # costing no write while they wait, and a raised quota or restored access lets the next claim take
            # them (the worker's checks before a start stay the ones that decide).
            may = Account.may_run_batches(account, usage)
            self.left[account_id] = limit - int(account.get("in_flight", 0)) if may else 0
        return self.left[account_id]

    def cap(self, account_id: str) -> int:
        """The account's tier limit (the condition its claims are written under)."""
        self.free(account_id)
        return self.limits[account_id]

    def took(self, account_id: str, n: int) -> None:
        self.left[account_id] -= n


@dataclass
class ClaimScope:
    """What one claim works within: the budget's shards as it read them (`draws`, without a lease), the
    SlotLease its work runs in (if any), the most it may take in that lease, whether its groups are claimed
    already running, the batches it read (for a worker to reuse) and those whose lane it emptied."""

    draws: Draws
    slot_lease: dict | None = None
    most: float = float("inf")
    running: bool = False
    batches_seen: dict[str, dict] = field(default_factory=dict)
    emptied: set[str] = field(default_factory=set)  # batches whose lane this claim took the last of
    # In a pump's claim, batch id -> where it stands there (`policy.standing_in_pump`); lanes of other
    # batches stand with the lowest.
    standing: dict[str, int] = field(default_factory=dict)
    # Capped batches whose lane's next request does not fit the cap while nothing of them runs, as read.
    at_cap: set[str] = field(default_factory=set)
    # In a pump's claim, what its slots run in about a wave (`policy.lane_most_in_pump`; None outside a
    # pump) and batch id -> its requests running or queued there, counting what this claim has taken of it.
    wave: int | None = None
    here: dict[str, int] = field(default_factory=dict)
    shared: bool = True  # other lanes could take work too (as the claim's reads tell): the bound applies

    def standing_of(self, batch_id: str) -> int | None:
        return self.standing.get(batch_id, min(self.standing.values(), default=None))


class Lanes:
    """The ring of a dispatcher's models' lanes, and what it remembers between claims: whose turn it is, and
    the lanes' positions and index chunks it has read."""

    def __init__(self, svc: Services) -> None:
        self.svc = svc
        # Whose turn it is, per model; a random start so that many short-lived dispatchers (workers pulling
        # their next request) do not all favour the first lane.
        self.turn: dict[str, int] = defaultdict(lambda: random.randrange(1 << 16))
        self.last_served: dict[str, str] = {}  # per model, the sort key of the lane served last
        self.seen = 0  # how many batches had work for the model at the last claim (of those it read)
        self._lane_positions: dict[tuple[str, str], list[int]] = {}
        self._chunks: dict[tuple[str, int], list] = {}

    @property
    def config(self) -> SchedulerConfig:
        return scheduler_config(self.svc.settings)

    def in_turn(self, model_id: str, want: int) -> tuple[list[dict], bool]:
        """Up to `want` lanes, in turn from the one after the last served (True with them when they are all
        the model's lanes)."""
        table = self.svc.table
        after = self.last_served.get(model_id)
        if after is None:
            lanes, complete = Lane.in_turn(table, model_id, None, want)
            if complete or not lanes:
                start = self.turn[model_id] % len(lanes) if lanes else 0
                return lanes[start:] + lanes[:start], complete
            # A new dispatcher (a worker pulling its next work) starts at a random place in the ring, so
            # that many short-lived ones do not all favour the oldest batches.
            newest = Lane.newest(table, model_id) or lanes[-1]
            kind = random.choice((lanes[0], newest))["batch_id"].split("_")[0]  # ids are <kind>_<hex>
            after = lane_turn_at(random.randint(lane_created_at(lanes[0]["sk"]), lane_created_at(newest["sk"])),
                                 f"{kind}_{random.randrange(1 << 16):04x}")
        return Lane.in_turn(table, model_id, after, want)

    def serve(self, model: Model, free: int, accounts: AccountSlots, scope: ClaimScope) -> list[dict]:
        """Claim up to `free` first attempts from the model's lanes, batches taking turns; the next claim
        starts after the last lane served. Only the lanes this claim can serve are read (one more than its
        quanta), so a claim costs the same over 2 batches or 10,000."""
        quantum = self.config.lane_quantum
        want = policy.lanes_to_read(free, quantum)
        # One lane more than it serves: a ring of exactly `want` lanes is then known to be whole (the turns
        # then go to the batches holding fewest first); the extra one is not served.
        lanes, complete = self.in_turn(model.id, want + 1)
        if not complete:
            lanes = lanes[:want]
        self.seen = len(lanes)
        if not lanes:
            return []
        if policy.by_quanta(complete, free, quantum, len(lanes)):
            return self._by_quanta(model, lanes, complete, free, accounts, scope)
        return self._water_fill(model, lanes, free, accounts, scope)

    def _water_fill(self, model: Model, lanes: list[dict], free: int, accounts: AccountSlots,
                    scope: ClaimScope) -> list[dict]:
        """Few lanes, all read: fill up the batches holding the fewest slots first (each batch's `in_flight`),
        so that a batch that just arrived takes the freed slots until it holds as many as the others, rather
        than half of each claim's (which left it a whole round of calls behind); ties go in turn."""
        batches = {lane["batch_id"]: self._batch(lane["batch_id"], scope) for lane in lanes}
        for lane in lanes:
            if left_behind(batches[lane["batch_id"]], model.id):
                Lane.discard(self.svc.table, lane)  # so it takes no more turns
        wants = [policy.LaneWant(key=lane["sk"], account=lane["account_id"],
                                 held=int((batches[lane["batch_id"]] or {}).get("in_flight", 0)),
                                 room=self._room(batches[lane["batch_id"]], model.id),
                                 rank=policy.rank(lane.get("priority")),
                                 standing=scope.standing_of(lane["batch_id"])) for lane in lanes]
        # Accounts are read only for the lanes that could take work, as they are met.
        room = {want.account: accounts.free(want.account) for want in wants if want.room > 0}
        scope.shared = sum(1 for want in wants if want.room > 0 and room[want.account] > 0) > 1
        shares, given_last = policy.water_fill(wants, free, room)
        # Each account's slots, as shared above, go to its highest-priority lanes first.
        shares = policy.by_priority(wants, shares)
        if given_last is not None:  # by the lane's key, not its place: lanes come and go between claims
            self.last_served[model.id] = given_last
        out: list[dict] = []
        for lane in lanes:
            if k := shares.get(lane["sk"], 0):
                accounts.took(lane["account_id"], k)
        for lane in lanes:
            if k := shares.get(lane["sk"], 0):
                # In a pump's lease, a lane's last few requests go with its share (as with a quantum), within
                # what the pump can start in time: a stub would be a group of its own.
                most = min(k + accounts.free(lane["account_id"]), scope.most) if scope.slot_lease else 0
                try:
                    out += self._claim(model, lane, k, accounts.cap(lane["account_id"]), scope,
                                       batch=batches[lane["batch_id"]], most=most)
                except Throttled:
                    break  # DynamoDB is busy: send what was claimed, try the rest next pass
        return out

    def _by_quanta(self, model: Model, lanes: list[dict], complete: bool, free: int, accounts: AccountSlots,
                   scope: ClaimScope) -> list[dict]:
        """Fewer free slots than a quantum for every lane: lanes in turn take a quantum each, claimed one
        lane after another, so what a short lane cannot take goes to the next, read a page at a time."""
        config = self.config
        out: list[dict] = []
        seen: set[str] = set()
        # The most this claim takes: the free slots, or in a lease what its holder can start in time (a
        # pump's claim gives each lane it serves a whole quantum, even past what it asked for: it queues
        # the rest, and a remainder would be a small group of its own, which pays a whole claim and close,
        # and, as its own pump's first lease, kept making small groups).
        budget = scope.most if scope.slot_lease else free
        spent: set[str] = set()  # lanes found with nothing to claim: no turn is given to them again
        read: dict[str, dict | None] = {}  # batches read for the turns' order, each used by one claim at most
        if complete and len(lanes) > 1:
            # Every lane was read: the batches holding fewest take their turns first (a batch that has just
            # arrived is owed them), as the water-fill gives slots when every lane fits.
            read = {lane["batch_id"]: self._batch(lane["batch_id"], scope) for lane in lanes}
            scope.shared = sum(1 for lane in lanes if self._room(read[lane["batch_id"]], model.id) > 0
                               and accounts.free(lane["account_id"]) > 0) > 1
            held = [policy.LaneWant(key=lane["sk"], account=lane["account_id"],
                                    held=int((read[lane["batch_id"]] or {}).get("in_flight", 0)), room=1,
                                    standing=scope.standing_of(lane["batch_id"]))
                    for lane in lanes]
            lanes = [lanes[i] for i in policy.in_deficit_order(held)]
        for _ in range(config.quanta_pages):
            ranked = [policy.LaneWant(key=lane["sk"], account=lane["account_id"], held=0, room=1,
                                      rank=policy.rank(lane.get("priority"))) for lane in lanes]
            for i, lane in enumerate(lanes):
                if lane["sk"] in seen:
                    return out  # round the ring once
                seen.add(lane["sk"])
                # Every lane looked at has had its turn, served or not (its account full): the next claim
                # starts after it.
                self.last_served[model.id] = lane["sk"]
                k, most = policy.lane_quantum(config.lane_quantum, accounts.free(lane["account_id"]), budget)
                if k <= 0:
                    continue
                # The account's turn goes to its highest-priority lane among those read (this one if none
                # ranks higher); if that one has nothing left, to this one.
                target = lanes[policy.turn_goes_to(ranked, i, spent)]
                try:
                    claimed = self._claim(model, target, k, accounts.cap(lane["account_id"]), scope,
                                          batch=read.pop(target["batch_id"], None), most=most)
                    if not claimed and target is not lane:
                        spent.add(target["sk"])
                        claimed = self._claim(model, lane, k, accounts.cap(lane["account_id"]), scope,
                                              batch=read.pop(lane["batch_id"], None), most=most)
                except Throttled:
                    return out  # DynamoDB is busy: send what was claimed, try the rest next pass
                n = sum(len(unit.get("positions", [unit])) for unit in claimed)
                out += claimed
                free -= n
                budget -= n
                accounts.took(lane["account_id"], n)
                if free <= 0 or budget <= 0:
                    return out
            if complete:
                return out
            lanes, complete = Lane.in_turn(self.svc.table, model.id, lanes[-1]["sk"],
                                           policy.lanes_to_read(free, config.lane_quantum))
        return out

    def _claim(self, model: Model, lane: dict, k: int, account_cap: int, scope: ClaimScope,
               batch: dict | None = None, most: float = 0) -> list[dict]:
        """Claim about `k` of the lane's requests. `batch`: the lane's batch if this claim has just read it.
        `most`: how many it may take to leave no stub behind (`policy.lane_take`); none past `k` when 0."""
        svc = self.svc
        if batch is None:
            batch = self._batch(lane["batch_id"], scope)
        if left_behind(batch, model.id):  # remove it so it takes no more turns
            Lane.discard(svc.table, lane)
            return []
        # Nothing once the window has closed (the sweeper expires the batch).
        config = self.config
        k = policy.lane_take(k, self._room(batch, model.id), most, config.lane_quantum, config.claim_max)
        if scope.wave is not None:  # a pump takes of a lane what its own slots run soon; the rest waits there
            k = int(min(k, policy.lane_most_in_pump(scope.wave, scope.here.get(batch["id"], 0),
                                                    scope.shared and self.seen > 1)))
        # Without a lease the slots come from the budget's shards, the roomiest first, as many as they have free.
        parts = None if scope.slot_lease else scope.draws.split(k)
        if parts is not None:
            k = sum(n for _, n in parts)
        if k <= 0:
            return []
        lane_next = int(batch["lanes"][model.id]["next"])
        positions = self._positions(batch, model.id, lane_next, k)
        if batch.get("max_cost_usd") is not None:
            positions = within_cap(batch, model, positions)
            if not positions:  # the next one waits for what runs to settle; with nothing running, it stops
                if int(batch.get("in_flight", 0)) == 0:
                    scope.at_cap.add(batch["id"])
                return []
        if parts is not None and len(positions) < k:
            parts = scope.draws.split(len(positions))
        try:
            claimed = claim_from_lane(svc, batch, model.id, positions, lane_next, parts, account_cap,
                                      running=scope.running, slot_lease=scope.slot_lease)
        except ConditionFailed:
            return []  # another dispatcher advanced the lane or took the slots; next pass
        for take, n in parts or []:
            scope.draws.took(take.shard, n)
        scope.here[batch["id"]] = scope.here.get(batch["id"], 0) + len(positions)
        if lane_next + len(positions) >= int(batch["lanes"][model.id]["total"]):
            scope.emptied.add(batch["id"])
        return claimed

    def _batch(self, batch_id: str, scope: ClaimScope) -> dict | None:
        batch = Batch.get(self.svc.table, batch_id)
        if batch is not None:
            scope.batches_seen[batch["id"]] = batch
        return batch

    def _room(self, batch: dict | None, model_id: str) -> int:
        """How many of the batch's requests on the model a claim could dispatch now."""
        if left_behind(batch, model_id):
            return 0
        # A paused batch's lanes were removed with its pause; one read just before takes no work (not
        # discarded: a resume may have put it back since).
        if self.svc.now() >= batch["expires_at"] or batch.get("paused_at"):
            return 0
        state = batch["lanes"][model_id]
        return policy.lane_room(int(state["total"]), int(state["next"]))

    def _positions(self, batch: dict, model_id: str, lane_next: int, k: int) -> list[Position]:
        if lane_in_order(batch):  # its one lane is simply 0..n-1
            indexes = list(range(lane_next, lane_next + k))
        else:
            cache_key = (batch["id"], model_id)
            if cache_key not in self._lane_positions:
                raw = self.svc.blobs.get(lane_object(batch["id"], model_id)) or b"[]"
                self._lane_positions[cache_key] = json.loads(raw)
            indexes = self._lane_positions[cache_key][lane_next:lane_next + k]
        positions = []
        for index in indexes:
            entry = self._index_entry(batch["id"], index)
            positions.append(Position(index=index, custom_id=entry.custom_id, offset=entry.offset, length=entry.length,
                                      worst_usd=self._worst(batch, model_id, entry), prefix=entry.prefix))
        return positions

    def _worst(self, batch: dict, model_id: str, entry: IndexEntry) -> float | None:
        """A capped batch's request's worst case (an entry without an output bound can never fit)."""
        if batch.get("max_cost_usd") is None:
            return None
        bound = entry.output_bound
        return math.inf if bound is None else worst_usd(self.svc.catalog.get(model_id), entry.length, bound)

    def next_positions(self, batch: dict, model_id: str) -> list[Position]:
        """The lane's next request (none when it has none left), for the sweeper's look at a capped batch."""
        state = batch["lanes"][model_id]
        if int(state["next"]) >= int(state["total"]):
            return []
        return self._positions(batch, model_id, int(state["next"]), 1)

    def _index_entry(self, batch_id: str, index: int) -> IndexEntry:
        chunk = index // INDEX_CHUNK
        key = (batch_id, chunk)
        if key not in self._chunks:  # lanes are read in order: one S3 read per 5,000 requests
            if len(self._chunks) >= 16:
                self._chunks.pop(next(iter(self._chunks)))
            self._chunks[key] = json.loads(self.svc.blobs.get(index_object(batch_id, chunk)) or b"[]")
        return IndexEntry.read(self._chunks[key][index - chunk * INDEX_CHUNK])


def within_cap(batch: dict, model: Model, positions: list[Position]) -> list[Position]:
    """The first of `positions` whose worst cases fit, together, within the batch's spending cap beside what
    it has committed (as read: the claim's condition fences the sum as it is when written)."""
    room = float(batch["max_cost_usd"]) - float(batch.get("committed_usd", 0))
    total, kept = 0.0, []
    for position in positions:
        if not fits(total, room, position.worst_usd if position.worst_usd is not None else math.inf):
            break
        total += float(position.worst_usd)  # type: ignore[arg-type]
        kept.append(position)
    return kept


def left_behind(batch: dict | None, model_id: str) -> bool:
    """A lane whose batch stopped or was deleted."""
    return (batch is None or bool(batch.get("stop")) or bool(batch.get("deleting"))
            or model_id not in batch.get("lanes", {}))
