"""Interactive load: batch work shrinks to the model's floor while interactive calls run."""

from __future__ import annotations

import asyncio
import threading

from batchinfer.catalog import Catalog
from batchinfer.scheduling import pump as slot_pump
from batchinfer.scheduling.config import scheduler_config
from batchinfer.scheduling.dispatcher import Dispatcher
from batchinfer.service.accounts import authenticate
from tests.faults.harness import (
    GLM,
    budget_in_flight,
    pump,
    requests_by_custom_id,
    run_queued,
    set_budgets,
    sim_config,
    sim_stats,
    slot_leases,
    submit,
)
from tests.faults.pump_doubles import FakeClock, Gate, drive, gated_pump
from tests.helpers import chat_request, new_key
from tests.invariants import assert_ledger_consistent

# --- Budgets shrinking to the floor ----------------------------------------------------------------------------


def floor_of_two(svc, sim_control, latency: float, n: int, word: str, tier: str = "pro") -> tuple:
    """GLM at a budget of 8 and a floor of 2, the backend at `latency`, and a batch of n requests on it from
    an account of `tier`."""
    set_budgets(svc, {GLM: 8})
    svc.catalog = Catalog(models=[m.model_copy(update={"batch_floor": 2}) if m.id == GLM else m
                                  for m in svc.catalog.models])
    sim_config(sim_control, latency_seconds=latency)
    _, key = new_key(svc, tier=tier)
    who = authenticate(svc, key)
    requests = [chat_request(f"{word[0]}-{i}", f"{word} {i}") for i in range(n)]
    return who, requests, submit(svc, who, requests)


def test_pump_gives_slots_back_when_the_budget_shrinks(svc, sim_control):
    from batchinfer.scheduling.capacity import track_interactive

    who, requests, batch_id = floor_of_two(svc, sim_control, latency=0.0, n=60, word="shrink")

    async def scenario() -> int:
        clock, gate = FakeClock(), Gate()  # every call held until the test releases it
        pump_ = gated_pump(svc, gate, clock)
        running = asyncio.create_task(pump_.run(8))
        poll = scheduler_config(svc.settings).poll_seconds
        await gate.until(lambda: len(gate.waiting) == 8)
        track_interactive(svc, GLM, 6)  # the budget shrinks to its floor of 2
        await drive(running, clock, gate, poll, until=lambda: pump_.held.release > 0)
        # Running calls may finish; then no new ones beyond the floor.
        gate.held = lambda body: False
        gate.release()
        await gate.until(lambda: len(gate.answered) >= 8)
        gate.peak = gate.in_flight
        await drive(running, clock, gate, poll, until=lambda: len(gate.answered) >= 30)
        peak = gate.peak
        track_interactive(svc, GLM, -6)
        await drive(running, clock, gate, poll)
        return peak

    peak = asyncio.run(scenario())

    assert peak <= 2, peak  # the pump kept to the shrunk budget
    assert budget_in_flight(svc) == 0 and slot_leases(svc) == []
    final = pump(svc, batch_id)
    assert final["status"] == "completed" and final["completed"] == 60
    assert_ledger_consistent(svc, batch_id, who, [r["custom_id"] for r in requests])


def test_pumps_start_no_new_call_over_the_floor_while_calls_above_it_finish(svc, sim_control):
    """Interactive load came: running calls may finish, new ones must not start. Two workers' pumps: one
    whose long calls are all above the floor (it gives all its slots back as they end), one whose short calls
    go on at the floor: those wait until the long calls have ended rather than start beside them."""
    from batchinfer.scheduling.capacity import track_interactive

    # An account whose tier allows more in flight than the budget: only the budget holds the pumps back.
    who, requests, batch_id = floor_of_two(svc, sim_control, latency=0.0, n=60, word="floor", tier="internal")
    poll = scheduler_config(svc.settings).poll_seconds
    # Both workers' pumps on one clock: long generations of 3 s at one, short calls of 0.5 s at the other.
    clock, long, short = FakeClock(), Gate(latency=3.0), Gate(latency=0.5)
    marks: dict[str, float] = {}

    async def two_workers() -> None:
        pumps = [asyncio.create_task(gated_pump(svc, gate, clock, seconds=7.0).run(slots))
                 for gate, slots in ((long, 2), (short, 6))]

        async def until(moment: float) -> None:
            await drive(pumps, clock, [long, short], poll, until=lambda: clock.monotonic() >= moment)

        await until(clock.start + 1.25)  # the long calls started at once: 1.75 s of them left
        track_interactive(svc, GLM, 6)  # the budget shrinks to its floor of 2
        marks["arrived"] = clock.monotonic()
        await until(marks["arrived"] + 5.0)
        track_interactive(svc, GLM, -6)
        await drive(pumps, clock, [long, short], poll)  # to the pumps' deadline

    asyncio.run(two_workers())

    arrived, calls = marks["arrived"], long.spans + short.spans

    def running_at(moment: float) -> int:  # calls started by then and not answered yet, on the pumps' clock
        return sum(1 for a, b in calls if a <= moment < b)

    # The load came while calls above the floor ran, the long pump's 2 among them, ending well after it.
    running_long = [(a, b) for a, b in long.spans if a <= arrived < b]
    assert running_at(arrived) > 2 and len(running_long) == 2, (running_at(arrived), long.spans)
    long_ended = max(b for _, b in running_long)
    assert long_ended >= arrived + 1.5, long_ended - arrived
    # After a poll's time (and the poll's own read), no batch call starts while the floor's worth or more of
    # other batch calls still run: at each start, at most the floor's 2 run, counting it.
    after = [a for a, _ in calls if arrived + 2 * poll < a < arrived + 5.0]
    over = [(round(a - arrived, 2), running_at(a)) for a in after]
    assert after and all(running <= 2 for _, running in over), over
    # Once the long calls have ended, batch work goes on at the floor: a poll sees the model back within its
    # cap and the short pump's kept slot starts, the next grows into the other; from two polls past their end
    # until the load goes, both of the floor's slots stay busy. Each starts a 0.5 s call as its last answers:
    # 2 * (window // 0.5) starts at least (10 over the 2.75 s here), where one slot kept busy makes half that.
    busy_from = long_ended + 2 * poll
    window = arrived + 5.0 - busy_from
    assert window >= 2.5, window
    idle = [round(t - arrived, 2) for t in (busy_from + k * 0.05 for k in range(int(window / 0.05)))
            if running_at(t) != 2]
    assert not idle, idle
    starts = [round(a - arrived, 2) for a, _ in short.spans if busy_from <= a < arrived + 5.0]
    assert len(starts) >= 2 * int(window / 0.5), (window, starts)
    assert budget_in_flight(svc) == 0 and slot_leases(svc) == []
    final = pump(svc, batch_id)
    assert final["status"] == "completed" and final["completed"] == 60
    assert_ledger_consistent(svc, batch_id, who, [r["custom_id"] for r in requests])


def test_pump_starts_no_call_on_an_old_cap_while_its_budget_poll_is_stalled(svc, sim_control, monkeypatch):
    """The budget poll stalls (a throttled or stalled store) just as interactive load comes: runners stop
    starting calls once the cap they know is stale_cap_seconds old, rather than go on at the old budget, and
    go on once a poll answers (at the floor); every request still ends once."""
    from batchinfer.scheduling.capacity import track_interactive

    # Enough work that the pump never runs dry before the poll answers; the pump then runs it all out on its clock.
    who, requests, batch_id = floor_of_two(svc, sim_control, latency=0.0, n=100, word="stall")
    config = scheduler_config(svc.settings)
    stall, stalled, released = threading.Event(), threading.Event(), threading.Event()
    real_read = slot_pump.read_budget

    def stalling_read(*args, **kwargs):
        if stall.is_set() and threading.current_thread().name.startswith("pump-poll"):
            gate.work.parked += 1  # the test releases it: the clock does not wait for it meanwhile
            stalled.set()
            try:
                released.wait(30)
            finally:
                gate.work.parked -= 1
        return real_read(*args, **kwargs)

    marks: dict[str, float] = {}

    async def scenario(gate: Gate) -> None:
        clock = FakeClock()
        pump_ = gated_pump(svc, gate, clock)
        running = asyncio.create_task(pump_.run(8))
        step = config.poll_seconds

        async def until(moment: float) -> None:
            await drive(running, clock, gate, step, until=lambda: clock.monotonic() >= moment)

        await until(clock.start + 1.0)
        stall.set()  # the next budget poll stalls; the last one answered before this
        marks["stall"] = clock.monotonic()
        await drive(running, clock, gate, step, until=stalled.is_set)
        track_interactive(svc, GLM, 6)  # the budget shrinks to its floor of 2: no poll sees it yet
        await until(marks["stall"] + 2.8)
        marks["released"] = clock.monotonic()
        released.set()
        await until(marks["released"] + 1.5)
        track_interactive(svc, GLM, -6)
        await drive(running, clock, gate, step)  # until the pump runs out of work

    monkeypatch.setattr(slot_pump, "read_budget", stalling_read)
    gate = Gate(latency=0.3)  # calls of 0.3 s on the pump's clock
    try:
        asyncio.run(scenario(gate))
    finally:
        released.set()
    monkeypatch.undo()

    # From the cap's going stale (stale_cap_seconds after the last poll, and a runner's wait) until the
    # stalled poll answers, no call starts; once it answers, calls go on.
    assert config.stale_cap_seconds <= 1.0
    quiet_from = marks["stall"] + config.stale_cap_seconds + config.poll_seconds + 0.1
    starts = gate.started_at
    assert [a for a in starts if a < marks["stall"]], "calls ran before the stall"
    assert not [round(a - marks["stall"], 2) for a in starts if quiet_from < a < marks["released"]]
    assert [a for a in starts if a > marks["released"]], "the pump went on once the poll answered"
    assert budget_in_flight(svc) == 0 and slot_leases(svc) == []
    final = pump(svc, batch_id)
    assert final["status"] == "completed" and final["completed"] == 100
    assert_ledger_consistent(svc, batch_id, who, [r["custom_id"] for r in requests])


def test_retry_delivered_after_the_budget_shrank_does_not_start_over_it(svc, sim_control):
    """A retry dispatched within the cap and delivered once interactive load has come waits again (its slot
    given back) instead of starting over the floor; it runs once the load goes, exactly once."""
    from batchinfer.scheduling.capacity import track_interactive

    _, key = new_key(svc)
    who = authenticate(svc, key)
    requests = [chat_request("again", "retry me [[sim:flaky:1:500]]")]
    batch_id = submit(svc, who, requests)
    Dispatcher(svc).pass_once()
    run_queued(svc)  # the first attempt: a 500, so it waits for its retry
    assert requests_by_custom_id(svc, batch_id)["again"]["state"] == "waiting"
    svc.clock.advance(3600)
    assert Dispatcher(svc).pass_once() == 1  # the retry is dispatched, holding one slot
    track_interactive(svc, GLM, 16)  # the model's batch work shrinks to its floor... and below what is held
    set_budgets(svc, {GLM: 0})  # (and a budget of 0: over the cap with the one slot the retry holds)
    run_queued(svc)

    assert requests_by_custom_id(svc, batch_id)["again"]["state"] == "waiting"
    assert sim_stats(sim_control, settle=True)["total_requests"] == 1  # not sent again
    assert budget_in_flight(svc) == 0

    track_interactive(svc, GLM, -16)
    set_budgets(svc, {GLM: 16})
    final = pump(svc, batch_id)
    assert final["status"] == "completed" and final["completed"] == 1
    assert sim_stats(sim_control, settle=True)["total_requests"] == 2
    assert_ledger_consistent(svc, batch_id, who, ["again"])


# --- A dip between interactive calls ---------------------------------------------------------------------------


def test_a_new_dispatcher_claims_nothing_in_a_dip_of_interactive_load_until_it_has_watched_it(svc, sim_control):
    """Between one interactive client's call and its next the count dips for a moment (to 0 when calls end
    together). A dispatcher new to the model (each scheduled invocation is) remembers none of the load: while
    the count moved within the last second it claims nothing until it has watched it that long; a count that
    has stood still that long is taken as it is, at once."""
    from batchinfer.scheduling.capacity import track_interactive

    who, requests, batch_id = floor_of_two(svc, sim_control, latency=0.3, n=20, word="dip")
    model = svc.catalog.get(GLM)
    window = scheduler_config(svc.settings).interactive_window_seconds
    clock = FakeClock()  # the new dispatcher's: it watches the load for the window on it

    def window_passes() -> None:
        clock.advance(window + 0.05)
        svc.clock.advance(window + 0.05)  # and the load's count, stamped on the service's clock, is that old

    track_interactive(svc, GLM, 6)  # six interactive calls: the budget of 8 shrinks to its floor of 2
    track_interactive(svc, GLM, -6)  # they end together; their clients' next calls are a moment away
    new = Dispatcher(svc, clock=clock)
    assert new.dispatch_model(model) == 0  # the count reads 0, but it moved a moment ago
    track_interactive(svc, GLM, 6)  # the next calls
    window_passes()
    assert new.dispatch_model(model) == 2  # it has watched for the window: the floor
    track_interactive(svc, GLM, -6)
    window_passes()  # the load has gone and stayed gone
    assert Dispatcher(svc).dispatch_model(model) == 6  # a new one takes the rest of the budget at once

    assert budget_in_flight(svc) == 8
    final = pump(svc, batch_id)
    assert final["status"] == "completed" and final["completed"] == 20
    assert budget_in_flight(svc) == 0
    assert_ledger_consistent(svc, batch_id, who, [r["custom_id"] for r in requests])


def test_new_pump_does_not_take_a_dip_between_interactive_calls_for_room(svc, sim_control):
    """Interactive clients send back to back: their count dips to 0 for a moment when calls end together. A
    pump that starts then watches the count over the memory's window before taking slots."""
    from batchinfer.scheduling.capacity import track_interactive

    who, requests, batch_id = floor_of_two(svc, sim_control, latency=0.0, n=24, word="dip")
    track_interactive(svc, GLM, 6)
    track_interactive(svc, GLM, -6)  # the calls end together...

    async def scenario() -> int:
        clock, gate = FakeClock(), Gate(held=lambda body: True, latency=0.3)  # calls of 0.3 s on the pump's clock
        pump_ = gated_pump(svc, gate, clock, seconds=2.5)
        running = asyncio.create_task(pump_.run(8))
        await gate.quiet()
        clock.advance(0.1)
        track_interactive(svc, GLM, 6)  # ...and the clients' next ones are counted a moment later
        await drive(running, clock, gate, scheduler_config(svc.settings).poll_seconds)
        return gate.peak

    peak = asyncio.run(scenario())
    track_interactive(svc, GLM, -6)

    assert peak <= 2, peak  # the floor, not the dip's 8
    assert budget_in_flight(svc) == 0 and slot_leases(svc) == []
    final = pump(svc, batch_id)
    assert final["status"] == "completed" and final["completed"] == 24
    assert_ledger_consistent(svc, batch_id, who, [r["custom_id"] for r in requests])
