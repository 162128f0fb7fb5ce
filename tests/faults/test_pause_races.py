"""Pause and resume under races: a pause landing between a dispatcher's read and its claim, or between a
worker's check and its start; a resume racing the completion window's end, or a worker's stale look at a
paused batch. Every scenario ends with the shared ledger checker (tests/invariants.py): nothing lost or
doubled, every slot given back, counts and costs adding up."""

from __future__ import annotations

import asyncio
import json
import threading
import time

from batchinfer import ledger
from batchinfer.errors import Conflict
from batchinfer.records import Batch, Budget, Request
from batchinfer.scheduling import dispatcher as claim_pass
from batchinfer.scheduling import lanes
from batchinfer.scheduling import pump as slot_pumps
from batchinfer.scheduling.dispatcher import Dispatcher
from batchinfer.service.accounts import authenticate
from batchinfer.service.background.sweep import sweep_once
from batchinfer.service.running import run_request
from batchinfer.service.steering import pausing
from tests.faults.harness import (
    GLM,
    budget_in_flight,
    configure,
    get_batch,
    pump,
    receive,
    requests_by_custom_id,
    results_by_custom_id,
    run_pump,
    run_queued,
    set_budgets,
    sim_config,
    sim_stats,
    slot_leases,
    submit,
)
from tests.helpers import chat_request, new_key
from tests.invariants import assert_ledger_consistent, budget_of


def new_batch(svc, n: int, content: str = "pause") -> tuple[object, str, list[dict]]:
    _, key = new_key(svc)
    who = authenticate(svc, key)
    requests = [chat_request(f"p-{i}", f"{content} {i}") for i in range(n)]
    return who, submit(svc, who, requests), requests


def assert_nothing_held(svc, batch_id: str) -> None:
    batch = get_batch(svc, batch_id)
    assert batch["in_flight"] == 0 and budget_of(svc, GLM)["in_flight"] == 0, (batch, budget_of(svc, GLM))
    groups = svc.table.query_all("pk = :pk AND begins_with(sk, :g)", {":pk": f"BATCH#{batch_id}", ":g": "GRP#"},
                                 consistent=True)
    assert list(groups) == []


def test_pause_racing_a_claim_dispatches_nothing(svc, sim_control, monkeypatch):
    """The dispatcher read the lane and the batch, then the pause committed, then the claim was written: the
    claim is refused (it is fenced on the batch not being paused), nothing holds a slot."""
    who, batch_id, requests = new_batch(svc, 5)
    real = lanes.claim_from_lane
    raced = []

    def paused_first(*args, **kwargs):
        if not raced:
            raced.append(pausing.pause(svc, get_batch(svc, batch_id)))
        return real(*args, **kwargs)

    monkeypatch.setattr(lanes, "claim_from_lane", paused_first)
    assert Dispatcher(svc).pass_once() == 0 and raced
    assert_nothing_held(svc, batch_id)
    monkeypatch.setattr(lanes, "claim_from_lane", real)
    for _ in range(3):
        assert Dispatcher(svc).pass_once() == 0
    assert sim_stats(sim_control)["total_requests"] == 0
    pausing.resume(svc, get_batch(svc, batch_id))
    final = pump(svc, batch_id)
    assert final["status"] == "completed"
    assert_ledger_consistent(svc, batch_id, who, [r["custom_id"] for r in requests])
    assert sim_stats(sim_control, settle=True)["total_requests"] == 5


def test_pause_racing_a_retry_claim_puts_the_retry_off_until_resumed(svc, sim_control, monkeypatch):
    """A request waiting for its retry is read as due, the pause commits, the claim is refused: the request is
    put off until the window's end (it holds no slot and no dispatcher trips on it), and a resume makes it
    due again."""
    configure(svc, lease_seconds=3600)
    _, key = new_key(svc)
    who = authenticate(svc, key)
    requests = [chat_request("flaky", "[[sim:flaky:1:500]] once"), chat_request("plain", "twice")]
    batch_id = submit(svc, who, requests)
    assert Dispatcher(svc).pass_once() == 2
    run_queued(svc)  # "flaky" failed once and waits for its retry, due a second later
    assert requests_by_custom_id(svc, batch_id)["flaky"]["state"] == "waiting"
    svc.clock.advance(2)
    real = claim_pass.claim_retry
    raced = []

    def paused_first(*args, **kwargs):
        if not raced:
            raced.append(pausing.pause(svc, get_batch(svc, batch_id)))
            # The pause found the request waiting and put it off itself; make it due again and counted, as a
            # retry that began waiting just after the pause's look would be.
            waiting = requests_by_custom_id(svc, batch_id)["flaky"]
            svc.table.transact([Request.bring_back(svc.table, waiting, svc.now(), "late"),
                                Budget.add(svc.table, GLM, {"waiting": 1})])
            args = (args[0], requests_by_custom_id(svc, batch_id)["flaky"], *args[2:])
        return real(*args, **kwargs)

    monkeypatch.setattr(claim_pass, "claim_retry", paused_first)
    assert Dispatcher(svc).pass_once() == 0 and raced
    monkeypatch.setattr(claim_pass, "claim_retry", real)
    waiting = requests_by_custom_id(svc, batch_id)["flaky"]
    assert waiting["state"] == "waiting" and waiting["due_at"] == get_batch(svc, batch_id)["expires_at"]
    assert budget_of(svc, GLM)["waiting"] == 0  # put off: out of the model's count while paused
    assert_nothing_held(svc, batch_id)
    assert Dispatcher(svc).pass_once() == 0
    pausing.resume(svc, get_batch(svc, batch_id))
    assert requests_by_custom_id(svc, batch_id)["flaky"]["due_at"] <= svc.now()
    final = pump(svc, batch_id)
    assert final["status"] == "completed"
    assert_ledger_consistent(svc, batch_id, who, [r["custom_id"] for r in requests])
    assert requests_by_custom_id(svc, batch_id)["flaky"]["attempt"] == 2


def test_pause_racing_a_workers_start_sends_the_group_back_to_wait(svc, sim_control, monkeypatch):
    """The worker checked the batch (running), the pause committed, then the worker started the group: the
    start is refused (fenced on the batch not being paused) and the group's requests go back to wait, their
    slots given back."""
    configure(svc, lease_seconds=3600)
    who, batch_id, requests = new_batch(svc, 3)
    assert Dispatcher(svc).pass_once() == 3
    real = run_request.start_group
    raced = []

    def paused_first(*args, **kwargs):
        if not raced:
            raced.append(pausing.pause(svc, get_batch(svc, batch_id)))
        return real(*args, **kwargs)

    monkeypatch.setattr(run_request, "start_group", paused_first)
    run_queued(svc)
    assert raced and sim_stats(sim_control)["total_requests"] == 0
    assert_nothing_held(svc, batch_id)
    assert {r["state"] for r in requests_by_custom_id(svc, batch_id).values()} == {"waiting"}
    monkeypatch.setattr(run_request, "start_group", real)
    pausing.resume(svc, get_batch(svc, batch_id))
    final = pump(svc, batch_id)
    assert final["status"] == "completed"
    assert_ledger_consistent(svc, batch_id, who, [r["custom_id"] for r in requests])
    assert sim_stats(sim_control, settle=True)["total_requests"] == 3


def test_resume_just_before_the_window_closes_then_the_sweeper_expires_it(svc, sim_control):
    configure(svc, batch_completion_window_seconds=600, lease_seconds=3600)
    set_budgets(svc, {GLM: 1})
    who, batch_id, requests = new_batch(svc, 4)
    assert Dispatcher(svc).pass_once() == 1
    run_queued(svc)  # p-0 completed
    assert Dispatcher(svc).pass_once() == 1  # p-1 dispatched, then the batch is paused
    pausing.pause(svc, get_batch(svc, batch_id))
    run_queued(svc)  # p-1 goes back to wait
    svc.clock.advance(599)
    pausing.resume(svc, get_batch(svc, batch_id))
    svc.clock.advance(2)  # the window closes before any dispatcher pass
    final = pump(svc, batch_id)
    assert final["status"] == "expired"
    assert_ledger_consistent(svc, batch_id, who, [r["custom_id"] for r in requests])
    statuses = {c: r["status"] for c, r in results_by_custom_id(svc, who, batch_id).items()}
    assert statuses == {"p-0": "completed", "p-1": "expired", "p-2": "expired", "p-3": "expired"}
    assert sim_stats(sim_control, settle=True)["total_requests"] == 1


def test_resume_after_the_sweeper_expired_the_paused_batch_is_refused(svc, sim_control):
    configure(svc, batch_completion_window_seconds=600, lease_seconds=3600)
    who, batch_id, requests = new_batch(svc, 3)
    paused = pausing.pause(svc, get_batch(svc, batch_id))
    svc.clock.advance(601)
    sweep_once(svc)
    expired = get_batch(svc, batch_id)
    assert expired["status"] == "expired" and pausing.paused_at(expired) is None
    try:
        pausing.resume(svc, paused)  # as read before the sweeper's run
    except Conflict as refused:
        assert refused.code == "batch_ended"
    else:
        raise AssertionError("a resume of an expired batch was accepted")
    assert_ledger_consistent(svc, batch_id, who, [r["custom_id"] for r in requests])
    assert sim_stats(sim_control)["total_requests"] == 0


def test_a_workers_stale_look_at_a_paused_batch_racing_its_resume_leaves_nothing_put_off(svc, sim_control):
    """A worker read the batch paused; the resume committed and looked for waiting requests before the worker
    put its group back to wait: the put-back is fenced on the batch still paused, so it is refused, and the
    worker, reading the batch again, runs the group now rather than at the window's end."""
    configure(svc, lease_seconds=3600)
    who, batch_id, requests = new_batch(svc, 3)
    model = svc.catalog.get(GLM)
    groups = Dispatcher(svc).claim(model)
    stale = pausing.pause(svc, get_batch(svc, batch_id))
    pausing.resume(svc, get_batch(svc, batch_id))
    for group in groups:
        asyncio.run(run_request.process(svc, ledger.queue_message(group), batch=stale))
    assert {r["state"] for r in requests_by_custom_id(svc, batch_id).values()} == {"completed"}
    assert Batch.get(svc.table, batch_id)["in_flight"] == 0 and budget_of(svc, GLM)["waiting"] == 0
    final = pump(svc, batch_id)
    assert final["status"] == "completed"
    assert_ledger_consistent(svc, batch_id, who, [r["custom_id"] for r in requests])


def test_pause_while_a_pump_holds_claimed_work_hands_it_back(svc, sim_control):
    """A worker's slot pump runs a batch (2 slots, work claimed ahead in its lease); the batch is paused
    mid-way: the calls running finish, what the pump had claimed but not started goes back to wait, its
    claims are refused from then on, and it gives its slots back. Resumed, every request runs once."""
    configure(svc, lease_seconds=3600)
    set_budgets(svc, {GLM: 2})
    sim_config(sim_control, latency_seconds=0.1)
    who, batch_id, requests = new_batch(svc, 30)
    ran: list = []
    worker = threading.Thread(target=lambda: ran.append(run_pump(svc, slots=2)))
    worker.start()
    deadline = time.monotonic() + 20
    while get_batch(svc, batch_id)["completed"] < 4 and time.monotonic() < deadline:
        time.sleep(0.05)
    pausing.pause(svc, get_batch(svc, batch_id))
    worker.join(timeout=30)
    assert not worker.is_alive() and ran
    paused = get_batch(svc, batch_id)
    assert 4 <= paused["completed"] < 30, paused
    assert paused["in_flight"] == 0 and budget_in_flight(svc) == 0 and slot_leases(svc) == []
    started = sim_stats(sim_control, settle=True)["total_requests"]
    assert started == paused["completed"]  # nothing started after the running calls
    assert Dispatcher(svc).pass_once() == 0
    sim_config(sim_control, latency_seconds=0)
    pausing.resume(svc, get_batch(svc, batch_id))
    final = pump(svc, batch_id)
    assert final["status"] == "completed" and final["completed"] == 30
    assert_ledger_consistent(svc, batch_id, who, [r["custom_id"] for r in requests])
    assert sim_stats(sim_control, settle=True)["total_requests"] == 30  # every request ran once


def waiting_batch(svc, n: int, content: str) -> tuple[object, str, list[dict]]:
    """A batch whose `n` requests failed once and wait for their retry (counted in the model's `waiting`)."""
    who, batch_id, requests = new_batch(svc, n, f"[[sim:flaky:1:500]] {content}")
    Dispatcher(svc).pass_once()
    run_queued(svc)
    assert budget_of(svc, GLM)["waiting"] == n
    return who, batch_id, requests


def put_off(svc, batch_id: str) -> list[bool]:
    """Whether each waiting request of the batch is out of the model's count (a pause put it off)."""
    return [bool(r.get("uncounted")) for r in requests_by_custom_id(svc, batch_id).values()
            if r["state"] == "waiting"]


def test_two_walkers_carrying_one_pause_on_move_each_request_once(svc, sim_control, monkeypatch):
    """The pause answers before its walk is over; two sweepers carry the walk on at once, each from the batch
    as it read it: every step is fenced on the walk's cursor (and each request on its token), so the model's
    count goes down by exactly the waiting requests, and a resume's walk puts back exactly as many."""
    monkeypatch.setattr(pausing, "WALK_PAGE", 3)
    monkeypatch.setattr(pausing, "CALL_SECONDS", 0.0)
    who, batch_id, requests = waiting_batch(svc, 10, "two walkers")
    pausing.pause(svc, get_batch(svc, batch_id))
    assert budget_of(svc, GLM)["waiting"] == 10 and get_batch(svc, batch_id)["pause_walk"]
    seen = get_batch(svc, batch_id)
    assert pausing._step(svc, seen)["pause_walk"]["cursor"]  # the first walker's step moved three
    assert pausing._step(svc, seen)["pause_walk"] == get_batch(svc, batch_id)["pause_walk"]  # the stale one: none
    assert budget_of(svc, GLM)["waiting"] == 7
    walkers = [threading.Thread(target=pausing.carry_on, args=(svc, get_batch(svc, batch_id), None))
               for _ in range(2)]
    for w in walkers:
        w.start()
    for w in walkers:
        w.join()
    assert "pause_walk" not in get_batch(svc, batch_id)
    assert budget_of(svc, GLM)["waiting"] == 0 and put_off(svc, batch_id) == [True] * 10
    pausing.resume(svc, get_batch(svc, batch_id))
    walkers = [threading.Thread(target=sweep_once, args=(svc,)) for _ in range(2)]
    for w in walkers:
        w.start()
    for w in walkers:
        w.join()
    assert budget_of(svc, GLM)["waiting"] == 10 and put_off(svc, batch_id) == [False] * 10
    svc.clock.advance(5)
    assert pump(svc, batch_id)["status"] == "completed" and budget_of(svc, GLM)["waiting"] == 0
    assert_ledger_consistent(svc, batch_id, who, [r["custom_id"] for r in requests])


def test_a_walker_dying_midway_leaves_the_rest_to_the_sweeper(svc, sim_control, monkeypatch):
    """The pause call's walk dies after two steps (its Lambda timed out): what it moved stays moved, the cursor
    where its last step left it, and the sweeper carries on from there; a resume racing the dead walk starts
    its own from the start. The model's count is exact throughout."""
    monkeypatch.setattr(pausing, "WALK_PAGE", 2)
    who, batch_id, requests = waiting_batch(svc, 9, "dying walker")
    real, steps = pausing._step, []

    def dies_on_the_third(svc_, batch):
        if len(steps) == 2:
            raise TimeoutError("the invocation ran out of time")
        steps.append(batch["id"])
        return real(svc_, batch)

    monkeypatch.setattr(pausing, "_step", dies_on_the_third)
    try:
        pausing.pause(svc, get_batch(svc, batch_id))
    except TimeoutError:
        pass
    monkeypatch.setattr(pausing, "_step", real)
    batch = get_batch(svc, batch_id)
    assert batch["paused_at"] and batch["pause_walk"]["cursor"]
    assert budget_of(svc, GLM)["waiting"] == 5 and put_off(svc, batch_id).count(True) == 4
    sweep_once(svc)
    assert "pause_walk" not in get_batch(svc, batch_id) and budget_of(svc, GLM)["waiting"] == 0
    # Again, with a resume while the pause's walk is dead midway.
    steps.clear()
    pausing.resume(svc, get_batch(svc, batch_id))
    monkeypatch.setattr(pausing, "_step", dies_on_the_third)
    try:
        pausing.pause(svc, get_batch(svc, batch_id))
    except TimeoutError:
        pass
    monkeypatch.setattr(pausing, "_step", real)
    assert budget_of(svc, GLM)["waiting"] == 5
    pausing.resume(svc, get_batch(svc, batch_id))
    assert "pause_walk" not in get_batch(svc, batch_id) and budget_of(svc, GLM)["waiting"] == 9
    assert put_off(svc, batch_id) == [False] * 9
    svc.clock.advance(5)
    assert pump(svc, batch_id)["status"] == "completed" and budget_of(svc, GLM)["waiting"] == 0
    assert_ledger_consistent(svc, batch_id, who, [r["custom_id"] for r in requests])


def pause_and_resume_around_the_start(svc, batch_id: str, real):
    """A start that a pause refuses, and whose batch is resumed before the worker looks again: the pause
    commits before the start's transaction, the resume right after it (one round trip of the worker)."""
    raced = []

    def refused_then_resumed(*args, **kwargs):
        if raced:
            return real(*args, **kwargs)
        raced.append(pausing.pause(svc, get_batch(svc, batch_id)))
        try:
            return real(*args, **kwargs)
        finally:
            raced.append(pausing.resume(svc, get_batch(svc, batch_id)))

    return raced, refused_then_resumed


def test_a_start_refused_by_a_pause_and_resume_in_one_round_trip_starts_again(svc, sim_control, monkeypatch):
    """The worker checked the batch, a pause refused its start, the batch was resumed before the worker read it
    again: the group is still dispatched with the message's token and its batch runs, so the worker starts it
    again at once rather than leaving it dispatched until its lease runs out."""
    configure(svc, lease_seconds=3600)
    who, batch_id, requests = new_batch(svc, 3)
    assert Dispatcher(svc).pass_once() == 3
    raced, start = pause_and_resume_around_the_start(svc, batch_id, run_request.start_group)
    monkeypatch.setattr(run_request, "start_group", start)
    run_queued(svc)
    assert len(raced) == 2
    assert {r["state"] for r in requests_by_custom_id(svc, batch_id).values()} == {"completed"}
    assert_nothing_held(svc, batch_id)
    assert sim_stats(sim_control, settle=True)["total_requests"] == 3
    final = pump(svc, batch_id)
    assert final["status"] == "completed"
    assert_ledger_consistent(svc, batch_id, who, [r["custom_id"] for r in requests])
    assert sim_stats(sim_control, settle=True)["total_requests"] == 3


def test_a_pump_adopting_a_group_starts_it_again_after_a_pause_and_resume(svc, sim_control, monkeypatch):
    """The same race where a worker's slot pump adopts the queued group (its slots become the pump's lease)."""
    configure(svc, lease_seconds=3600)
    who, batch_id, requests = new_batch(svc, 3)
    assert Dispatcher(svc).pass_once() == 3
    raced, start = pause_and_resume_around_the_start(svc, batch_id, slot_pumps.start_group_in_lease)
    monkeypatch.setattr(slot_pumps, "start_group_in_lease", start)
    (message,) = receive(svc, GLM)

    async def adopt_and_run():
        worker = run_request.slot_pump(svc, svc.catalog.get(GLM), time.monotonic() + 20)
        assert await worker.adopt(json.loads(message["Body"])) is None  # adopted: started in the pump's lease
        return await worker.run(3)

    asyncio.run(adopt_and_run())
    assert len(raced) == 2
    assert {r["state"] for r in requests_by_custom_id(svc, batch_id).values()} == {"completed"}
    assert_nothing_held(svc, batch_id)
    assert slot_leases(svc) == [] and budget_in_flight(svc) == 0
    final = pump(svc, batch_id)
    assert final["status"] == "completed"
    assert_ledger_consistent(svc, batch_id, who, [r["custom_id"] for r in requests])
    assert sim_stats(sim_control, settle=True)["total_requests"] == 3


def test_a_retrys_start_refused_by_a_pause_and_resume_in_one_round_trip_starts_again(svc, sim_control,
                                                                                      monkeypatch):
    """The same race on a retry's start (one request dispatched again)."""
    configure(svc, lease_seconds=3600)
    _, key = new_key(svc)
    who = authenticate(svc, key)
    requests = [chat_request("flaky", "[[sim:flaky:1:500]] round trip")]
    batch_id = submit(svc, who, requests)
    assert Dispatcher(svc).pass_once() == 1
    run_queued(svc)
    svc.clock.advance(5)
    assert Dispatcher(svc).pass_once() == 1  # the retry, dispatched
    raced, start = pause_and_resume_around_the_start(svc, batch_id, run_request.start)
    monkeypatch.setattr(run_request, "start", start)
    run_queued(svc)
    assert len(raced) == 2
    flaky = requests_by_custom_id(svc, batch_id)["flaky"]
    assert flaky["state"] == "completed" and flaky["attempt"] == 2
    assert_nothing_held(svc, batch_id)
    assert pump(svc, batch_id)["status"] == "completed"
    assert_ledger_consistent(svc, batch_id, who, ["flaky"])
    assert sim_stats(sim_control, settle=True)["total_requests"] == 2


def test_a_worker_dying_right_after_putting_a_group_back_while_paused_leaves_the_count_right(svc, sim_control,
                                                                                            monkeypatch):
    """A worker finds the batch paused and puts its group back to wait, then dies before any other write: the
    requests are out of the model's `waiting` count from that write on (put off in it, fenced on the pause),
    so nothing is left for a later step to fix. Resumed, they run once and the count comes back to zero."""
    configure(svc, lease_seconds=3600)
    who, batch_id, requests = new_batch(svc, 3)
    assert Dispatcher(svc).pass_once() == 3
    pausing.pause(svc, get_batch(svc, batch_id))

    def dies(*args, **kwargs):
        raise TimeoutError("the invocation ran out of time")

    monkeypatch.setattr(pausing, "after_wait", dies)
    reports = run_queued(svc)
    assert reports and all(r["failed"] or r["raised"] for r in reports)  # the record died after the write
    monkeypatch.undo()
    waiting = requests_by_custom_id(svc, batch_id)
    assert {r["state"] for r in waiting.values()} == {"waiting"} and put_off(svc, batch_id) == [True] * 3
    assert budget_of(svc, GLM)["waiting"] == 0
    assert_nothing_held(svc, batch_id)
    run_queued(svc)  # the message again: the group is gone, nothing moves
    sweep_once(svc)
    assert budget_of(svc, GLM)["waiting"] == 0 and put_off(svc, batch_id) == [True] * 3
    pausing.resume(svc, get_batch(svc, batch_id))
    assert budget_of(svc, GLM)["waiting"] == 3 and put_off(svc, batch_id) == [False] * 3
    assert pump(svc, batch_id)["status"] == "completed" and budget_of(svc, GLM)["waiting"] == 0
    assert_ledger_consistent(svc, batch_id, who, [r["custom_id"] for r in requests])
    assert sim_stats(sim_control, settle=True)["total_requests"] == 3


def test_a_worker_dying_right_after_putting_a_retry_back_while_paused_leaves_the_count_right(svc, sim_control,
                                                                                            monkeypatch):
    """The same on a retry's path (one request dispatched again, put back because its batch was paused)."""
    configure(svc, lease_seconds=3600)
    _, key = new_key(svc)
    who = authenticate(svc, key)
    batch_id = submit(svc, who, [chat_request("flaky", "[[sim:flaky:1:500]] dying")])
    assert Dispatcher(svc).pass_once() == 1
    run_queued(svc)
    svc.clock.advance(5)
    assert Dispatcher(svc).pass_once() == 1 and budget_of(svc, GLM)["waiting"] == 0  # the retry, dispatched
    pausing.pause(svc, get_batch(svc, batch_id))

    def dies(*args, **kwargs):
        raise TimeoutError("the invocation ran out of time")

    monkeypatch.setattr(pausing, "after_wait", dies)
    run_queued(svc)
    monkeypatch.undo()
    assert put_off(svc, batch_id) == [True] and budget_of(svc, GLM)["waiting"] == 0
    assert_nothing_held(svc, batch_id)
    pausing.resume(svc, get_batch(svc, batch_id))
    assert budget_of(svc, GLM)["waiting"] == 1
    assert pump(svc, batch_id)["status"] == "completed" and budget_of(svc, GLM)["waiting"] == 0
    assert_ledger_consistent(svc, batch_id, who, ["flaky"])
