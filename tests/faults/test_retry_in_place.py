"""Retry in place under faults: a worker dying during a retried run, and two walkers re-queueing one retry.
Every scenario ends with the ledger invariants (tests/invariants.py): nothing lost or doubled, slots all
given back, counts, usage and costs adding up to the stored requests."""

from __future__ import annotations

from batchinfer.domain import RequestState
from batchinfer.protocols.openai import batches
from batchinfer.service import retry, run_request
from batchinfer.service.accounts import authenticate
from tests.faults.harness import (
    GLM,
    configure,
    get_batch,
    pump,
    receive,
    requests_by_custom_id,
    results_by_custom_id,
    run_messages,
    sim_stats,
    submit,
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

    real_record = run_request.record_position
    died = []

    def dying_record(svc_, item):
        if item["custom_id"] == "r-2" and not died:
            died.append(item["state"])
            raise RuntimeError("worker process died")
        return real_record(svc_, item)

    monkeypatch.setattr(run_request, "record_position", dying_record)
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
