"""The scheduler's arithmetic (batchinfer.scheduling.policy) on its own, for how a model's slots are shared: the
model's cap, the lanes' shares of what is free and an account's priorities. No store, no clock: each function
against a table of cases, and its invariants against generated ones: never above the cap, the budget or what is
free; every lane with work served when there is room."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from batchinfer.scheduling import policy
from batchinfer.scheduling.policy import LaneWant

settings.register_profile("scheduling", deadline=None, max_examples=200)
settings.load_profile("scheduling")

small = st.integers(min_value=0, max_value=64)


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
