"""The scheduler's arithmetic (batchinfer.scheduling.policy) on its own, for the slot pump: how much work it
claims ahead and when, which batch runs next (service since arrival), the slots leases give back in proportion,
the scheduler's config and the background walks. No store, no clock: each function against a table of cases, and
its invariants against generated ones: never above the cap or what can start in time."""

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
