"""The dispatcher: due requests onto their model's queue, within budgets, batches taking turns."""

from __future__ import annotations

import json
import logging
import math
import random
import time
from collections import defaultdict

from ..catalog import Model
from ..domain import RequestState
from ..layout import INDEX_CHUNK, index_object, lane_created_at, lane_object, lane_turn_at
from ..ledger import GROUP_MAX, Position, claim_from_lane, claim_retry, queue_message
from ..records import Account, Batch, Lane, Request
from ..runtime import Services
from ..storage.dynamo import ConditionFailed, Throttled
from .capacity import Draws, InteractiveMemory, effective_budget, probe_up, read_budget

log = logging.getLogger(__name__)
# Slots a lane is given per turn while more lanes wait than there are free slots. Each group pays a claim
# and a close whatever its size; one slot per turn over many lanes made every group a single request (and
# wrote the budget and account items twice per request). Turns still rotate over every lane, so every
# batch gets its share, a quantum at a time. Half of a 16-slot budget: at 200 lanes, groups of 8 wrote 4.4
# write units per request against 5.6 for groups of 4, with the same fairness (docs/benchmarks.md §9).
LANE_QUANTUM = 8


class Dispatcher:
    """Keeps a little state between passes inside one invocation: whose turn it is, lane positions."""

    def __init__(self, svc: Services, runs_what_it_claims: bool = False) -> None:
        self.svc = svc
        # A worker pulling work runs it at once: its groups are claimed already running (one transaction
        # fewer per group; the claim is fenced against a stopped batch as a start is).
        self.runs_what_it_claims = runs_what_it_claims
        # Whose turn it is, per model; a random start so that many short-lived dispatchers (workers pulling
        # their next request) do not all favour the first lane.
        self.turn: dict[str, int] = defaultdict(lambda: random.randrange(1 << 16))
        self.last_served: dict[str, str] = {}  # per model, the sort key of the lane served last
        self._lane_positions: dict[tuple[str, str], list[int]] = {}
        self._chunks: dict[tuple[str, int], list] = {}
        self.batches_seen: dict[str, dict] = {}  # the batches read by the last claims, for a worker to reuse
        self.draws = Draws(None, 0)  # the budget's shards as the current claim read them (without a lease)
        self.slot_lease: dict | None = None  # the SlotLease the current claim's work runs in, if any
        self.lanes_seen = 0  # how many batches had work for the model at the last claim (of those it read)
        self.most: float = math.inf  # the most the current claim in a lease may take (`claim`'s `most`)
        self.interactive = InteractiveMemory()  # the interactive load seen lately, per model

    def run(self, seconds: float) -> int:
        """Refill free slots until `seconds` have passed; a freed slot waits at most one idle sleep."""
        deadline = time.monotonic() + seconds
        sent = 0
        while True:
            n = self.pass_once()
            sent += n
            if time.monotonic() >= deadline:
                return sent
            if n == 0:
                time.sleep(self.svc.settings.dispatcher_idle_sleep_seconds)

    def pass_once(self) -> int:
        sent = 0
        for model in self.svc.catalog.runnable:
            try:
                sent += self.dispatch_model(model)
            except Throttled:
                log.warning("throttled while dispatching %s", model.id)
        return sent

    def dispatch_model(self, model: Model) -> int:
        """Claim what the model has room for and send it to the model's queue."""
        dispatched = self.claim(model)
        if dispatched:
            try:
                failed = self.svc.queues.send(model.id, [queue_message(r) for r in dispatched])
            except Exception:  # the claims stand; their leases run out and the sweeper puts them back
                log.exception("could not send %d messages for %s", len(dispatched), model.id)
                failed = dispatched
            if failed:
                log.warning("SQS refused %d messages for %s; the lease recovers them", len(failed), model.id)
        return sum(len(unit.get("positions", [unit])) for unit in dispatched)

    def claim(self, model: Model, limit: int | None = None, slot_lease: dict | None = None,
              budget_item: dict | None = None, most: int | None = None) -> list[dict]:
        """Claim up to `limit` due requests of the model within its budget and the accounts' tier limits,
        retries first, then batches in turn. Returns what was dispatched (not yet sent): retried requests,
        and groups of first attempts. With `slot_lease` (and the `budget_item` its holder just read), they
        run in the lease's slots: about `limit` of them, whatever the budget has free (while many lanes
        wait, a whole quantum for each lane served: its holder queues what its slots cannot run yet), and
        never more than `most` (what its holder can start in time), if given."""
        svc = self.svc
        self.batches_seen = {}
        self.slot_lease = slot_lease
        self.most = math.inf if most is None else most
        if slot_lease is None:
            budget_item = read_budget(svc, model)
            probe_up(svc, model, budget_item)
        level = self.interactive.level(model.id, budget_item)
        if slot_lease is None and not self.interactive.knows(model.id, budget_item, svc.now_ms()):
            return []  # interactive load moved a moment ago and this dispatcher is new: it watches first
        cap = effective_budget(model, budget_item, svc.settings.interactive_yield_per_request, level)
        self.draws = Draws(budget_item, cap)
        free = cap - int((budget_item or {}).get("in_flight", 0)) if slot_lease is None else int(limit or 0)
        if limit is not None:
            free = min(free, limit)
        if free <= 0:
            return []
        accounts: dict[str, int] = {}  # account id -> free account slots, read once per pass
        dispatched: list[dict] = []

        def account_free(account_id: str) -> int:
            if account_id not in accounts:
                account = Account.get(svc.table, account_id) or {}
                limit = svc.settings.tier_limits.get(account.get("tier", "free"), 0)
                limits[account_id] = limit
                accounts[account_id] = limit - int(account.get("in_flight", 0))
            return accounts[account_id]

        limits: dict[str, int] = {}  # account id -> its tier's limit, read with account_free

        def tier_cap(account_id: str) -> int:
            account_free(account_id)
            return limits[account_id]

        # Requests waiting for a retry go first: they have already waited their turn. The model's
        # `waiting` count says whether there are any, so an idle retry set costs no index query.
        waiting: list[dict] = []
        if int((budget_item or {}).get("waiting", 0)) > 0:
            waiting = Request.due_retries(svc.table, model.id, svc.now(), limit=free)
        for stale in waiting:
            if free <= 0:
                break
            req = svc.table.get(stale["pk"], stale["sk"])
            if not req or req.get("state") != RequestState.WAITING.value or account_free(req["account_id"]) <= 0:
                continue
            one = None if slot_lease else self.draws.split(1)  # a slot of the roomiest shard
            if one == []:
                break
            draw = one[0][0] if one else None
            try:
                dispatched.append(claim_retry(svc, req, draw, tier_cap(req["account_id"]), slot_lease=slot_lease))
                if draw is not None:
                    self.draws.took(draw.shard, 1)
            except ConditionFailed:
                # Another dispatcher took it, the budget filled, or the batch stopped; look again next pass.
                continue
            except Throttled:
                free = 0  # DynamoDB is busy: stop claiming this pass, but send what was claimed
                break
            free -= 1
            accounts[req["account_id"]] -= 1

        if free > 0:
            try:
                dispatched += self._dispatch_lanes(model, free, account_free, tier_cap, accounts)
            except Throttled:
                log.warning("throttled while claiming for %s", model.id)
        return dispatched

    def _lanes_in_turn(self, model_id: str, want: int) -> tuple[list[dict], bool]:
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

    def _dispatch_lanes(self, model: Model, free: int, account_free, tier_cap, accounts) -> list[dict]:
        # Batches take turns: free slots go a slot at a time while every lane gets a quantum or more (to the
        # batches holding fewest), a quantum at a time while not; the next claim starts after the last lane
        # served. Only the lanes this claim can serve are read (one more than its quanta), so a claim costs
        # the same over 2 batches or 10,000.
        lanes, complete = self._lanes_in_turn(model.id, -(-free // LANE_QUANTUM) + 1)
        self.lanes_seen = len(lanes)
        if not lanes:
            return []
        if not complete or free < LANE_QUANTUM * len(lanes):
            return self._dispatch_quanta(model, lanes, complete, free, account_free, tier_cap, accounts)
        # Few lanes, all read: fill up the batches holding the fewest slots first (each batch's `in_flight`),
        # so that a batch that just arrived takes the freed slots until it holds as many as the others,
        # rather than half of each claim's (which left it a whole round of calls behind); ties go in turn.
        batches = {lane["batch_id"]: self._batch(lane["batch_id"]) for lane in lanes}
        for lane in lanes:
            if self._left_behind(batches[lane["batch_id"]], model.id):
                Lane.discard(self.svc.table, lane)  # so it takes no more turns
        held = {b: int((batch or {}).get("in_flight", 0)) for b, batch in batches.items()}
        room = {b: self._room(batch, model.id) for b, batch in batches.items()}
        shares: dict[str, int] = defaultdict(int)
        given_last: str | None = None
        while free > 0:
            ready = [lane for lane in lanes
                     if room[lane["batch_id"]] > shares[lane["batch_id"]] and account_free(lane["account_id"]) > 0]
            if not ready:
                break
            lane = min(ready, key=lambda lane: held[lane["batch_id"]] + shares[lane["batch_id"]])  # first in turn
            shares[lane["batch_id"]] += 1
            accounts[lane["account_id"]] -= 1
            free -= 1
            given_last = lane["sk"]
        if given_last is not None:  # by the lane's key, not its place: lanes come and go between claims
            self.last_served[model.id] = given_last
        out: list[dict] = []
        for lane in lanes:
            k = shares.get(lane["batch_id"], 0)
            if k:
                try:
                    out += self._claim(model, lane, k, tier_cap(lane["account_id"]), batch=batches[lane["batch_id"]])
                except Throttled:
                    break  # DynamoDB is busy: send what was claimed, try the rest next pass
        return out

    def _batch(self, batch_id: str) -> dict | None:
        batch = Batch.get(self.svc.table, batch_id)
        if batch is not None:
            self.batches_seen[batch["id"]] = batch
        return batch

    @staticmethod
    def _left_behind(batch: dict | None, model_id: str) -> bool:
        """A lane whose batch stopped or was deleted."""
        return (batch is None or bool(batch.get("stop")) or bool(batch.get("deleting"))
                or model_id not in batch.get("lanes", {}))

    def _room(self, batch: dict | None, model_id: str) -> int:
        """How many of the batch's requests on the model a claim could dispatch now."""
        if self._left_behind(batch, model_id):
            return 0
        if self.svc.now() >= batch["expires_at"]:
            return 0
        state = batch["lanes"][model_id]
        return max(0, int(state["total"]) - int(state["next"]))

    # Pages of lanes one claim reads at most when lanes it reads cannot take work (their accounts at their
    # tier limit, their batches stopping): it stays O(1); the next claim goes on from where this one ended.
    QUANTA_PAGES = 4

    def _dispatch_quanta(self, model: Model, lanes: list[dict], complete: bool, free: int, account_free, tier_cap,
                         accounts) -> list[dict]:
        """Fewer free slots than a quantum for every lane: lanes in turn take a quantum each, claimed one
        lane after another, so what a short lane cannot take goes to the next, read a page at a time."""
        out: list[dict] = []
        seen: set[str] = set()
        # The most this claim takes: the free slots, or in a lease what its holder can start in time (a
        # pump's claim gives each lane it serves a whole quantum, even past what it asked for: it queues
        # the rest, and a remainder would be a small group of its own, which pays a whole claim and close,
        # and, as its own pump's first lease, kept making small groups).
        budget = self.most if self.slot_lease else free
        for _ in range(self.QUANTA_PAGES):
            for lane in lanes:
                if lane["sk"] in seen:
                    return out  # round the ring once
                seen.add(lane["sk"])
                # Every lane looked at has had its turn, served or not (its account full): the next claim
                # starts after it.
                self.last_served[model.id] = lane["sk"]
                most = min(account_free(lane["account_id"]), budget)
                k = min(LANE_QUANTUM, most)
                if k <= 0:
                    continue
                try:
                    claimed = self._claim(model, lane, k, tier_cap(lane["account_id"]), most=most)
                except Throttled:
                    return out  # DynamoDB is busy: send what was claimed, try the rest next pass
                n = sum(len(unit.get("positions", [unit])) for unit in claimed)
                out += claimed
                free -= n
                budget -= n
                accounts[lane["account_id"]] -= n
                if free <= 0 or budget <= 0:
                    return out
            if complete:
                return out
            lanes, complete = Lane.in_turn(self.svc.table, model.id, lanes[-1]["sk"], -(-free // LANE_QUANTUM) + 1)
        return out

    def _claim(self, model: Model, lane: dict, k: int, account_cap: int, batch: dict | None = None,
               most: int = 0) -> list[dict]:
        """`batch`: the lane's batch if this claim has just read it. `most`: how many it may take to leave
        no stub of less than half a quantum behind (the lane's last group would pay a claim and a close for
        it); none past `k` when 0."""
        svc = self.svc
        if batch is None:
            batch = self._batch(lane["batch_id"])
        if self._left_behind(batch, model.id):  # remove it so it takes no more turns
            Lane.discard(svc.table, lane)
            return []
        # Nothing once the window has closed (the sweeper expires the batch). At most 10 groups a claim: with
        # the lane, slots and group items well inside a transaction's 100.
        room = self._room(batch, model.id)
        if 0 < room - k <= LANE_QUANTUM // 2:
            k = max(k, min(room, most))
        k = min(k, room, 10 * GROUP_MAX)
        # Without a lease the slots come from the budget's shards, the roomiest first, as many as they have free.
        parts = None if self.slot_lease else self.draws.split(k)
        if parts is not None:
            k = sum(n for _, n in parts)
        if k <= 0:
            return []
        lane_next = int(batch["lanes"][model.id]["next"])
        positions = self._positions(batch, model.id, lane_next, k)
        if parts is not None and len(positions) < k:
            parts = self.draws.split(len(positions))
        try:
            claimed = claim_from_lane(svc, batch, model.id, positions, lane_next, parts, account_cap,
                                      running=self.runs_what_it_claims, slot_lease=self.slot_lease)
        except ConditionFailed:
            return []  # another dispatcher advanced the lane or took the slots; next pass
        for draw, n in parts or []:
            self.draws.took(draw.shard, n)
        return claimed

    def _positions(self, batch: dict, model_id: str, lane_next: int, k: int) -> list[Position]:
        if len(batch["lanes"]) == 1 and not batch.get("rejected"):  # its one lane is simply 0..n-1
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
            positions.append(Position(index=index, custom_id=entry[0], offset=entry[2], length=entry[3]))
        return positions

    def _index_entry(self, batch_id: str, index: int) -> list:
        chunk = index // INDEX_CHUNK
        key = (batch_id, chunk)
        if key not in self._chunks:  # lanes are read in order: one S3 read per 5,000 requests
            if len(self._chunks) >= 16:
                self._chunks.pop(next(iter(self._chunks)))
            self._chunks[key] = json.loads(self.svc.blobs.get(index_object(batch_id, chunk)) or b"[]")
        return self._chunks[key][index - chunk * INDEX_CHUNK]
