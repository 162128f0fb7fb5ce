"""The slot pump: a worker holding slots and claiming ahead (scheduling.pump.SlotPump)."""

from __future__ import annotations

import asyncio
import time
from collections import Counter

import pytest

from batchinfer.layout import owner_sort
from batchinfer.records import group_shards, lease_shards
from batchinfer.scheduling import held_slots, lanes, policy
from batchinfer.scheduling import pump as slot_pump
from batchinfer.scheduling.capacity import Draws, read_budget
from batchinfer.scheduling.claimed_work import GroupRun, Member
from batchinfer.scheduling.config import scheduler_config
from batchinfer.scheduling.dispatcher import Dispatcher
from batchinfer.service import accounts
from batchinfer.service.accounts import authenticate
from batchinfer.service.background.sweep import sweep_once
from batchinfer.service.running import run_request
from tests.faults.harness import (
    GLM,
    budget_in_flight,
    configure,
    pump,
    set_budgets,
    sim_stats,
    slot_leases,
    submit,
)
from tests.faults.pump_doubles import FakeClock, Gate, drive, gated_pump, run_gated
from tests.helpers import chat_request, new_key
from tests.invariants import assert_ledger_consistent, budget_of

# --- Claims and slots ------------------------------------------------------------------------------------------


def test_pump_runs_a_batch_within_its_slots_and_gives_them_back(svc, sim_control):
    set_budgets(svc, {GLM: 4})
    _, key = new_key(svc)
    who = authenticate(svc, key)
    requests = [chat_request(f"p-{i}", f"pumped {i}" + (" [[sim:flaky:1:500]]" if i == 5 else "")) for i in range(30)]
    batch_id = submit(svc, who, requests)

    outcome, gate, _ = run_gated(svc, slots=10, gate=Gate(latency=0.5))  # each call takes 0.5 s of the pump's clock

    assert outcome["completed"] >= 29, outcome
    assert gate.peak == 4, gate.peak  # the budget's 4 busy, not the 10 asked for
    assert sim_stats(sim_control, settle=True)["max_in_flight"] <= 4
    assert budget_in_flight(svc) == 0 and slot_leases(svc) == []
    final = pump(svc, batch_id)
    assert final["status"] == "completed" and final["completed"] == 30
    assert_ledger_consistent(svc, batch_id, who, [r["custom_id"] for r in requests])


def test_a_pumps_claim_reads_the_account_once_and_its_start_reads_the_key_again(svc, sim_control, monkeypatch):
    """The checks before a group the pump has just claimed starts go by the account and its usage as the claim
    read them (strongly consistent, a moment before): only the key is read again."""
    set_budgets(svc, {GLM: 4})
    _, key = new_key(svc)
    who = authenticate(svc, key)
    requests = [chat_request(f"a-{i}", f"read once {i}") for i in range(24)]
    batch_id = submit(svc, who, requests)
    reads: Counter = Counter()
    for module, name in ((lanes.Account, "with_usage"), (run_request, "key_account_and_usage"),
                         (run_request.ApiKey, "get")):
        real = getattr(module, name)

        def counted(*args, _real=real, _name=name, **kwargs):
            reads[_name] += 1
            return _real(*args, **kwargs)

        monkeypatch.setattr(module, name, counted)

    outcome, _, _ = run_gated(svc, slots=4, gate=Gate(latency=0.5))

    assert outcome["completed"] == 24, outcome
    assert reads["key_account_and_usage"] == 0, reads  # the account is not read again at the start
    assert 0 < reads["get"] <= reads["with_usage"], reads  # the key is, once per claim's group check
    final = pump(svc, batch_id)
    assert final["status"] == "completed" and final["completed"] == 24
    assert_ledger_consistent(svc, batch_id, who, [r["custom_id"] for r in requests])


def test_a_key_revoked_after_the_claim_read_the_account_still_stops_the_batch(svc, sim_control, monkeypatch):
    set_budgets(svc, {GLM: 4})
    _, key = new_key(svc)
    who = authenticate(svc, key)
    requests = [chat_request(f"k-{i}", f"revoked {i}") for i in range(8)]
    batch_id = submit(svc, who, requests)
    real = lanes.Account.with_usage

    def read_then_revoke(*args, **kwargs):
        read = real(*args, **kwargs)
        accounts.revoke_key(svc, key)  # after the claim's read, before the group starts
        return read

    monkeypatch.setattr(lanes.Account, "with_usage", read_then_revoke)

    run_gated(svc, slots=4, gate=Gate(latency=0.5))

    final = pump(svc, batch_id)
    assert final["status"] == "failed" and final["error"]["code"] == "owner_unauthorized"
    assert sim_stats(sim_control, settle=True)["total_requests"] == 0  # nothing ran on the revoked key
    assert_ledger_consistent(svc, batch_id, who, [r["custom_id"] for r in requests])


def test_a_pump_with_few_slots_claims_whole_quanta_and_leaves_no_lane_a_stub(svc, sim_control, monkeypatch):
    """A pump of 2 slots over three batches of 20: each claim gives a lane a whole quantum (8) however few the
    pump wants, and a lane with at most half a quantum more gives all it has (12), so each batch runs in two
    groups, 8 and 12, rather than groups of what the pump wanted and stubs (each pays a claim and a close);
    the budget is never passed and every request ends once."""
    set_budgets(svc, {GLM: 2})
    who = authenticate(svc, new_key(svc, tier="internal")[1])
    requests = {b: [chat_request(f"s{b}-{i}", f"stub {b} {i}") for i in range(20)] for b in range(3)}
    batch_ids = {submit(svc, who, rs): b for b, rs in requests.items()}
    sizes = []
    real_claim = lanes.claim_from_lane

    def claim_from_lane(svc, batch, model_id, positions, *args, **kwargs):
        sizes.append((batch["id"], len(positions)))
        return real_claim(svc, batch, model_id, positions, *args, **kwargs)

    monkeypatch.setattr(lanes, "claim_from_lane", claim_from_lane)
    # Calls of 1 s on the pump's clock, and claims that take none of it, so that it wants few (a claim of a
    # quantum or more per lane read is shared a slot at a time, `policy.water_fill`, not in quanta); and a
    # deadline no claim comes near (a claim cut to what can start in time is the next test's). The pump ends
    # once the work has run out, long before it.
    outcome, gate, _ = run_gated(svc, slots=2, gate=Gate(latency=1.0))

    assert outcome["completed"] == 60, outcome
    assert sorted(n for _, n in sizes) == [8, 8, 8, 12, 12, 12], sizes
    assert {batch_id for batch_id, n in sizes if n == 12} == set(batch_ids)
    assert gate.peak == 2 and sim_stats(sim_control, settle=True)["max_in_flight"] <= 2
    assert budget_in_flight(svc) == 0 and slot_leases(svc) == []
    for batch_id, b in batch_ids.items():
        final = pump(svc, batch_id)
        assert final["status"] == "completed" and final["completed"] == 20
        assert_ledger_consistent(svc, batch_id, who, [r["custom_id"] for r in requests[b]])


def test_a_pump_whose_claims_come_back_empty_claims_again_only_when_a_slot_frees_or_at_its_poll(
        svc, sim_control, monkeypatch):
    """An account at its tier's limit while the pump has free slots: its claims find nothing it may start. The
    pump then claims again when one of its calls ends (room for one more) or at its next poll, not at once
    over and over (each claim reads the table)."""
    set_budgets(svc, {GLM: 8})
    configure(svc, tier_limits={**svc.settings.tier_limits, "free": 2})
    _, key = new_key(svc, tier="free")
    who = authenticate(svc, key)
    requests = [chat_request(f"e-{i}", f"empty claims {i}") for i in range(12)]
    batch_id = submit(svc, who, requests)
    real_claim, claims = slot_pump.SlotPump._claim, []

    async def counted(self, want, budget_item, most):
        got = await real_claim(self, want, budget_item, most)
        claims.append(got)
        return got

    monkeypatch.setattr(slot_pump.SlotPump, "_claim", counted)
    outcome, gate, clock = run_gated(svc, slots=8, gate=Gate(latency=1.0))  # each call 1 s of the pump's clock

    assert outcome["completed"] == 12 and gate.peak == 2, (outcome, gate.peak)  # the account's limit, not 8
    polls = (clock.monotonic() - clock.start) / scheduler_config(svc.settings).poll_seconds
    # At most one claim per poll and one per call that ended, and a few more for the claims that did find work.
    assert len(claims) <= polls + len(requests) + 6, (len(claims), polls, Counter(claims))
    final = pump(svc, batch_id)
    assert final["status"] == "completed" and final["completed"] == 12
    assert_ledger_consistent(svc, batch_id, who, [r["custom_id"] for r in requests])


def test_a_pump_near_its_deadline_claims_only_what_its_slots_can_start_before_it(svc, sim_control):
    """A pump of 2 slots with 1.5 s left and calls of 0.5 s: it claims what its slots can start by then,
    not a whole quantum, so nothing it claimed is handed back at the deadline (each handed-back request
    would wait as a retry, claimed and written alone); the rest of the batch runs later, once."""
    set_budgets(svc, {GLM: 2})
    who = authenticate(svc, new_key(svc, tier="internal")[1])
    requests = [chat_request(f"t-{i}", f"in time {i}") for i in range(20)]
    batch_id = submit(svc, who, requests)

    outcome, gate, clock = run_gated(svc, slots=2, seconds=1.5, gate=Gate(latency=0.5))

    assert outcome["handed_back"] == 0 and outcome["completed"] >= 1, outcome
    assert max(gate.started_at) < clock.start + 1.5  # nothing started past the deadline
    assert budget_in_flight(svc) == 0 and slot_leases(svc) == []
    final = pump(svc, batch_id)
    assert final["status"] == "completed" and final["completed"] == 20
    assert_ledger_consistent(svc, batch_id, who, [r["custom_id"] for r in requests])


@pytest.mark.parametrize("slots", [1, 3])
def test_a_pump_whose_claims_are_only_retries_runs_them_at_once(svc, sim_control, slots):
    """After a backend outage the work left is retries: a pump that claims only retries runs them on its idle
    slots at once, rather than leaving its runners asleep beside them until its deadline."""
    set_budgets(svc, {GLM: slots})
    configure(svc, retry_base_seconds=30.0)  # the first pump ends before any retry is due
    who = authenticate(svc, new_key(svc, tier="internal")[1])
    requests = [chat_request(f"r-{i}", f"retried {i} [[sim:flaky:1:500]]") for i in range(6)]
    batch_id = submit(svc, who, requests)
    first, _, _ = run_gated(svc, slots=slots, seconds=10)
    assert first["waiting"] == 6, first  # each failed once and waits for its retry
    svc.clock.advance(120)  # every retry is due

    async def scenario() -> tuple[Counter, float]:
        clock, gate = FakeClock(), Gate()  # every call held until the test releases it
        running = asyncio.create_task(gated_pump(svc, gate, clock, seconds=60).run(slots))
        # The pump's clock stands still: each wave of retries starts on the idle slots without waiting for it.
        while len(gate.answered) < 6:
            await gate.until(lambda: len(gate.waiting) == min(slots, 6 - len(gate.answered)))
            gate.release()
            await gate.until(lambda: not gate.passing)
        stood_still = clock.monotonic() - clock.start
        await drive(running, clock, gate, scheduler_config(svc.settings).poll_seconds)
        return running.result(), stood_still

    outcome, took = asyncio.run(scenario())

    assert outcome["completed"] == 6, outcome
    assert took == 0, f"the retries waited {took:.1f} s of the pump's clock"
    assert budget_in_flight(svc) == 0 and slot_leases(svc) == []
    final = pump(svc, batch_id)
    assert final["status"] == "completed" and final["completed"] == 6
    assert_ledger_consistent(svc, batch_id, who, [r["custom_id"] for r in requests])


def test_pump_grows_into_free_slots_rather_than_queue_behind_a_long_call(svc, sim_control):
    """Work-conserving: a pump holding one slot, busy with a long call, takes free slots of the budget for the
    requests it claimed meanwhile instead of holding them until the long call ends; never past the budget."""
    set_budgets(svc, {GLM: 4})
    _, key = new_key(svc)
    who = authenticate(svc, key)
    requests = [chat_request("slow", "slow [[sim:tag:slow]]")] + [chat_request(f"q-{i}", f"quick {i}")
                                                                   for i in range(6)]
    batch_id = submit(svc, who, requests)

    def is_slow(body: dict) -> bool:
        return "slow" in body["messages"][0]["content"]

    async def scenario() -> Counter:
        clock, gate = FakeClock(), Gate(held=is_slow)  # the long call is held until the test lets it go
        pump_ = gated_pump(svc, gate, clock)
        running = asyncio.create_task(pump_.run(1))
        await gate.until(lambda: len(gate.waiting) == 1)  # the long call holds the one slot
        poll = scheduler_config(svc.settings).poll_seconds
        # Polls come: the pump must grow into free slots and run every quick request while the long call runs.
        await drive(running, clock, gate, poll, until=lambda: len(gate.answered) == 6)
        assert not any(is_slow(body) for body in gate.answered) and len(gate.waiting) == 1
        gate.release()
        await drive(running, clock, gate, poll)
        return running.result()

    outcome = asyncio.run(scenario())

    assert outcome["completed"] == 7, outcome
    assert sim_stats(sim_control, settle=True)["max_in_flight"] <= 4
    assert budget_in_flight(svc) == 0 and slot_leases(svc) == []
    final = pump(svc, batch_id)
    assert final["status"] == "completed" and final["completed"] == 7
    assert_ledger_consistent(svc, batch_id, who, [r["custom_id"] for r in requests])


# --- Sharded budgets -------------------------------------------------------------------------------------------


def test_a_pump_on_a_sharded_budget_grows_across_its_shards_and_gives_each_its_slots_back(svc, sim_control,
                                                                                           monkeypatch):
    """A budget of 8 in 4 shards of 2 slots (`BUDGET_SHARD_SLOTS`): a pump asked for 3 takes them from two
    shards (a lease holds slots of several), then grows into the others' until all 8 are busy; no shard ever
    holds more than its 2, none goes below 0, and every slot goes back to the shard it came from."""
    configure(svc, budget_shard_slots=2)
    set_budgets(svc, {GLM: 8})
    _, key = new_key(svc)
    who = authenticate(svc, key)
    requests = [chat_request(f"s-{i}", f"sharded {i}") for i in range(64)]
    batch_id = submit(svc, who, requests)
    leases: list[dict] = []
    for name in ("take_slots", "grow_slots"):
        real = getattr(held_slots, name)

        def watched(*args, real=real, **kwargs):
            lease = real(*args, **kwargs)
            leases.append(lease)
            return lease

        monkeypatch.setattr(held_slots, name, watched)
    peaks: Counter = Counter()

    def sample() -> None:  # the shards, each time the pump is quiet (calls held 0.2 s of its clock)
        for k, shard in enumerate(budget_of(svc, GLM)["shards"]):
            peaks[k] = max(peaks[k], shard["in_flight"])
            peaks["lowest"] = min(peaks["lowest"], shard["in_flight"])

    outcome, gate, _ = run_gated(svc, slots=3, gate=Gate(latency=0.2), each=sample)

    assert sorted(lease_shards(leases[0]).values()) == [1, 2] and leases[0]["slots"] == 3  # two shards to start
    assert lease_shards(leases[-1]) == {0: 2, 1: 2, 2: 2, 3: 2}, leases[-1]  # then the others'
    assert outcome["completed"] == 64, outcome
    assert [peaks[k] for k in range(4)] == [2, 2, 2, 2] and peaks["lowest"] == 0, peaks
    assert gate.peak == 8 and sim_stats(sim_control, settle=True)["max_in_flight"] <= 8
    assert budget_of(svc, GLM)["shards"] == [{"in_flight": 0, "interactive": 0}] * 4
    assert slot_leases(svc) == []
    final = pump(svc, batch_id)
    assert final["status"] == "completed" and final["completed"] == 64
    assert_ledger_consistent(svc, batch_id, who, [r["custom_id"] for r in requests])


def test_slots_of_a_sharded_budget_held_by_dead_processes_go_back_to_their_own_shards(svc, sim_control):
    """Groups a dispatcher claimed (without a lease) from several shards, a worker's lease on one and an
    interactive call counted on another, all of whose processes died: the sweeper gives each back to the
    shard it came from, once, and leaves no shard below zero."""
    from batchinfer.ledger import take_slots
    from batchinfer.records import InteractiveLease
    from batchinfer.scheduling.capacity import Draws

    configure(svc, budget_shard_slots=2, lease_seconds=60)
    set_budgets(svc, {GLM: 8})
    _, key = new_key(svc)
    who = authenticate(svc, key)
    requests = [chat_request(f"x-{i}", f"dies sharded {i}") for i in range(10)]
    batch_id = submit(svc, who, requests)

    configure(svc, tier_limits={**svc.settings.tier_limits, "pro": 6})
    Dispatcher(svc).pass_once()  # one claim of 6 (the account's tier): 2 from each of 3 shards (the groups never run)
    held = [shard["in_flight"] for shard in budget_of(svc, GLM)["shards"]]
    assert sorted(held) == [0, 2, 2, 2], held
    groups = list(svc.table.query_all("pk = :pk AND begins_with(sk, :g)", {":pk": f"BATCH#{batch_id}", ":g": "GRP#"},
                                      consistent=True))
    assert [group_shards(g) for g in groups] == [{k: 2 for k, n in enumerate(held) if n}], groups  # one group
    free = held.index(0)
    now = svc.now()
    take_slots(svc, GLM, [(Draws(budget_of(svc, GLM), 8).of(free), 2)])  # a worker's lease on the last shard
    svc.table.transact(InteractiveLease.begin(svc.table, GLM, "died", "acct_x", now, now + 60, now * 1000,
                                              shard=(free + 1) % 4))
    budget = budget_of(svc, GLM)
    assert budget["in_flight"] == 8 and budget["interactive"] == 1
    assert budget["shards"][(free + 1) % 4]["interactive"] == 1

    svc.clock.advance(61)
    sweep_once(svc)
    sweep_once(svc)  # a second pass finds nothing more to give back

    budget = budget_of(svc, GLM)
    assert budget["shards"] == [{"in_flight": 0, "interactive": 0}] * 4, budget
    assert slot_leases(svc) == []
    final = pump(svc, batch_id)
    assert final["status"] == "completed" and final["completed"] == 10
    assert_ledger_consistent(svc, batch_id, who, [r["custom_id"] for r in requests])


# --- Dying workers and closing windows -------------------------------------------------------------------------


def test_worker_dying_while_pumping_is_recovered_by_the_leases(svc, sim_control, monkeypatch):
    configure(svc, lease_seconds=60)
    set_budgets(svc, {GLM: 4})
    _, key = new_key(svc)
    who = authenticate(svc, key)
    requests = [chat_request(f"d-{i}", f"dies pumping {i}") for i in range(12)]
    batch_id = submit(svc, who, requests)
    calls = []

    async def call_then_die(body: dict) -> None:
        calls.append(1)
        if len(calls) > 3:  # the process dies: nothing it does from here on reaches the table
            raise SystemExit("worker process died")

    for module, name in ((run_request, "close_group"), (held_slots, "give_back_slots"),
                         (run_request, "record_position")):
        real = getattr(module, name)

        def dead(*args, real=real, **kwargs):
            if len(calls) > 3:
                raise SystemExit("worker process died")
            return real(*args, **kwargs)

        monkeypatch.setattr(module, name, dead)
    with pytest.raises(BaseException):  # noqa: B017 - whatever the dying process raised
        run_gated(svc, slots=4, gate=Gate(latency=0.5, before=call_then_die))
    monkeypatch.undo()
    assert budget_in_flight(svc) == 4 and len(slot_leases(svc)) == 1  # slots held by a dead worker

    sweep_once(svc)
    assert budget_in_flight(svc) == 4  # nothing is recovered before its lease runs out
    svc.clock.advance(61)
    sweep_once(svc)
    assert slot_leases(svc) == [] and budget_in_flight(svc) == 0  # the lease's slots went back
    final = pump(svc, batch_id)
    assert final["status"] == "completed" and final["completed"] == 12
    assert_ledger_consistent(svc, batch_id, who, [r["custom_id"] for r in requests])


def test_pump_hand_back_racing_a_recovery_counts_each_request_once(svc, sim_control):
    from batchinfer.service.background.sweep import _recover_group

    configure(svc, lease_seconds=3600)
    set_budgets(svc, {GLM: 2})
    _, key = new_key(svc)
    who = authenticate(svc, key)
    requests = [chat_request(f"h-{i}", f"hand back {i}") for i in range(8)]
    batch_id = submit(svc, who, requests)
    recovered = []

    async def recovery(body: dict) -> None:
        if not recovered:  # the sweeper recovers the first group while its members are queued or running
            groups = list(svc.table.query_all("pk = :pk AND begins_with(sk, :g)",
                                              {":pk": f"BATCH#{batch_id}", ":g": "GRP#"}, consistent=True))
            recovered.append(groups[0]["sk"])
            await asyncio.to_thread(_recover_group, svc, groups[0])

    outcome, _, _ = run_gated(svc, slots=2, seconds=5, gate=Gate(latency=0.1, before=recovery))

    assert outcome["lease_lost"] > 0, outcome  # the pump's writes for that group lost to the recovery
    assert budget_in_flight(svc) == 0 and slot_leases(svc) == []
    final = pump(svc, batch_id)
    assert final["status"] == "completed" and final["completed"] == 8
    assert_ledger_consistent(svc, batch_id, who, [r["custom_id"] for r in requests])


def test_pump_starts_nothing_after_the_window_closes(svc, sim_control):
    configure(svc, batch_completion_window_seconds=600, lease_seconds=3600)
    set_budgets(svc, {GLM: 2})
    _, key = new_key(svc)
    who = authenticate(svc, key)
    requests = [chat_request(f"w-{i}", f"window {i}") for i in range(20)]
    batch_id = submit(svc, who, requests)
    after_close = []

    async def started(body: dict) -> None:
        if svc.clock.offset:
            after_close.append(1)

    async def answered(body: dict) -> None:
        svc.clock.advance(601) if not svc.clock.offset else None  # the window closes after the first answer

    outcome, _, _ = run_gated(svc, slots=2, seconds=5, gate=Gate(latency=0.5, before=started, after=answered))

    assert outcome["handed_back"] > 0, outcome  # claimed ahead, never started: handed back
    assert len(after_close) <= 1  # at most the call that was already running on the other slot
    final = pump(svc, batch_id)
    assert final["status"] == "expired"
    assert_ledger_consistent(svc, batch_id, who, [r["custom_id"] for r in requests])
    assert sim_stats(sim_control, settle=True)["total_requests"] == final["completed"] <= 3


# --- Service since arrival -----------------------------------------------------------------------------------


def test_a_pump_with_part_of_the_budget_leaves_a_shared_lanes_rest_to_a_pump_with_room(svc):
    """Two pumps share a budget of 16 (6 slots and 10) while a large batch and a newcomer of 10 both have
    work: the pump of 6 takes no more of either than its slots run in a wave, rather than a quantum and the
    lane's last few (the newcomer's whole lane, run over two waves there while the pump of 10 ran only the
    large one's); the pump of 10 takes the newcomer's other 4. No request is claimed twice, none is lost,
    and the pumps hold the budget's 16 slots, no more."""
    set_budgets(svc, {GLM: 16})
    glm = svc.catalog.get(GLM)
    who = authenticate(svc, new_key(svc, tier="internal")[1])
    large = submit(svc, who, [chat_request(f"l-{i}", f"large {i}") for i in range(100)])
    small = submit(svc, who, [chat_request(f"s-{i}", f"small {i}") for i in range(10)])

    async def claims() -> list[Counter]:
        taken = []
        for slots in (6, 10):
            pump_ = run_request.slot_pump(svc, glm, time.monotonic() + 60)
            item = read_budget(svc, glm)
            assert await pump_.held.take(Draws(item, 16).split(slots))
            await pump_._claim(slots + 4, read_budget(svc, glm), 100)
            taken.append(Counter({batch: n for batch, n in pump_.queued_of.items() if n}))
            for member in pump_.queue:
                positions.append((member.run.batch["id"], repr(member.position)))
        return taken

    positions: list = []
    first, second = asyncio.run(claims())

    assert 0 < first[small] <= 6 and first[large] <= 6, first
    assert second[small] == 10 - first[small], (first, second)  # the rest of the newcomer's lane
    assert len(positions) == len(set(positions))  # none claimed twice
    assert budget_of(svc, GLM)["in_flight"] == 16


def test_a_batch_created_as_a_wave_began_is_owed_it_though_its_work_arrives_after_it(svc):
    """A pump's 16 runners start a large batch's wave; a batch created a moment later has its work claimed
    into the pump a wave on, once those calls ended and 4 claimed ahead run: it takes the next 20 starts (the
    large one's service since it came), and the pump's next claim goes to it first; once retried in place,
    a batch arrives at its retry."""
    pump_ = slot_pump.SlotPump(svc, svc.catalog.get(GLM), time.monotonic() + 60, None)
    now_us = time.time_ns() // 1000
    big = {"id": "batch_big", "owner_sk": owner_sort(now_us - 1000, "batch_big")}
    new = {"id": "batch_new", "owner_sk": owner_sort(now_us, "batch_new")}
    pump_.views.shared.update({"batch_big": big, "batch_new": new})  # as its claims share them

    def members(batch: dict, n: int) -> list[Member]:
        run = GroupRun(group={}, batch=batch, left=n)
        return [Member(run=run, position=[i], body={}) for i in range(n)]

    pump_._enqueue(members(big, 20))
    wave = [pump_._take_next() for _ in range(16)]
    for member in wave:
        pump_._call_starts(member)
    for member in wave:  # the wave ends before the new batch's work arrives; the 4 queued ahead start
        pump_._call_ended(member)
    for _ in range(4):
        pump_._call_starts(pump_._take_next())
    pump_._enqueue(members(big, 30) + members(new, 30))

    assert pump_.served["batch_new"] == pump_.served["batch_big"] - 20
    assert policy.standing_in_pump(pump_.served, pump_.queued_of)["batch_new"] < \
        policy.standing_in_pump(pump_.served, pump_.queued_of)["batch_big"]
    starts = []
    for _ in range(24):
        member = pump_._take_next()
        pump_._call_starts(member)
        starts.append(member.run.batch["id"])
    assert starts[:20] == ["batch_new"] * 20
    assert starts[20:].count("batch_new") == 2  # then the starts alternate
    assert slot_pump.created_us({**big, "retried_at": now_us // 1_000_000 + 5}) > slot_pump.created_us(new)
