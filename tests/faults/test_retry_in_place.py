"""Retry in place under faults: a worker dying during a retried run, and two walkers re-queueing one retry.
Every scenario ends with the ledger invariants (tests/invariants.py): nothing lost or doubled, slots all
given back, counts, usage and costs adding up to the stored requests."""

from __future__ import annotations

import json

from batchinfer.domain import Attempt, RequestState
from batchinfer.operations.openai import batches
from batchinfer.records.finished_order import Feed
from batchinfer.scheduling.dispatcher import Dispatcher
from batchinfer.service import lifecycle
from batchinfer.service.accounts import authenticate
from batchinfer.service.running import run_request
from batchinfer.service.steering import retry
from local.lambda_runtime import invoke
from tests.faults.harness import (
    GLM,
    budget_in_flight,
    configure,
    get_batch,
    pump,
    receive,
    requests_by_custom_id,
    results_by_custom_id,
    run_messages,
    run_pump,
    run_queued,
    sim_config,
    sim_stats,
    slot_leases,
    submit,
    worker_dies_after_answer,
)
from tests.helpers import chat_request, new_key
from tests.invariants import assert_ledger_consistent, budget_of

FLAKY = "[[sim:flaky:1:500]] once"  # fails the first time this exact body is sent, then answers


def test_a_worker_dying_during_a_retried_run_is_recovered_and_counted_once(svc, sim_control, monkeypatch):
    configure(svc, lease_seconds=60, max_attempts=1)
    _, key = new_key(svc)
    who = authenticate(svc, key)
    batch_id = submit(svc, who, [chat_request("flaky", FLAKY), chat_request("fine", "all good")])
    first = pump(svc, batch_id)
    assert (first["completed"], first["failed"]) == (1, 1)
    configure(svc, max_attempts=2)

    batch, _ = batches.retry_batch(svc, who, batch_id, {}, None)
    assert batch["status"] == "in_progress" and batch["request_counts"]["failed"] == 0
    assert budget_of(svc, GLM)["waiting"] == 1

    real_settle = run_request.settle
    died = []

    def dying_settle(svc_, req, outcome, stop=None):
        if req["custom_id"] == "flaky" and outcome.to is RequestState.COMPLETED and not died:
            died.append(req["state"])
            raise RuntimeError("worker process died")  # the backend answered; the outcome is never written
        return real_settle(svc_, req, outcome, stop)

    monkeypatch.setattr(run_request, "settle", dying_settle)
    from batchinfer.scheduling.dispatcher import Dispatcher
    assert Dispatcher(svc).pass_once() == 1  # the retried request alone, served as a retry
    messages = receive(svc, GLM)
    report = run_messages(svc, GLM, messages)
    assert died == ["running"] and report["failed"] == [messages[0]["MessageId"]]
    assert results_by_custom_id(svc, who, batch_id)["flaky"]["status"] == "running"
    # The redelivered message is stale; the batch waits for the lease.
    run_messages(svc, GLM, receive(svc, GLM))
    assert get_batch(svc, batch_id)["status"] == "in_progress"

    svc.clock.advance(61)
    final = pump(svc, batch_id, clock_step=2)
    assert final["status"] == "completed" and (final["completed"], final["failed"]) == (2, 0)
    assert final["retry_count"] == 1 and final["cost_unknown_attempts"] == 1
    stored = requests_by_custom_id(svc, batch_id)
    assert stored["flaky"]["attempt"] == 2 and stored["flaky"]["earlier_attempts"] == 1
    assert stored["fine"]["attempt"] == 1 and "earlier_attempts" not in stored["fine"]
    assert sim_stats(sim_control, settle=True)["total_requests"] == 4  # 2, then the lost answer and its rerun
    assert budget_of(svc, GLM)["waiting"] == 0
    assert_ledger_consistent(svc, batch_id, who, ["flaky", "fine"])


def test_a_worker_dying_holding_a_group_of_a_retried_lane_is_recovered(svc, sim_control, monkeypatch):
    configure(svc, lease_seconds=60)
    _, key = new_key(svc)
    who = authenticate(svc, key)
    batch_id = submit(svc, who, [chat_request(f"r-{i}", f"request {i}") for i in range(5)])
    svc.clock.advance(86400)  # the window closes before anything started: the batch expires
    assert pump(svc, batch_id)["status"] == "expired"

    batch, _ = batches.retry_batch(svc, who, batch_id, {"statuses": ["expired"]}, None)
    assert batch["request_counts"] == {"total": 5, "completed": 0, "failed": 0}

    died = worker_dies_after_answer(monkeypatch, "r-2")
    from batchinfer.scheduling.dispatcher import Dispatcher
    assert Dispatcher(svc).pass_once() == 5  # the lane is back at its cursor: one group of five
    run_messages(svc, GLM, receive(svc, GLM))
    assert died == ["completed"]
    svc.clock.advance(61)
    final = pump(svc, batch_id, clock_step=2)
    assert final["status"] == "completed" and final["completed"] == 5 and final["cost_unknown_attempts"] == 1
    assert_ledger_consistent(svc, batch_id, who, [f"r-{i}" for i in range(5)])


def test_two_walkers_re_queue_each_request_once(svc, sim_control, monkeypatch):
    """A large retry is re-queued a page at a time, by the call and then by sweepers that may overlap: two
    walkers working from stale copies of the batch move each request once, and the counts add up."""
    configure(svc, max_attempts=1)
    monkeypatch.setattr(retry, "RETRY_PAGE", 3)
    monkeypatch.setattr(retry, "CALL_SECONDS", 0.0)  # the call re-queues nothing: the walkers do it all
    _, key = new_key(svc)
    who = authenticate(svc, key)
    ids = [f"f-{i}" for i in range(10)] + ["ok"]
    batch_id = submit(svc, who, [chat_request(c, f"[[sim:flaky:1:500]] {c}") for c in ids[:-1]]
                      + [chat_request("ok", "fine")])
    first = pump(svc, batch_id)
    assert (first["completed"], first["failed"]) == (1, 10)

    batch, _ = batches.retry_batch(svc, who, batch_id, {}, None)
    assert batch["status"] == "in_progress" and batch["request_counts"]["failed"] == 10  # nothing moved yet
    assert get_batch(svc, batch_id)["retrying"]
    stale_a = stale_b = get_batch(svc, batch_id)
    for _ in range(20):  # each walker steps from the copy it read, then the other goes on from its own
        stale_a = retry._step(svc, stale_a) if stale_a and stale_a.get("retrying") else stale_a
        stale_b = retry._step(svc, stale_b) if stale_b and stale_b.get("retrying") else stale_b
        stale_b = retry._step(svc, get_batch(svc, batch_id)) if get_batch(svc, batch_id).get("retrying") else stale_b
    walked = get_batch(svc, batch_id)
    assert "retrying" not in walked
    assert (walked["failed"], walked["open"]) == (0, 10)
    assert budget_of(svc, GLM)["waiting"] == 10
    final = pump(svc, batch_id, clock_step=2)
    assert final["status"] == "completed" and final["completed"] == 11
    assert sim_stats(sim_control, settle=True)["total_requests"] == 21  # 11, then each failed one once more
    assert_ledger_consistent(svc, batch_id, who, ids)


def _feed_entries(svc, batch_id: str) -> list[dict]:
    return Feed.after(svc.table, batch_id, 0, 1000)


def test_a_retried_run_goes_to_one_pump_that_writes_its_outcomes_together(svc, sim_control):
    """A retried batch is all retries: the dispatcher sends one of them, whose worker's pump takes the free
    slots and claims the others in them (not a worker and a pump per request), and writes the answers of one
    batch together: fewer transactions, and entries in its finished-order log, than requests."""
    configure(svc, max_attempts=1, worker_pull=True)
    sim_config(sim_control, latency_seconds=0.05)
    _, key = new_key(svc)
    who = authenticate(svc, key)
    ids = [f"f-{i}" for i in range(12)]
    batch_id = submit(svc, who, [chat_request(c, f"{FLAKY} {c}") for c in ids])
    first = pump(svc, batch_id)
    assert (first["completed"], first["failed"]) == (0, 12)
    logged = len(_feed_entries(svc, batch_id))

    batches.retry_batch(svc, who, batch_id, {}, None)
    assert budget_of(svc, GLM)["waiting"] == 12
    from batchinfer.scheduling.dispatcher import Dispatcher
    assert Dispatcher(svc).pass_once() == 1  # one retry seeds a worker; the other eleven stay due for its pump
    assert budget_of(svc, GLM)["waiting"] == 11
    messages = receive(svc, GLM)
    assert len(messages) == 1
    report = run_messages(svc, GLM, messages)
    assert not report["failed"]
    final = get_batch(svc, batch_id)
    assert final["status"] == "completed" and (final["completed"], final["failed"]) == (12, 0)
    assert final["retry_count"] == 1
    written = len(_feed_entries(svc, batch_id)) - logged
    assert 1 <= written < 12, written  # answers of the batch written together, not one entry each
    stored = requests_by_custom_id(svc, batch_id)
    assert all(stored[c]["attempt"] == 1 and stored[c]["earlier_attempts"] == 1 for c in ids)
    assert all(r["status"] == "completed" for r in results_by_custom_id(svc, who, batch_id).values())
    assert budget_of(svc, GLM)["waiting"] == 0 and budget_in_flight(svc) == 0 and slot_leases(svc) == []
    assert_ledger_consistent(svc, batch_id, who, ids)


def test_a_worker_dying_writing_a_retried_runs_answers_together_is_recovered_once(svc, sim_control, monkeypatch):
    """The pump's write of several retries' answers in one transaction dies: none of them is written, their
    leases run out, and the sweeper puts them back (the answers' cost unknown); each is then run and counted
    once."""
    configure(svc, lease_seconds=60, max_attempts=1)
    _, key = new_key(svc)
    who = authenticate(svc, key)
    ids = [f"f-{i}" for i in range(6)]
    batch_id = submit(svc, who, [chat_request(c, f"{FLAKY} {c}") for c in ids])
    assert pump(svc, batch_id)["failed"] == 6
    configure(svc, max_attempts=2)
    batches.retry_batch(svc, who, batch_id, {}, None)

    real = run_request.settle_many
    died = []

    def dying_settle_many(svc_, settled, stop=None):
        if not died:
            died.append(len(settled))
            raise RuntimeError("worker process died")  # the backend answered; the outcomes are never written
        return real(svc_, settled, stop)

    monkeypatch.setattr(run_request, "settle_many", dying_settle_many)
    outcome = run_pump(svc, slots=6, seconds=90)  # it ends once idle: the bound is for a busy machine
    assert died and died[0] >= 1
    assert outcome["completed"] == 6 - died[0], outcome
    assert get_batch(svc, batch_id)["status"] == "in_progress"  # those written wait for the lost ones' leases
    assert budget_in_flight(svc) == 0 and slot_leases(svc) == []

    svc.clock.advance(61)
    final = pump(svc, batch_id, clock_step=2)
    assert final["status"] == "completed" and (final["completed"], final["failed"]) == (6, 0)
    assert final["cost_unknown_attempts"] == died[0]
    stored = requests_by_custom_id(svc, batch_id)
    assert sum(stored[c]["attempt"] for c in ids) == 6 + died[0]  # the lost answers' attempts count, once
    assert_ledger_consistent(svc, batch_id, who, ids)


def test_a_retry_that_lost_its_lease_does_not_keep_the_others_answers_from_being_written(svc, sim_control):
    """Answers written together where one of them lost its lease meanwhile: that one is dropped (the sweeper
    counted it), the others are written, each once."""
    configure(svc, lease_seconds=60, max_attempts=1)
    _, key = new_key(svc)
    who = authenticate(svc, key)
    ids = ["a", "b", "c"]
    batch_id = submit(svc, who, [chat_request(c, f"{FLAKY} {c}") for c in ids])
    assert pump(svc, batch_id)["failed"] == 3
    configure(svc, max_attempts=2, worker_pull=True)
    batches.retry_batch(svc, who, batch_id, {}, None)
    from batchinfer.scheduling.dispatcher import Dispatcher
    dispatcher = Dispatcher(svc)
    assert dispatcher.pass_once() == 1
    seeded = receive(svc, GLM)
    configure(svc, worker_pull=False)
    assert dispatcher.pass_once() == 2  # without pumps, each retry is sent on its own
    started = []
    for message in seeded + receive(svc, GLM):
        one = run_request.start_retry(svc, json.loads(message["Body"]))
        assert isinstance(one, run_request.StartedRetry), one
        started.append(one)
    svc.clock.advance(61)
    invoke("sweeper", {})  # every lease ran out: the three are put back, their cost unknown
    answer = Attempt(status_code=200, body={"choices": []})
    outcome = run_request.finish_retries(svc, [(one, answer) for one in started])
    assert outcome == {"lease_lost": 3}, outcome
    final = pump(svc, batch_id, clock_step=2)
    assert final["status"] == "completed" and final["completed"] == 3 and final["cost_unknown_attempts"] == 3
    assert_ledger_consistent(svc, batch_id, who, ids)


def test_an_ending_decided_before_a_retry_in_place_does_not_end_the_retried_run(svc, sim_control, monkeypatch):
    """A settle reads a batch whose requests all have their outcome and decides its ending; before its write
    lands, another settle ends the batch, its owner retries it in place and the retried request runs. The
    late write, decided on the first run, is refused: the retried run ends by a settle that read it."""
    configure(svc, max_attempts=1)
    _, key = new_key(svc)
    who = authenticate(svc, key)
    batch_id = submit(svc, who, [chat_request("flaky", FLAKY), chat_request("fine", "all good")])
    assert Dispatcher(svc).pass_once() == 2
    run_queued(svc)  # both have their outcome; the batch is not settled yet
    real_announcing = lifecycle._announcing
    meanwhile = []

    def announcing_then_retried_meanwhile(svc_, batch, final, ops):
        event = real_announcing(svc_, batch, final, ops)  # the last step before the ending's write
        if not meanwhile:
            meanwhile.append(batch["status"])
            assert lifecycle.settle_batch(svc, batch_id)["status"] == "completed"  # the other settle
            configure(svc, max_attempts=2)
            batches.retry_batch(svc, who, batch_id, {}, None)
            assert Dispatcher(svc).pass_once() == 1
            run_queued(svc)  # the retried request completes; its run is not settled yet
            retried = get_batch(svc, batch_id)
            meanwhile.append((retried["status"], retried["retry_count"], retried["open"], retried["in_flight"]))
        return event

    monkeypatch.setattr(lifecycle, "_announcing", announcing_then_retried_meanwhile)
    late = lifecycle.settle_batch(svc, batch_id)

    assert meanwhile == ["in_progress", ("in_progress", 1, 0, 0)]
    assert late["status"] == "in_progress" and late["retry_count"] == 1  # the late ending changed nothing
    monkeypatch.setattr(lifecycle, "_announcing", real_announcing)
    final = pump(svc, batch_id)
    assert final["status"] == "completed" and (final["completed"], final["failed"]) == (2, 0)
    assert final["completed_at"] >= final["retried_at"]  # ended by the retried run's own settle
    assert_ledger_consistent(svc, batch_id, who, ["flaky", "fine"])


def test_a_pump_claims_a_retried_batchs_requests_together_already_running(svc, sim_control, monkeypatch):
    """A pump takes the due retries of a batch as it takes a lane's requests: together, in claims of a few,
    each already running (no claim and start per request), and every one of them runs and is counted once."""
    from batchinfer.scheduling import dispatcher
    configure(svc, max_attempts=1)
    sim_config(sim_control, latency_seconds=0.05)
    _, key = new_key(svc)
    who = authenticate(svc, key)
    ids = [f"f-{i}" for i in range(12)]
    batch_id = submit(svc, who, [chat_request(c, f"{FLAKY} {c}") for c in ids])
    assert pump(svc, batch_id)["failed"] == 12
    batches.retry_batch(svc, who, batch_id, {}, None)
    calls_before = sim_stats(sim_control, settle=True)["total_requests"]

    together, one_by_one = [], []
    real_together, real_one = dispatcher.claim_retries_running, dispatcher.claim_retry
    monkeypatch.setattr(dispatcher, "claim_retries_running",
                        lambda svc_, batch, reqs, *rest: together.append(len(reqs)) or real_together(svc_, batch, reqs,
                                                                                                       *rest))
    monkeypatch.setattr(dispatcher, "claim_retry", lambda *args, **kw: one_by_one.append(1) or real_one(*args, **kw))
    outcome = run_pump(svc, slots=12, seconds=90)  # it ends once idle: the bound is for a busy machine
    assert outcome["completed"] == 12, outcome
    assert sum(together) == 12 and len(together) < 12 and not one_by_one, (together, one_by_one)
    final = pump(svc, batch_id)
    assert final["status"] == "completed" and (final["completed"], final["failed"]) == (12, 0)
    stored = requests_by_custom_id(svc, batch_id)
    assert all(stored[c]["attempt"] == 1 and stored[c]["earlier_attempts"] == 1 for c in ids)
    assert sim_stats(sim_control, settle=True)["total_requests"] == calls_before + 12
    assert budget_of(svc, GLM)["waiting"] == 0 and budget_in_flight(svc) == 0 and slot_leases(svc) == []
    assert_ledger_consistent(svc, batch_id, who, ids)


def test_retries_claimed_running_whose_key_was_revoked_never_run_and_use_no_attempt(svc, sim_control):
    """The checks made before every attempt hold for retries a pump claimed running: their key revoked after
    the retry, none is sent, the batch fails as a first run would, and none of them counts an attempt."""
    from batchinfer.service import accounts
    configure(svc, max_attempts=1)
    _, key = new_key(svc)
    who = authenticate(svc, key)
    ids = [f"f-{i}" for i in range(6)]
    batch_id = submit(svc, who, [chat_request(c, f"{FLAKY} {c}") for c in ids])
    assert pump(svc, batch_id)["failed"] == 6
    batches.retry_batch(svc, who, batch_id, {}, None)
    calls_before = sim_stats(sim_control, settle=True)["total_requests"]
    accounts.revoke_key(svc, key)

    outcome = run_pump(svc, slots=6, seconds=90)
    assert outcome == {"unstarted": 6}, outcome
    invoke("sweeper", {})
    final = get_batch(svc, batch_id)
    assert final["status"] == "failed" and final["failed"] == 6, final
    stored = requests_by_custom_id(svc, batch_id)
    assert all(stored[c]["attempt"] == 0 and stored[c]["state"] == "unstarted" for c in ids), stored
    assert sim_stats(sim_control, settle=True)["total_requests"] == calls_before
    assert budget_of(svc, GLM)["waiting"] == 0 and budget_in_flight(svc) == 0 and slot_leases(svc) == []
    assert_ledger_consistent(svc, batch_id, who, ids)


def test_retries_claimed_running_against_a_stale_pause_go_back_to_wait_and_run(svc, sim_control, monkeypatch):
    """A pump's copy of a batch may still say paused after a resume: retries it claimed running are then judged
    again on a fresh read of the batch, put back to wait (no attempt counted) and run; none is left running
    until its lease runs out."""
    from batchinfer.service.running import run_request
    configure(svc, max_attempts=1)
    sim_config(sim_control, latency_seconds=0.05)
    _, key = new_key(svc)
    who = authenticate(svc, key)
    ids = [f"f-{i}" for i in range(6)]
    batch_id = submit(svc, who, [chat_request(c, f"{FLAKY} {c}") for c in ids])
    assert pump(svc, batch_id)["failed"] == 6
    batches.retry_batch(svc, who, batch_id, {}, None)

    stale = []
    real_start = run_request.start_claimed_retries

    def start_with_a_stale_pause(svc_, running, batch, *rest):
        if not stale:  # the first claim's checks read a copy kept from before a resume
            stale.append(len(running))
            batch = {**batch, "paused_at": svc_.now() - 5}
        return real_start(svc_, running, batch, *rest)

    monkeypatch.setattr(run_request, "start_claimed_retries", start_with_a_stale_pause)
    outcome = run_pump(svc, slots=6, seconds=90)
    assert stale and outcome["completed"] == 6, (stale, outcome)
    final = pump(svc, batch_id)
    assert final["status"] == "completed" and (final["completed"], final["failed"]) == (6, 0)
    stored = requests_by_custom_id(svc, batch_id)
    assert all(stored[c]["attempt"] == 1 for c in ids), stored
    assert budget_in_flight(svc) == 0 and slot_leases(svc) == []
    assert_ledger_consistent(svc, batch_id, who, ids)
