"""Message Batches under faults: the same scheduler, the same invariants."""

from __future__ import annotations

import json

from batchinfer.scheduling.dispatcher import Dispatcher
from batchinfer.service.accounts import authenticate
from tests.faults.harness import (
    GLM,
    QWEN,
    configure,
    dispatch_in_groups,
    pump,
    receive,
    run_messages,
    run_queued,
    set_budgets,
    sim_config,
    sim_stats,
    start_one_running,
    worker_dies_after_answer,
)
from tests.helpers import new_key
from tests.invariants import assert_ledger_consistent, stored_requests

# --- Message Batches -------------------------------------------------------------------------------------------


def message_entry(custom_id: str, content: str, model: str = GLM, **params) -> dict:
    return {"custom_id": custom_id, "params": {"model": model, "max_tokens": 32,
                                               "messages": [{"role": "user", "content": content}], **params}}


def submit_messages(svc, who, entries: list[dict], version: str = "2026-10-21") -> str:
    from batchinfer.operations.anthropic import message_batches

    configure(svc, message_batches_enabled=True)
    item, created = message_batches.create(svc, who, json.dumps({"requests": entries}).encode(), None, version)
    assert created and item["status"] == "in_progress"
    return item["id"]


def test_noisy_backend_message_batch_every_request_ends_and_adds_up(svc, sim_control):
    configure(svc, backend_timeout_seconds=0.3)
    sim_config(sim_control, rate_429=0.1, rate_500=0.1, rate_timeout=0.1, timeout_sleep_seconds=1, seed=11)
    _, key = new_key(svc)
    who = authenticate(svc, key)
    entries = [message_entry(f"m-{i}", f"noisy message {i}", model=GLM if i % 2 else QWEN) for i in range(30)]
    entries[4] = message_entry("m-4", "x", thinking={"type": "enabled", "budget_tokens": 1024})  # errors at intake
    entries[9] = message_entry("m-9", "x", model="no-such-model")
    batch_id = submit_messages(svc, who, entries)

    final = pump(svc, batch_id, clock_step=2)

    assert final["status"] == "completed" and final["rejected"] == 2
    assert_ledger_consistent(svc, batch_id, who, [e["custom_id"] for e in entries])
    assert len(stored_requests(svc, batch_id)) == 28  # the two rejected ones never got a request item
    assert sum(r["attempt"] > 1 for r in stored_requests(svc, batch_id)) >= 3, "the faults should force retries"


def test_worker_dying_holding_a_message_batch_group_is_recovered(svc, sim_control, monkeypatch):
    configure(svc, lease_seconds=60)
    _, key = new_key(svc)
    who = authenticate(svc, key)
    entries = [message_entry("dies", "the worker dies after this answer"), message_entry("bad", "x", model="nope"),
               message_entry("fine", "all good")]
    batch_id = submit_messages(svc, who, entries, version="2023-06-01")
    died = worker_dies_after_answer(monkeypatch, "dies")
    assert Dispatcher(svc).pass_once() == 2  # the rejected request joins no lane
    report = run_messages(svc, GLM, receive(svc, GLM))
    assert died == ["completed"] and report["failed"]
    svc.clock.advance(61)
    final = pump(svc, batch_id, clock_step=2)

    assert final["status"] == "completed" and final["completed"] == 2 and final["failed"] == 1
    assert_ledger_consistent(svc, batch_id, who, ["dies", "bad", "fine"])
    assert final["cost_unknown_attempts"] == 1
    assert sim_stats(sim_control)["total_requests"] == 3


def test_message_batch_cancelled_while_queued_and_running(svc, sim_control):
    from batchinfer.operations.anthropic import message_batches

    configure(svc, lease_seconds=3600)
    set_budgets(svc, {GLM: 3})
    _, key = new_key(svc)
    who = authenticate(svc, key)
    entries = [message_entry(f"k-{i}", f"cancel {i}") for i in range(8)] + [message_entry("bad", "x", model="nope")]
    batch_id = submit_messages(svc, who, entries)
    dispatcher = Dispatcher(svc)
    dispatcher.pass_once()
    run_queued(svc)  # k-0..k-2 succeeded
    assert dispatch_in_groups(svc, GLM, [1, 1, 1]) == [1, 1, 1]
    sim_config(sim_control, latency_seconds=0.5)
    running, running_index = start_one_running(svc, sim_control)

    canceling = message_batches.message_batch_object(message_batches.cancel(svc, who, batch_id), "")
    assert canceling["processing_status"] == "canceling"
    running.join(timeout=10)
    sim_config(sim_control, latency_seconds=0)
    final = pump(svc, batch_id)

    assert final["status"] == "cancelled"
    assert_ledger_consistent(svc, batch_id, who, [e["custom_id"] for e in entries])
    assert message_batches.request_counts(final) == {"processing": 0, "succeeded": 4, "errored": 1,
                                                     "canceled": 4, "expired": 0}
    assert sim_stats(sim_control)["total_requests"] == 4


def test_message_batch_window_closing_expires_unstarted_requests(svc, sim_control):
    from batchinfer.operations.anthropic import message_batches

    configure(svc, lease_seconds=3600)
    set_budgets(svc, {GLM: 2})
    _, key = new_key(svc)
    who = authenticate(svc, key)
    entries = [message_entry(f"x-{i}", f"expiry {i}") for i in range(6)] + [message_entry("bad", "x", model="nope")]
    batch_id = submit_messages(svc, who, entries)
    Dispatcher(svc).pass_once()
    run_queued(svc)  # x-0, x-1 succeeded
    assert dispatch_in_groups(svc, GLM, [1]) == [1]  # x-2 queued when the window closes: it never starts

    svc.clock.advance(24 * 3600 + 1)  # a Message Batch's window is always 24 hours
    final = pump(svc, batch_id)

    assert final["status"] == "expired"
    assert_ledger_consistent(svc, batch_id, who, [e["custom_id"] for e in entries])
    assert message_batches.request_counts(final) == {"processing": 0, "succeeded": 2, "errored": 1,
                                                     "canceled": 0, "expired": 4}
    assert sim_stats(sim_control)["total_requests"] == 2
