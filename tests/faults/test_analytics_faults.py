"""A batch's analytics when a worker dies mid-group: its counts stay exact for every attempt that finished, and
an attempt the worker abandoned counts once (no latency, under the lost attempt's error code), however many
times the group's message is delivered again; its run again counts as a retry."""

from __future__ import annotations

import pytest

from batchinfer import ledger
from batchinfer.layout import group_key
from batchinfer.operations.openai import batches
from batchinfer.scheduling.dispatcher import Dispatcher
from batchinfer.service.accounts import authenticate
from batchinfer.service.background.sweep import sweep_once
from batchinfer.storage.dynamo import ConditionFailed
from tests.faults.harness import (
    GLM,
    configure,
    get_batch,
    pump,
    receive,
    run_messages,
    run_queued,
    sim_stats,
    submit,
    worker_dies_after_answer,
)
from tests.helpers import chat_request, new_key
from tests.invariants import assert_ledger_consistent


def test_a_worker_dying_mid_group_counts_each_attempt_once(svc, sim_control, monkeypatch):
    configure(svc, lease_seconds=60)
    _, key = new_key(svc)
    who = authenticate(svc, key)
    requests = [chat_request("dies", "the worker dies after this answer"), chat_request("fine", "all good"),
                chat_request("bad", "[[sim:400]] rejected")]
    batch_id = submit(svc, who, requests)

    died = worker_dies_after_answer(monkeypatch, "dies")
    assert Dispatcher(svc).pass_once() == 3
    messages = receive(svc, GLM)
    assert len(messages) == 1  # all three in one group
    group = svc.table.get(*group_key(batch_id, 0))
    report = run_messages(svc, GLM, messages)
    assert died == ["completed"] and report["failed"] == [messages[0]["MessageId"]]
    # Nothing is counted before the group closes: the members written wait in their items.
    assert batches.batch_object(get_batch(svc, batch_id))["analytics"]["attempts"] == 0

    sweep_once(svc)
    run_queued(svc)  # the message delivered again before the lease runs out: stale, nothing counted
    assert batches.batch_object(get_batch(svc, batch_id))["analytics"]["attempts"] == 0
    svc.clock.advance(61)
    sweep_once(svc)  # the lease ran out: the group is closed from its items, the lost member counted once
    recovered = batches.batch_object(get_batch(svc, batch_id))["analytics"]
    assert (recovered["attempts"], recovered["retries"]) == (3, 0)
    assert recovered["errors_by_code"] == {"invalid_request": 1, "timeout": 1}
    # A worker that lost the lease comes back and closes the group: refused (it is gone), nothing twice.
    assert svc.table.get(*group_key(batch_id, 0)) is None
    with pytest.raises(ConditionFailed):
        ledger.close_group(svc, {**group, "state": "running"}, [])
    run_queued(svc)
    assert batches.batch_object(get_batch(svc, batch_id))["analytics"] == recovered

    final = pump(svc, batch_id, clock_step=2)
    assert final["status"] == "completed" and (final["completed"], final["failed"]) == (2, 1)
    assert_ledger_consistent(svc, batch_id, who, ["dies", "fine", "bad"])
    shown = batches.batch_object(final)["analytics"]
    # Four attempts reached the backend: the three first ones and the lost one's run again; four are counted.
    assert sim_stats(sim_control)["total_requests"] == 4
    assert (shown["attempts"], shown["retries"]) == (4, 1)
    assert shown["errors_by_code"] == {"invalid_request": 1, "timeout": 1}
    assert shown["requests_per_minute"] == round(3 * 60 / shown["running_seconds"], 2)
    assert final["cost_unknown_attempts"] == 1
