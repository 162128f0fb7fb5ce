"""The scheduler's arithmetic (batchinfer.scheduling.policy) on its own: no store, no clock. Each function
against a table of cases, and its invariants against generated ones: never above the cap, the budget or
what is free; every lane with work served when there is room; slots given back in proportion."""

from __future__ import annotations

import dataclasses
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from batchinfer.layout import owner_sort
from batchinfer.scheduling import policy
from batchinfer.scheduling.config import SchedulerConfig, scheduler_config
from batchinfer.scheduling.policy import LaneWant
from batchinfer.scheduling.pump import created_us
from batchinfer.settings import Settings

settings.register_profile("scheduling", deadline=None, max_examples=200)
settings.load_profile("scheduling")

small = st.integers(min_value=0, max_value=64)
seconds = st.floats(min_value=0.0, max_value=30.0, allow_nan=False)
positive_seconds = st.floats(min_value=1e-3, max_value=30.0, allow_nan=False)


# --- The model's cap --------------------------------------------------------------------------------------

@pytest.mark.parametrize(("budget", "floor", "interactive", "adaptive", "cap"), [
    (16, 2, 0, None, 16), (16, 2, 5, None, 11), (16, 2, 100, None, 2), (16, 2, 0, 6, 6), (16, 2, 0, 1, 2),
    (16, 2, 8, 12, 8), (4, 8, 10, None, 4),  # a floor above the budget is the budget
])
def test_effective_cap(budget, floor, interactive, adaptive, cap):
    assert policy.effective_cap(budget, floor, interactive, 1, adaptive) == cap


@given(budget=small, floor=small, interactive=small, more=small, yield_per_request=st.integers(0, 4),
       adaptive=st.none() | small)
def test_the_cap_stays_within_floor_and_budget_and_gives_way_to_interactive_load(budget, floor, interactive, more,
                                                                                 yield_per_request, adaptive):
    cap = policy.effective_cap(budget, floor, interactive, yield_per_request, adaptive)
    assert min(floor, budget) <= cap <= budget
    assert policy.effective_cap(budget, floor, interactive + more, yield_per_request, adaptive) <= cap


@pytest.mark.parametrize(("budget", "floor", "in_flight", "cap"), [(16, 2, 10, 5), (16, 2, 3, 2), (16, 0, 1, 0)])
def test_backed_off_cap_halves_what_was_in_flight_down_to_the_floor(budget, floor, in_flight, cap):
    assert policy.backed_off_cap(budget, floor, in_flight) == cap


@pytest.mark.parametrize(("now", "throttled_at", "probed_at", "may"), [
    (10, 8, 9, True), (10, 9, 0, False), (10, 0, 10, False), (10, 0, 11, False)])
def test_may_probe_after_a_quiet_spell_once_a_second(now, throttled_at, probed_at, may):
    assert policy.may_probe(now, throttled_at, probed_at, probe_after=2) is may


@pytest.mark.parametrize(("adaptive", "budget", "grown"), [(6, 16, 7), (14, 16, 15), (15, 16, None), (20, 16, None)])
def test_probed_cap_grows_one_slot_until_the_budget(adaptive, budget, grown):
    assert policy.probed_cap(adaptive, budget) == grown


@pytest.mark.parametrize(("rooms", "k", "parts"), [
    ([2, 0, 3], 4, [(2, 3), (0, 1)]), ([2, 0, 3], 0, []), ([0, 0], 5, []), ([4], 2, [(0, 2)]),
    ([1, 1, 1], 5, [(0, 1), (1, 1), (2, 1)]),  # ties in the tiebreak's order (here: constant, so by shard)
])
def test_split_take_takes_from_the_roomiest_shards_first(rooms, k, parts):
    assert policy.split_take(rooms, k, tiebreak=lambda: 0.0) == parts


@given(rooms=st.lists(st.integers(-2, 40), max_size=8), k=st.integers(-2, 200), seed=st.randoms())
def test_a_take_never_passes_a_shards_room_and_takes_all_it_can(rooms, k, seed):
    parts = policy.split_take(rooms, k, tiebreak=seed.random)
    shards = [shard for shard, _ in parts]
    assert len(shards) == len(set(shards))
    assert all(0 < n <= rooms[shard] for shard, n in parts)
    assert sum(n for _, n in parts) == max(0, min(k, sum(r for r in rooms if r > 0)))


# --- Lanes ------------------------------------------------------------------------------------------------

@pytest.mark.parametrize(("free", "quantum", "lanes"), [(8, 8, 2), (9, 8, 3), (1, 8, 2), (16, 4, 5)])
def test_lanes_to_read_one_per_quantum_and_one_more(free, quantum, lanes):
    assert policy.lanes_to_read(free, quantum) == lanes


@pytest.mark.parametrize(("complete", "free", "lanes", "quanta"), [
    (True, 16, 2, False), (True, 15, 2, True), (False, 100, 2, True), (True, 8, 1, False)])
def test_by_quanta_while_the_free_slots_cannot_give_every_lane_a_quantum(complete, free, lanes, quanta):
    assert policy.by_quanta(complete, free, 8, lanes) is quanta


def lanes_of(*rows: tuple) -> list[LaneWant]:
    return [LaneWant(key=key, account=account, held=held, room=room) for key, account, held, room in rows]


@pytest.mark.parametrize(("lanes", "free", "accounts", "shares", "last"), [
    # A batch that arrives takes the freed slots until it holds as many as the others.
    (lanes_of(("a", "x", 8, 40), ("b", "x", 0, 20)), 8, {"x": 64}, {"b": 8}, "b"),
    # A short lane takes what it has; the rest goes to the others in turn, the fewest held first.
    (lanes_of(("a", "x", 8, 40), ("b", "x", 8, 20), ("c", "x", 0, 3)), 12, {"x": 64}, {"c": 3, "a": 5, "b": 4}, "a"),
    # An account's free slots bound its lanes together.
    (lanes_of(("a", "x", 0, 10), ("b", "x", 0, 10), ("c", "y", 0, 10)), 10, {"x": 3, "y": 64},
     {"a": 2, "b": 1, "c": 7}, "c"),
    # Nothing to give.
    (lanes_of(("a", "x", 0, 0)), 5, {"x": 64}, {}, None),
    (lanes_of(("a", "x", 0, 5)), 5, {"x": 0}, {}, None),
])
def test_water_fill(lanes, free, accounts, shares, last):
    assert policy.water_fill(lanes, free, accounts) == (shares, last)


lane_rows = st.lists(st.tuples(st.integers(0, 3), st.integers(0, 40), st.integers(0, 30)), min_size=1, max_size=8)


@given(rows=lane_rows, free=st.integers(0, 120), account_rooms=st.lists(st.integers(0, 40), min_size=4, max_size=4))
def test_water_fill_shares_only_what_is_free_and_fills_the_fewest_first(rows, free, account_rooms):
    lanes = [LaneWant(key=i, account=account, held=held, room=room) for i, (account, held, room) in enumerate(rows)]
    accounts = dict(enumerate(account_rooms))
    shares, last = policy.water_fill(lanes, free, accounts)
    given_ = sum(shares.values())
    assert given_ <= free
    assert all(0 < shares[lane.key] <= lane.room for lane in lanes if lane.key in shares)
    for account, room in accounts.items():
        assert sum(shares.get(lane.key, 0) for lane in lanes if lane.account == account) <= room
    assert (last is None) == (given_ == 0)
    # Work-conserving: what is left free has no lane to go to.
    left = {a: room - sum(shares.get(lane.key, 0) for lane in lanes if lane.account == a)
            for a, room in accounts.items()}
    still_ready = [lane for lane in lanes if lane.room > shares.get(lane.key, 0) and left[lane.account] > 0]
    assert given_ == free or not still_ready
    # The fewest first: a lane given slots never ends more than one above a lane that could still take one.
    for lane in lanes:
        if shares.get(lane.key):
            for other in still_ready:
                assert lane.held + shares[lane.key] - 1 <= other.held + shares.get(other.key, 0)


@given(rows=st.lists(st.tuples(st.integers(0, 30), st.integers(1, 30)), min_size=1, max_size=8),
       extra=st.integers(0, 40))
def test_water_fill_starves_no_lane_when_there_is_room(rows, extra):
    """Enough free slots to lift every lane to the most any holds, and one more each: every lane with work
    (and an account with room) gets a share."""
    lanes = [LaneWant(key=i, account=i, held=held, room=room) for i, (held, room) in enumerate(rows)]
    top = max(lane.held for lane in lanes)
    free = sum(top - lane.held + 1 for lane in lanes) + extra
    shares, _ = policy.water_fill(lanes, free, {lane.account: 1000 for lane in lanes})
    assert all(shares.get(lane.key, 0) >= 1 for lane in lanes)


# --- Priority: an account's slots go to its highest-priority lanes first ------------------------------------

def ranked(*rows: tuple) -> list[LaneWant]:
    """Lanes from (key, account, held, room, priority)."""
    return [LaneWant(key=key, account=account, held=held, room=room, rank=policy.rank(priority))
            for key, account, held, room, priority in rows]


@pytest.mark.parametrize(("priority", "rank"), [("high", 2), ("normal", 1), ("low", 0), (None, 1), ("other", 1)])
def test_rank_of_a_priority(priority, rank):
    assert policy.rank(priority) == rank


@pytest.mark.parametrize(("lanes", "shares", "out"), [
    # A high batch that arrives after a large normal one of the same account takes the account's slots first.
    (ranked(("big", "x", 16, 400, "normal"), ("new", "x", 0, 30, "high")), {"big": 4, "new": 4}, {"new": 8}),
    # Up to its room; the rest goes to the next rank.
    (ranked(("big", "x", 16, 400, "normal"), ("new", "x", 0, 3, "high")), {"big": 4, "new": 4},
     {"new": 3, "big": 5}),
    # Low goes last: normal first, then low.
    (ranked(("a", "x", 0, 10, "low"), ("b", "x", 0, 4, "normal"), ("c", "x", 0, 10, "low")),
     {"a": 4, "b": 4, "c": 4}, {"b": 4, "a": 4, "c": 4}),
    (ranked(("a", "x", 0, 10, "low"), ("b", "x", 0, 10, "normal")), {"a": 3, "b": 3}, {"b": 6}),
    # Lanes of one rank share what reaches them by the water-fill (fewest held first).
    (ranked(("a", "x", 6, 20, "high"), ("b", "x", 0, 20, "high"), ("c", "x", 0, 20, "low")),
     {"a": 2, "b": 4, "c": 4}, {"b": 8, "a": 2}),
    # Another account's shares never move, whatever the priorities.
    (ranked(("a", "x", 8, 20, "low"), ("b", "y", 8, 20, "high"), ("c", "x", 0, 20, "high")),
     {"a": 3, "b": 5, "c": 2}, {"b": 5, "c": 5}),
    # An account whose lanes all have one priority keeps its shares.
    (ranked(("a", "x", 8, 20, "high"), ("b", "x", 0, 20, "high")), {"a": 1, "b": 7}, {"a": 1, "b": 7}),
    (ranked(("a", "x", 0, 20, "normal"), ("b", "x", 0, 20, "high")), {}, {}),
])
def test_by_priority(lanes, shares, out):
    assert policy.by_priority(lanes, shares) == out


@pytest.mark.parametrize(("lanes", "index", "spent", "goes_to"), [
    # The turn of a normal lane goes to its account's high lane; another account's lane keeps its own.
    (ranked(("a", "x", 0, 1, "normal"), ("b", "y", 0, 1, "normal"), ("c", "x", 0, 1, "high")), 0, (), 2),
    (ranked(("a", "x", 0, 1, "normal"), ("b", "y", 0, 1, "normal"), ("c", "x", 0, 1, "high")), 1, (), 1),
    # The highest rank wins; on ties, the first in turn after the lane.
    (ranked(("a", "x", 0, 1, "low"), ("b", "x", 0, 1, "normal"), ("c", "x", 0, 1, "high"),
            ("d", "x", 0, 1, "high")), 0, (), 2),
    (ranked(("a", "x", 0, 1, "low"), ("b", "x", 0, 1, "normal"), ("c", "x", 0, 1, "high"),
            ("d", "x", 0, 1, "high")), 3, (), 3),
    # A higher lane found with nothing to claim is passed over.
    (ranked(("a", "x", 0, 1, "low"), ("b", "x", 0, 1, "normal"), ("c", "x", 0, 1, "high")), 0, ("c",), 1),
    (ranked(("a", "x", 0, 1, "high"), ("b", "x", 0, 1, "low")), 1, (), 0),
])
def test_turn_goes_to(lanes, index, spent, goes_to):
    assert policy.turn_goes_to(lanes, index, spent) == goes_to


@pytest.mark.parametrize(("lanes", "order"), [
    # A batch that arrived late holds nothing: its lane takes the first turn, whatever its place in the ring.
    (ranked(("big", "x", 20, 380, None), ("new", "x", 0, 30, None)), [1, 0]),
    (ranked(("new", "x", 0, 30, None), ("big", "x", 20, 380, None)), [0, 1]),
    # It keeps the first turn until it holds as many as the others (ties: the ring's order).
    (ranked(("big", "x", 12, 380, None), ("new", "x", 16, 14, None)), [0, 1]),
    (ranked(("big", "x", 16, 380, None), ("new", "x", 16, 14, None)), [0, 1]),
    (ranked(("a", "x", 8, 9, None), ("b", "y", 3, 9, None), ("c", "x", 8, 9, None), ("d", "z", 0, 9, None)),
     [3, 1, 0, 2]),
    (ranked(("a", "x", 0, 9, None)), [0]),
])
def test_in_deficit_order(lanes, order):
    assert policy.in_deficit_order(lanes) == order


@given(helds=st.lists(st.integers(0, 64), min_size=0, max_size=10))
def test_the_deficit_order_is_every_lane_once_fewest_held_first_and_the_ring_on_ties(helds):
    lanes = [LaneWant(key=i, account="x", held=held, room=1) for i, held in enumerate(helds)]
    order = policy.in_deficit_order(lanes)
    assert sorted(order) == list(range(len(lanes)))
    for before, after in zip(order, order[1:], strict=False):
        assert (helds[before], before) < (helds[after], after)


priority_rows = st.lists(st.tuples(st.integers(0, 2), st.integers(0, 40), st.integers(0, 30),
                                   st.sampled_from(("high", "normal", "low", None))), min_size=1, max_size=8)


@given(rows=priority_rows, free=st.integers(0, 120), account_rooms=st.lists(st.integers(0, 40), min_size=3, max_size=3))
def test_priority_moves_slots_only_within_an_account_and_to_its_higher_lanes_first(rows, free, account_rooms):
    lanes = ranked(*[(i, account, held, room, priority) for i, (account, held, room, priority) in enumerate(rows)])
    accounts = dict(enumerate(account_rooms))
    shares, _ = policy.water_fill(lanes, free, accounts)
    out = policy.by_priority(lanes, shares)
    # The accounts' totals do not change with priority, and no lane gets past its room.
    for account in accounts:
        assert (sum(out.get(lane.key, 0) for lane in lanes if lane.account == account)
                == sum(shares.get(lane.key, 0) for lane in lanes if lane.account == account))
    assert all(0 < out[lane.key] <= lane.room for lane in lanes if lane.key in out)
    # A higher-priority lane of an account never gets fewer slots than a lower one of the same account while
    # it has work: a lower lane gets any only once every higher one of its account is full.
    for high in lanes:
        for low in lanes:
            if high.account == low.account and high.rank > low.rank and out.get(low.key, 0) > 0:
                assert out.get(high.key, 0) == high.room  # its work is all given: it has no more
    for high in lanes:
        for low in lanes:
            if high.account == low.account and high.rank > low.rank and out.get(high.key, 0) < high.room:
                assert out.get(high.key, 0) >= out.get(low.key, 0)


@given(rows=priority_rows, index=st.integers(0, 7), spent=st.sets(st.integers(0, 7)))
def test_a_turn_stays_with_its_account_and_goes_to_its_highest_lane(rows, index, spent):
    lanes = ranked(*[(i, account, held, room, priority) for i, (account, held, room, priority) in enumerate(rows)])
    index %= len(lanes)
    goes_to = lanes[policy.turn_goes_to(lanes, index, spent)]
    assert goes_to.account == lanes[index].account
    assert goes_to.rank >= lanes[index].rank
    assert goes_to.key == lanes[index].key or goes_to.key not in spent
    assert all(lane.rank <= goes_to.rank for lane in lanes if lane.account == goes_to.account and lane.key not in spent)


@pytest.mark.parametrize(("account_free", "budget", "k", "most"), [
    (64, 100, 8, 64), (3, 100, 3, 3), (64, 5, 5, 5), (0, 100, 0, 0), (64, math.inf, 8, 64)])
def test_lane_quantum(account_free, budget, k, most):
    assert policy.lane_quantum(8, account_free, budget) == (k, most)


@pytest.mark.parametrize(("k", "room", "most", "take"), [
    (8, 12, 12, 12),  # 4 left would be a stub: take them too
    (8, 13, 13, 8),  # 5 left is a group worth claiming later
    (8, 12, 8, 8),  # the stub, but the claim may not take it
    (8, 12, 0, 8),  # no `most`: none past k
    (8, 5, 0, 5),  # all the lane has
    (300, 1000, 0, 250),  # at most a claim's worth
    (8, 0, 8, 0),
])
def test_lane_take(k, room, most, take):
    assert policy.lane_take(k, room, most, quantum=8, claim_max=250) == take


@given(k=st.integers(0, 300), room=st.integers(0, 300), most=st.integers(0, 300), quantum=st.integers(1, 32),
       claim_max=st.integers(1, 300))
def test_a_lane_take_stays_within_the_lane_and_the_claim_and_leaves_no_stub_it_could_take(k, room, most, quantum,
                                                                                          claim_max):
    take = policy.lane_take(k, room, most, quantum, claim_max)
    assert min(k, room, claim_max) <= take <= min(room, claim_max)
    assert take <= max(k, most)
    if 0 < room - k <= quantum // 2 and most >= room and claim_max >= room:
        assert take == room


@pytest.mark.parametrize(("wave", "here", "shared", "most"), [
    (6, 6, True, 0),  # a pump of 6 slots running 6 of a newcomer's: the rest waits for a pump with room
    (10, 0, True, 10),  # a pump of 10 whose slots run only the others': a wave of the newcomer's
    (16, 12, True, 4),
    (6, 9, True, 0),  # more here than a wave (claimed before the others came): none, never negative
    (6, 6, False, math.inf),  # alone with work: the pump claims ahead as it would
])
def test_lane_most_in_pump(wave, here, shared, most):
    assert policy.lane_most_in_pump(wave, here, shared) == most


@pytest.mark.parametrize(("open_slots", "ahead", "budget", "wave"), [
    (6, 4, 16, 6),  # long calls: a wave is the slots
    (6, 40, 16, 40),  # calls shorter than a claim: what it claims ahead
    (16, 4, 16, None),  # the whole budget: no pump beside it to leave work to
    (2, 4, 2, None),
])
def test_pump_wave(open_slots, ahead, budget, wave):
    assert policy.pump_wave(open_slots, ahead, budget) == wave


@given(wave=st.integers(0, 64), here=st.integers(0, 200), claims=st.lists(st.integers(0, 64), max_size=6))
def test_a_pump_holds_no_more_of_a_shared_lane_than_a_wave_whatever_its_claims_ask(wave, here, claims):
    # Each claim takes at most the bound (what the lanes count as taken goes into `here`): however many
    # claims, and however much each asks, the batch never holds more than a wave there beyond what it had.
    held = here
    for ask in claims:
        held += int(min(ask, policy.lane_most_in_pump(wave, held, True)))
    assert held <= max(here, wave)


def test_running_past_counts_per_batch_the_calls_that_outlast_the_claim():
    calls = [("big", 0.05), ("big", 0.3), ("big", 1.9), ("new", 1.95), ("new", -0.2), (None, 1.0)]
    assert policy.running_past(calls, 0.2) == {"big": 2, "new": 1, None: 1}
    assert policy.running_past(calls, -math.inf) == {"big": 3, "new": 2, None: 1}  # no answer yet: every call
    assert policy.running_past([], 0.2) == {}


@pytest.mark.parametrize(("total", "dispatched", "room"), [(10, 4, 6), (10, 10, 0), (10, 12, 0)])
def test_lane_room(total, dispatched, room):
    assert policy.lane_room(total, dispatched) == room


# --- The slot pump ----------------------------------------------------------------------------------------

@pytest.mark.parametrize(("slots", "claim_seconds", "call_seconds", "ahead"), [
    (4, 0.05, 1.0, 4),  # calls much longer than a claim: a little more than twice a claim's worth
    (4, 0.1, 0.01, 82),  # calls shorter than a claim: many queued per slot
    (2, 0.5, 0.01, 200),  # bounded by a second of work
    (0, 0.05, 1.0, 2),
    (1, 0.002, 0.0, 6),  # a call average of 0 is taken as a millisecond
])
def test_lookahead(slots, claim_seconds, call_seconds, ahead):
    assert policy.lookahead(slots, claim_seconds, call_seconds, ahead_seconds=1.0) == ahead


@given(slots=small, claim_seconds=seconds, call_seconds=seconds, ahead_seconds=seconds)
def test_work_claimed_ahead_stays_within_its_bound_in_time(slots, claim_seconds, call_seconds, ahead_seconds):
    ahead = policy.lookahead(slots, claim_seconds, call_seconds, ahead_seconds)
    bound = max(2 * slots, math.ceil(slots * ahead_seconds / max(call_seconds, 1e-3)))
    assert 2 <= ahead <= max(2, bound)
    assert 1 <= policy.claim_at(ahead) <= ahead


@pytest.mark.parametrize(("ahead", "at"), [(4, 2), (5, 3), (2, 1), (1, 1), (0, 1)])
def test_claim_at_half_of_ahead(ahead, at):
    assert policy.claim_at(ahead) == at


@pytest.mark.parametrize(("started", "call_seconds", "now", "left"), [
    ([10.0, 10.4], 0.5, 10.5, [0.0, 0.4]), ([9.0], 0.5, 10.0, [-0.5]), ([], 1.0, 3.0, [])])
def test_calls_left(started, call_seconds, now, left):
    assert policy.calls_left(started, call_seconds, now) == pytest.approx(left)


@pytest.mark.parametrize(("claim_seconds", "margin", "horizon"), [(0.05, 0.05, 0.15), (0.0, 0.05, 0.05), (1.0, 0, 2.0)])
def test_claim_horizon_is_a_claims_round_trip_and_a_margin(claim_seconds, margin, horizon):
    assert policy.claim_horizon(claim_seconds, margin) == pytest.approx(horizon)


@pytest.mark.parametrize(("left", "horizon", "soon", "next_in"), [
    ([0.05, 0.5, -1.0], 0.15, 2, 0.35), ([], 0.1, 0, math.inf), ([2.0, 1.0], 0.5, 0, 0.5)])
def test_ending_soon(left, horizon, soon, next_in):
    assert policy.ending_soon(left, horizon) == (soon, pytest.approx(next_in))


@given(left=st.lists(st.floats(-5, 5, allow_nan=False), max_size=10), horizon=seconds)
def test_ending_soon_counts_each_call_once(left, horizon):
    soon, next_in = policy.ending_soon(left, horizon)
    assert soon == sum(1 for seconds_left in left if seconds_left <= horizon)
    assert next_in >= 0 and (next_in == math.inf) == (soon == len(left))


@pytest.mark.parametrize(("idle", "soon", "ahead", "queued", "want"), [(2, 1, 4, 3, 4), (0, 0, 2, 5, -3)])
def test_free_when_claimed(idle, soon, ahead, queued, want):
    assert policy.free_when_claimed(idle, soon, ahead, queued) == want


@pytest.mark.parametrize(("idle", "soon", "ahead", "queued", "most", "want"), [
    (2, 1, 4, 3, 10, 4), (2, 1, 4, 3, 2, 2), (0, 0, 2, 5, 10, -3), (2, 0, 4, 0, -1, -1)])
def test_wanted_is_what_a_claim_should_bring_within_what_can_start_in_time(idle, soon, ahead, queued, most, want):
    assert policy.wanted(idle, soon, ahead, queued, most) == want


@pytest.mark.parametrize(("queued", "slots", "busy", "waiting"), [(5, 2, 2, 5), (5, 4, 2, 3), (1, 4, 1, -2)])
def test_waiting_for_a_runner(queued, slots, busy, waiting):
    assert policy.waiting_for_a_runner(queued, slots, busy) == waiting


@pytest.mark.parametrize(("over_since", "now", "longest_call", "held"), [
    (None, 100.0, 120.0, False),  # within the cap
    (90.0, 100.0, 120.0, True),  # over it: calls running then may still run
    (90.0, 210.0, 120.0, False),  # past the longest call: what is still held is a dead worker's
    (90.0, 209.9, 120.0, True),
])
def test_holding(over_since, now, longest_call, held):
    assert policy.holding(over_since, now, longest_call) is held


@pytest.mark.parametrize(("open_slots", "to_deadline", "calls_left", "call_seconds", "queued", "most"), [
    (2, 1.5, [], 0.5, 0, 6),  # two slots, 1.5 s, calls of 0.5 s
    (2, 1.5, [0.5, 0.5], 0.5, 0, 4),  # the calls in flight take their part of it
    (2, 1.5, [0.5, -3.0], 0.5, 1, 4),  # an overdue call takes none; one queued is one fewer
    (2, -1.0, [], 0.5, 2, -2),  # the deadline has passed: what is queued is already too much
    (0, 10.0, [], 0.5, 0, 0),
])
def test_can_start_in_time(open_slots, to_deadline, calls_left, call_seconds, queued, most):
    assert policy.can_start_in_time(open_slots, to_deadline, calls_left, call_seconds, queued) == most


@given(open_slots=small, to_deadline=st.floats(-10, 60, allow_nan=False),
       calls_left=st.lists(st.floats(-5, 5, allow_nan=False), max_size=8), call_seconds=positive_seconds,
       queued=small)
def test_a_pump_never_plans_more_calls_than_its_slots_can_start_before_the_deadline(open_slots, to_deadline,
                                                                                     calls_left, call_seconds,
                                                                                     queued):
    most = policy.can_start_in_time(open_slots, to_deadline, calls_left, call_seconds, queued)
    assert 0 <= most + queued <= max(0.0, open_slots * to_deadline) / call_seconds + 1e-9


@pytest.mark.parametrize(("open_slots", "lanes_seen", "floor"), [(16, 1, 16), (16, 4, 8), (2, 3, 2), (0, 0, 1),
                                                                   (40, 2, 20)])
def test_claim_floor(open_slots, lanes_seen, floor):
    assert policy.claim_floor(open_slots, 8, lanes_seen) == floor


@pytest.mark.parametrize(("open_slots", "lanes_seen", "ahead_most", "floor"), [
    (16, 1, 8, 8),  # 2 s calls on 16 slots, 1 s ahead: a round (16) would queue 2 s of one batch's work
    (16, 1, 320, 16),  # short calls: a claim per round, as before
    (16, 1, 3, 8),  # never below a quantum
    (40, 2, 12, 12), (2, 1, 1, 2),
])
def test_claim_floor_queues_no_more_than_the_work_ahead_allows_past_a_quantum(open_slots, lanes_seen, ahead_most,
                                                                             floor):
    assert policy.claim_floor(open_slots, 8, lanes_seen, ahead_most) == floor


def queue_of(*rows: tuple) -> list[policy.Queued]:
    """Queued requests from (batch, account, priority); batch None: a retry."""
    return [policy.Queued(batch=batch, account=account, rank=policy.rank(priority))
            for batch, account, priority in rows]


@pytest.mark.parametrize(("queued", "running", "index"), [
    # Work claimed after a large batch's runs as soon as a runner is free: its batch has none running.
    (queue_of(("big", "x", None), ("big", "x", None), ("new", "x", None)), {"big": 16}, 2),
    (queue_of(("big", "x", None), ("new", "y", None)), {"big": 8, "new": 8}, 0),  # even: the first queued
    (queue_of(("big", "x", None), ("new", "y", None)), {"big": 8, "new": 9}, 0),
    # A retry first.
    (queue_of(("new", "x", None), (None, "x", None)), {}, 1),
    # An account's high batch before its normal one whatever they hold; another account's by fewest running.
    (queue_of(("big", "x", "normal"), ("hi", "x", "high")), {"hi": 15}, 1),
    (queue_of(("big", "x", "normal"), ("hi", "x", "high"), ("other", "y", None)), {"hi": 15, "other": 3}, 2),
    (queue_of(("lo", "x", "low"), ("big", "x", None)), {}, 1),
    ([], {}, 0),
])
def test_next_to_run(queued, running, index):
    assert policy.next_to_run(queued, running) == index


@pytest.mark.parametrize(("served", "running", "created", "start"), [
    # A batch created after a large one running 16 calls is owed the 16 starts those calls stand for.
    ({"big": 400}, {"big": 16}, {"big": 1, "new": 2}, 384),
    ({"big": 400, "mid": 30}, {"big": 16, "mid": 8}, {"big": 1, "mid": 2, "new": 3}, 22),
    ({"big": 400, "mid": 30}, {"big": 16}, {"big": 1, "mid": 2, "new": 3}, 30),  # `mid`: queued, none running
    # A batch created earlier whose work reaches this pump after a newer one's is owed nothing by it.
    ({"new": 8}, {"new": 8}, {"big": 1, "new": 2}, 8),
    ({"new": 8, "old": 20}, {"new": 8, "old": 4}, {"big": 1, "new": 2, "old": 0}, 8),
    # Created in the same second: they arrived together, neither is owed.
    ({"big": 400}, {"big": 16}, {"big": 2, "new": 2}, 400),
    ({}, {}, {"new": 1}, 0),
    ({}, {"gone": 3}, {}, 0),
])
def test_served_at_arrival(served, running, created, start):
    assert policy.served_at_arrival(served, running, created, "new" if "new" not in served else "big") == start


@pytest.mark.parametrize(("queued", "running", "served", "index"), [
    # The late batch is owed starts: it takes the runners while it has been served less since it came,
    # even once it runs more calls than the large one.
    (queue_of(("big", "x", None), ("new", "x", None)), {"big": 6, "new": 10}, {"big": 400, "new": 394}, 1),
    (queue_of(("big", "x", None), ("new", "x", None)), {"big": 0, "new": 16}, {"big": 400, "new": 400}, 0),
    # Served alike: the fewest running, then the first queued.
    (queue_of(("big", "x", None), ("new", "x", None)), {"big": 9, "new": 7}, {"big": 400, "new": 400}, 1),
    (queue_of(("big", "x", None), ("new", "x", None)), {"big": 8, "new": 8}, {"big": 400, "new": 400}, 0),
    # Priority within an account still comes first, and a retry before all.
    (queue_of(("big", "x", "normal"), ("hi", "x", "high")), {}, {"big": 0, "hi": 50}, 1),
    (queue_of(("big", "x", "normal"), ("new", "y", None), (None, "x", None)), {}, {"big": 0, "new": 9}, 2),
    # Another account's late batch is owed its starts too (accounts share the claims by their turns).
    (queue_of(("big", "x", None), ("new", "y", None)), {"big": 16}, {"big": 400, "new": 384}, 1),
])
def test_next_to_run_by_service_since_arrival(queued, running, served, index):
    assert policy.next_to_run(queued, running, served) == index


def test_a_late_batch_is_owed_the_starts_of_the_calls_running_when_it_came():
    """A pump with 16 runners busy on a large batch (claimed work queued for both): a batch arriving then takes
    the next 16 starts (what runs when it came), then the starts alternate, so its share since it arrived
    is even, rather than half of the starts from its first one on (which left it a round behind)."""
    running = {"big": 16}
    served = {"big": 100}
    served["new"] = policy.served_at_arrival(served, running, {"big": 1, "new": 2}, "new")
    starts = []
    for call in range(40):  # each answer frees a runner, which starts the next chosen
        ended = "big" if call < 16 else starts[call - 16]  # calls end in the order they started
        running[ended] -= 1
        chosen = queue_of(("big", "x", None), ("new", "x", None))[
            policy.next_to_run(queue_of(("big", "x", None), ("new", "x", None)), running, served)].batch
        running[chosen] = running.get(chosen, 0) + 1
        served[chosen] += 1
        starts.append(chosen)
    assert starts[:16] == ["new"] * 16
    assert abs(starts[16:].count("new") - starts[16:].count("big")) <= 1


@given(rows=st.lists(st.tuples(st.sampled_from(["a", "b", "c", "d", None]), st.sampled_from(["x", "y"]),
                               st.sampled_from(["high", "normal", "low"])), min_size=1, max_size=12),
       running=st.dictionaries(st.sampled_from(["a", "b", "c", "d"]), st.integers(0, 16)),
       served=st.none() | st.dictionaries(st.sampled_from(["a", "b", "c", "d"]), st.integers(0, 64)))
def test_the_next_to_run_is_an_accounts_highest_priority_batch_served_least(rows, running, served):
    # A batch has one account and one priority.
    first = {}
    rows = [(b, *first.setdefault(b, (account, priority))) if b is not None else (b, account, priority)
            for b, account, priority in rows]
    queued = queue_of(*rows)
    chosen = queued[policy.next_to_run(queued, running, served)]
    if any(item.batch is None for item in queued):
        assert chosen.batch is None
        return
    assert all(item.rank <= chosen.rank for item in queued if item.account == chosen.account)
    eligible = [item for item in queued
                if item.rank == max(other.rank for other in queued if other.account == item.account)]

    def key(batch: str) -> tuple[int, int]:
        return (served or {}).get(batch, 0), running.get(batch, 0)

    assert key(chosen.batch) == min(key(item.batch) for item in eligible)


@pytest.mark.parametrize(("want", "at", "queued", "idle", "claim"), [
    (4, 2, 5, False, True), (1, 2, 0, False, True), (1, 2, 0, True, False), (0, 1, 0, False, False),
    (1, 2, 3, False, False)])
def test_should_claim(want, at, queued, idle, claim):
    assert policy.should_claim(want, at, queued, idle) is claim


@pytest.mark.parametrize(("want", "floor", "most", "size"), [(3, 8, 10, 8), (12, 8, 10, 10), (3, 8, 2, 2)])
def test_claim_size(want, floor, most, size):
    assert policy.claim_size(want, floor, most) == size


@given(want=st.integers(-10, 100), floor=st.integers(1, 64), most=st.integers(-10, 100))
def test_a_claim_never_asks_past_what_can_start_in_time(want, floor, most):
    size = policy.claim_size(want, floor, most)
    assert size <= most
    assert size >= min(want, most)


@pytest.mark.parametrize(("in_flight", "cap", "mine", "over_share", "back"), [
    (10, 2, 8, 0.8, 7), (10, 2, 2, 0.2, 2), (10, 10, 5, 0.5, 0), (10, 8, 6, 0.6, 2),
    (10, 2, 3, 0.8, 2),  # it keeps its part of the cap as things stood when the model went over (1 of 2)
    (10, 2, 0, 0.0, 0)])
def test_give_back(in_flight, cap, mine, over_share, back):
    assert policy.give_back(in_flight, cap, mine, over_share) == back


@given(data=st.data(), leases=st.lists(st.integers(1, 32), min_size=1, max_size=6), cap=st.integers(0, 100))
def test_leases_give_back_the_excess_between_them_and_keep_their_part_of_the_cap(data, leases, cap):
    in_flight = sum(leases)
    backs = [policy.give_back(in_flight, cap, mine, mine / in_flight) for mine in leases]
    assert all(0 <= back <= mine for back, mine in zip(backs, leases, strict=True))
    if in_flight <= cap:
        assert backs == [0] * len(leases)
        return
    kept = in_flight - sum(backs)
    assert kept <= cap  # the model is back within its cap once these slots are back
    assert kept > cap - len(leases)  # and each lease gave back less than one slot more than its share
    # A lease that finds the model over its cap again later never gives back below its part of the first cap.
    mine = data.draw(st.integers(0, leases[0]))
    back = policy.give_back(in_flight, cap, mine, leases[0] / in_flight)
    assert mine - back >= min(mine, math.floor(cap * (leases[0] / in_flight)))


@given(wanted=st.integers(0, 100), cap=st.integers(0, 100), in_flight=st.integers(0, 100))
def test_slots_taken_never_pass_the_cap(wanted, cap, in_flight):
    take = max(0, policy.slots_to_take(wanted, cap, in_flight))
    assert take <= wanted
    assert in_flight + take <= max(cap, in_flight)


def test_moving_average_moves_a_fifth_of_the_way():
    assert policy.moving_average(1.0, 2.0, 0.2) == pytest.approx(1.2)


# --- The config ------------------------------------------------------------------------------------------

def test_the_config_is_frozen_and_takes_what_comes_from_the_settings():
    config = SchedulerConfig.from_settings(Settings(interactive_yield_per_request=3, backend_timeout_seconds=7.0,
                                                    dispatcher_idle_sleep_seconds=0.5))
    assert (config.interactive_yield_per_request, config.backend_timeout_seconds, config.idle_sleep_seconds) == (
        3, 7.0, 0.5)
    assert config.lane_quantum == SchedulerConfig().lane_quantum == 8
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.lane_quantum = 4  # type: ignore[misc]


def test_the_config_follows_the_settings_object_it_is_read_from():
    first, second = Settings(interactive_yield_per_request=2), Settings(interactive_yield_per_request=5)
    assert scheduler_config(first) is scheduler_config(first)
    assert scheduler_config(second).interactive_yield_per_request == 5
    assert scheduler_config(first).interactive_yield_per_request == 2


# --- Service since arrival counted from a batch's creation, and the turns of a pump's claim -----------------

@pytest.mark.parametrize(("served", "running", "ended", "left_with", "start"), [
    # Created as a wave of 16 of the large batch's calls began, its work arrives once they have ended and 4
    # more (claimed ahead) run: all 20 ran after it came, so it is owed 20 starts, not only the 4 running.
    ({"big": 20}, {"big": 4}, {"big": 16}, None, 0),
    ({"big": 20}, {"big": 4}, None, None, 16),  # counted at the work's arrival alone: owed 4
    # A batch coming back starts no lower than it left: leaving makes it owed nothing...
    ({"big": 40}, {"big": 16}, {}, 30, 30),
    # ...and at no more than the others' level: the starts they are owed stay theirs.
    ({"new": 16}, {"new": 16}, {}, 20, 20),
    ({"new": 30}, {"new": 8}, {}, 20, 30),
    ({}, {}, {}, 12, 12),
])
def test_served_at_arrival_counts_the_calls_ended_since_creation(served, running, ended, left_with, start):
    arriving = "new" if "new" not in served else "big"
    assert policy.served_at_arrival(served, running, {"big": 1, "new": 2}, arriving, ended, left_with) == start


def test_calls_ended_since_creation_are_not_owed_to_a_batch_created_earlier():
    # The older batch's work reaches the pump after the newer one's: it is owed nothing, ends or not.
    assert policy.served_at_arrival({"new": 8}, {"new": 4}, {"old": 1, "new": 2}, "old", {"new": 4}) == 8


@pytest.mark.parametrize(("created", "now", "first_here", "memory", "moment"), [
    (100.0, 102.5, True, 4.5, 100.0),  # its first work here, a claim after a wave: from its creation
    (90.0, 102.5, True, 4.5, 98.0),  # created long before: no further back than the pump remembers
    (100.0, 102.5, False, 4.5, 102.5),  # coming back: from now
])
def test_arrival_moment(created, now, first_here, memory, moment):
    assert policy.arrival_moment(created, now, first_here, memory) == moment


def test_ended_since():
    ends = [(1.0, "a"), (2.0, "b"), (3.0, "a"), (3.5, "a")]
    assert policy.ended_since(ends, 2.0) == {"a": 2}
    assert policy.ended_since(ends, 0.0) == {"a": 3, "b": 1}
    assert policy.ended_since([], 0.0) == {}


def test_a_batch_created_as_a_wave_began_is_owed_that_wave_when_its_work_arrives_after_it():
    """A pump's 16 runners start a large batch's calls; a batch is created a moment later, and its work
    arrives a wave on, once those calls ended and 4 claimed ahead run: it takes the next 20 starts (all the
    large one's service since it came), then the starts alternate."""
    running, served = {"big": 4}, {"big": 20}
    served["new"] = policy.served_at_arrival(served, running, {"big": 1, "new": 2}, "new", {"big": 16})
    starts = []
    for _ in range(28):
        queue = queue_of(("big", "x", None), ("new", "x", None))
        chosen = queue[policy.next_to_run(queue, running, served)].batch
        served[chosen] += 1
        starts.append(chosen)
    assert starts[:20] == ["new"] * 20
    assert starts[20:].count("new") == starts[20:].count("big")


def test_standing_in_pump():
    assert policy.standing_in_pump({"big": 20, "new": 16}, {"big": 8, "new": 0, None: 2}) == {"big": 28, "new": 16}
    assert policy.standing_in_pump({}, {"big": 3}) == {}


def standing(*rows: tuple) -> list[LaneWant]:
    """Lanes from (key, held, standing)."""
    return [LaneWant(key=key, account="x", held=held, room=30, standing=at) for key, held, at in rows]


@pytest.mark.parametrize(("lanes", "order"), [
    # A batch owed starts in the pump goes first though it holds more slots (its work runs there next).
    (standing(("big", 8, 28), ("new", 16, 16)), [1, 0]),
    (standing(("new", 16, 16), ("big", 8, 28)), [0, 1]),
    # Standing alike: the fewest held, then the ring's order.
    (standing(("big", 8, 20), ("new", 16, 20)), [0, 1]),
    (standing(("big", 8, 20), ("new", 8, 20)), [0, 1]),
    # Outside a pump (no standing): the slots held alone, as before.
    (standing(("big", 8, None), ("new", 16, None)), [0, 1]),
])
def test_in_deficit_order_in_a_pumps_claim(lanes, order):
    assert policy.in_deficit_order(lanes) == order


def test_the_water_fill_in_a_pumps_claim_goes_by_standing():
    lanes = standing(("big", 8, 28), ("new", 16, 16))
    shares, last = policy.water_fill(lanes, 16, {"x": 16})
    assert shares == {"new": 14, "big": 2}  # new up to big's 28, then alternately (big first: it holds fewer)
    assert last == "new"
    # Without standing the slots held decide: big holds fewer.
    lanes = standing(("big", 8, None), ("new", 16, None))
    assert policy.water_fill(lanes, 8, {"x": 16})[0] == {"big": 8}


def test_a_batch_retried_in_place_comes_to_the_pumps_turns_when_retried():
    owner_sk = owner_sort(1_764_700_000_123_456, "batch_0123")
    assert created_us({"owner_sk": owner_sk}) == 1_764_700_000_123_456
    assert created_us({"owner_sk": owner_sk, "retried_at": 1_764_700_900}) == 1_764_700_900_000_000
    assert created_us({"created_at": 1_764_700_000}) == 1_764_700_000_000_000


# --- Background walks -------------------------------------------------------------------------------------


@given(st.lists(st.text(min_size=1, max_size=3), unique=True, max_size=12), st.data(), st.integers(0, 10_000))
def test_a_walk_takes_every_item_once_with_those_that_failed_last_at_the_end(items, data, turn):
    failed = set(data.draw(st.lists(st.sampled_from(items), unique=True)) if items else [])
    order = policy.walk_order(items, str, failed | {"gone"}, turn)
    assert sorted(order) == sorted(items)
    assert order[len(order) - len(failed):] == [i for i in order if i in failed]  # every failed one after the rest


def test_a_walk_starts_one_item_further_on_each_turn():
    items = ["a", "b", "c", "d"]
    assert [policy.walk_order(items, str, set(), turn)[0] for turn in range(6)] == ["a", "b", "c", "d", "a", "b"]
    # A broken item is never first while others wait, whatever the turn.
    assert {policy.walk_order(items, str, {"a"}, turn)[0] for turn in range(8)} == {"b", "c", "d"}
    assert policy.walk_order([], str, {"a"}, 3) == []
