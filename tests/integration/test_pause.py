"""Pause and resume (an extension beyond the OpenAI and Anthropic APIs) as a user sees it, through the real
API handler (Mangum, API Gateway events) and the real dispatcher, worker and sweeper handlers: inline
batches, batches from a file and Message Batches."""

from __future__ import annotations

import asyncio
import datetime as dt

from batchinfer import ledger
from batchinfer.layout import batch_key
from batchinfer.records import Batch
from batchinfer.scheduling.dispatcher import Dispatcher
from batchinfer.service.accounts import authenticate
from batchinfer.service.running import run_request
from tests.helpers import (
    anthropic_error,
    chat_request,
    error,
    finish,
    new_key,
    ok,
    settings,
    sim_requests,
    step_by_record,
)
from tests.integration.test_files import create_from, jsonl, line, upload
from tests.invariants import assert_ledger_consistent, budget_of

MODEL = "glm-5.3-flash"


def pause(api, key: str, batch_id: str, what: str = "pause"):
    return api("POST", f"/v1/batches/{batch_id}/{what}", key)


def later(svc, seconds: int) -> None:
    base = svc.clock
    svc.clock = lambda: base() + seconds


def run_dispatched(svc, units: list[dict]) -> None:
    """What a worker does with each claimed unit's queue message (the messages themselves are not sent)."""
    for unit in units:
        asyncio.run(run_request.process(svc, ledger.queue_message(unit)))


def test_a_paused_batch_starts_nothing_until_resumed(api, svc, sim_control):
    _, key = new_key(svc)
    batch = api.created(key, [chat_request(f"q-{i}", f"question {i}") for i in range(4)])
    paused = ok(pause(api, key, batch["id"]))
    assert paused["status"] == batch["status"] and isinstance(paused["paused_at"], int)
    assert batch["paused_at"] is None
    for _ in range(3):
        step_by_record(svc)
    assert sim_requests(sim_control) == 0
    shown = ok(api("GET", f"/v1/batches/{batch['id']}", key))
    assert shown["paused_at"] == paused["paused_at"] and shown["status"] == batch["status"]
    assert [r["status"] for r in ok(api.results(key, batch["id"]))["data"]] == ["queued"] * 4
    # Pausing a paused batch returns it unchanged; so does resuming a running one.
    assert ok(pause(api, key, batch["id"])) == shown
    listed = ok(api("GET", "/v1/batches", key))["data"]
    assert [b["paused_at"] for b in listed] == [paused["paused_at"]]
    resumed = ok(pause(api, key, batch["id"], "resume"))
    assert resumed["paused_at"] is None
    assert ok(pause(api, key, batch["id"], "resume")) == ok(api("GET", f"/v1/batches/{batch['id']}", key))
    final = finish(svc, batch["id"])
    assert final["status"] == "completed" and sim_requests(sim_control) == 4
    assert ok(api("GET", f"/v1/batches/{batch['id']}", key))["request_counts"] == {
        "total": 4, "completed": 4, "failed": 0}
    assert_ledger_consistent(svc, batch["id"], authenticate(svc, key))


def test_dispatched_requests_go_back_to_wait_holding_no_slot_and_running_ones_finish(api, svc, sim_control):
    _, key = new_key(svc)
    batch = api.created(key, [chat_request(f"q-{i}", "Hello") for i in range(3)])
    model = svc.catalog.get(MODEL)
    dispatcher = Dispatcher(svc)
    running = ledger.start_group(svc, dispatcher.claim(model, limit=1)[0])  # a worker calls the backend for q-0
    queued = dispatcher.claim(model, limit=2)  # q-1 and q-2 hold slots, on their way to a worker
    assert budget_of(svc, MODEL)["in_flight"] == 3
    ok(pause(api, key, batch["id"]))
    run_dispatched(svc, queued)  # the worker finds the batch paused: back to waiting, slots given back
    assert budget_of(svc, MODEL)["in_flight"] == 1
    assert [r["status"] for r in ok(api.results(key, batch["id"]))["data"]] == ["running", "queued", "queued"]
    # The running request finishes and is counted.
    answer = {"status_code": 200, "request_id": "req_x", "body": {"object": "chat.completion", "usage": {}}}
    outcome = ledger.Settlement(to=ledger.RequestState.COMPLETED, input_tokens=3, output_tokens=4, response=answer)
    item = ledger.position_item(svc, running, running["positions"][0], outcome, attempt=1)
    ledger.record_position(svc, item)
    ledger.close_group(svc, running, [item])
    assert budget_of(svc, MODEL)["in_flight"] == 0
    # While paused, its waiting requests are not due: dispatchers pass it by.
    for _ in range(2):
        assert Dispatcher(svc).claim(model) == []
        step_by_record(svc)
    assert sim_requests(sim_control) == 0
    shown = ok(api("GET", f"/v1/batches/{batch['id']}", key))
    assert shown["status"] == "in_progress" and shown["request_counts"]["completed"] == 1
    ok(pause(api, key, batch["id"], "resume"))
    assert finish(svc, batch["id"])["status"] == "completed"
    assert sim_requests(sim_control) == 2
    results = ok(api.results(key, batch["id"]))["data"]
    assert [r["status"] for r in results] == ["completed"] * 3


def test_pausing_one_batch_gives_the_other_the_whole_budget(api, svc):
    """Two batches share a model; once one is paused, the other holds every slot within two passes."""
    _, key = new_key(svc, tier="internal")
    budget = svc.catalog.get(MODEL).batch_budget
    first = api.created(key, [chat_request(f"a-{i}", "Hello") for i in range(budget * 2)])
    second = api.created(key, [chat_request(f"b-{i}", "Hello") for i in range(budget * 2)])
    model = svc.catalog.get(MODEL)
    dispatcher = Dispatcher(svc)
    claimed = dispatcher.claim(model)
    held = {b["id"]: Batch.get(svc.table, b["id"])["in_flight"] for b in (first, second)}
    assert sum(held.values()) == budget and all(n > 0 for n in held.values()), held
    ok(pause(api, key, first["id"]))
    # Pass 1: the workers that receive the paused batch's groups hand their slots back.
    run_dispatched(svc, [u for u in claimed if u["batch_id"] == first["id"]])
    assert Batch.get(svc.table, first["id"])["in_flight"] == 0
    # Pass 2: the other batch takes every slot.
    more = dispatcher.claim(model)
    assert {u["batch_id"] for u in more} == {second["id"]}
    assert Batch.get(svc.table, second["id"])["in_flight"] == budget == budget_of(svc, MODEL)["in_flight"]
    assert Batch.get(svc.table, first["id"])["in_flight"] == 0
    # What the other batch was given goes to its workers. Resumed, the paused one takes turns again: both
    # end, every request once.
    svc.queues.send(MODEL, [ledger.queue_message(u) for u in claimed + more if u["batch_id"] == second["id"]])
    ok(pause(api, key, first["id"], "resume"))
    for b in (first, second):
        assert finish(svc, b["id"])["status"] == "completed"
        assert_ledger_consistent(svc, b["id"], authenticate(svc, key))


def test_refusals(api, svc):
    _, key = new_key(svc)
    _, other = new_key(svc)
    batch = api.created(key, [chat_request("a", "Hello")])
    for what in ("pause", "resume"):
        error(pause(api, other, batch["id"], what), 404, code="batch_not_found")
        error(pause(api, key, "batch_" + "0" * 32, what), 404)
    ok(pause(api, key, batch["id"]))
    ended = ok(api("POST", f"/v1/batches/{batch['id']}/cancel", key))
    assert ended["status"] == "cancelled" and ended["paused_at"] is None
    for what in ("pause", "resume"):
        error(pause(api, key, batch["id"], what), 409, "has ended (cancelled)", code="batch_ended")
    # A cancelling batch (a request still running) can be neither paused nor resumed.
    stopping = api.created(key, [chat_request("b", "Hello"), chat_request("c", "Hello")])
    ledger.start_group(svc, Dispatcher(svc).claim(svc.catalog.get(MODEL), limit=1)[0])
    assert ok(api("POST", f"/v1/batches/{stopping['id']}/cancel", key))["status"] == "cancelling"
    for what in ("pause", "resume"):
        reply = pause(api, key, stopping["id"], what)
        error(reply, 409, "cancelling", code="batch_not_running")
        assert reply.headers.get("x-should-retry") == "false"


def test_a_batch_whose_window_closes_while_paused_expires(api, svc, sim_control):
    _, key = new_key(svc)
    batch = api.created(key, [chat_request(f"q-{i}", "Hello") for i in range(3)])
    model = svc.catalog.get(MODEL)
    queued = Dispatcher(svc).claim(model, limit=1)
    ok(pause(api, key, batch["id"]))
    run_dispatched(svc, queued)  # q-0 waits, two never dispatched
    later(svc, 24 * 3600 + 1)
    final = finish(svc, batch["id"])
    assert final["status"] == "expired" and sim_requests(sim_control) == 0
    shown = ok(api("GET", f"/v1/batches/{batch['id']}", key))
    assert shown["paused_at"] is None and shown["expired_at"]
    assert [(r["status"], r["error"]["code"]) for r in ok(api.results(key, batch["id"]))["data"]] == [
        ("expired", "batch_expired")] * 3
    error(pause(api, key, batch["id"], "resume"), 409, code="batch_ended")
    assert_ledger_consistent(svc, batch["id"], authenticate(svc, key))


def test_a_file_batch_paused_while_validating_gets_its_lanes_when_resumed(api, svc, sim_control):
    settings(svc, file_batches_enabled=True)
    _, key = new_key(svc)
    uploaded = ok(upload(api, key, jsonl(*[line(f"q-{i}") for i in range(3)])))
    created = ok(create_from(api, key, uploaded["id"]))
    paused = ok(pause(api, key, created["id"]))
    assert paused["status"] == "validating" and paused["paused_at"]
    for _ in range(3):
        step_by_record(svc)  # validated by the sweeper, but not dispatched
    item = svc.table.get(*batch_key(created["id"]))
    assert not item.get("awaiting_validation") and item["total"] == 3 and sim_requests(sim_control) == 0
    ok(pause(api, key, created["id"], "resume"))
    final = finish(svc, created["id"])
    assert final["status"] == "completed" and final["output_file_id"] and sim_requests(sim_control) == 3
    assert_ledger_consistent(svc, created["id"], authenticate(svc, key))


def test_a_message_batch_pauses_and_resumes_under_both_base_urls(api, svc, sim_control):
    settings(svc, message_batches_enabled=True)
    _, key = new_key(svc)
    headers = {"anthropic-version": "2023-06-01"}

    def call(method: str, path: str = "", prefix: str = "/anthropic", **kwargs):
        return api(method, f"{prefix}/v1/messages/batches{path}", key, header="x-api-key", headers=headers,
                   **kwargs)

    requests = [{"custom_id": f"m-{i}", "params": {"model": MODEL, "max_tokens": 16,
                                                  "messages": [{"role": "user", "content": f"hi {i}"}]}}
                for i in range(3)]
    batch = ok(call("POST", json_body={"requests": requests}))
    assert batch["paused_at"] is None
    paused = ok(call("POST", f"/{batch['id']}/pause", prefix=""))
    assert paused["processing_status"] == "in_progress"
    at = dt.datetime.strptime(paused["paused_at"], "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=dt.UTC)
    assert abs(at.timestamp() - svc.now()) < 5
    assert ok(call("POST", f"/{batch['id']}/pause")) == paused
    for _ in range(2):
        step_by_record(svc)
    assert sim_requests(sim_control) == 0
    # An OpenAI-shaped batch reads as not found here, and a Message Batch on /v1/batches.
    inline = api.created(key, [chat_request("x", "Hello")])
    anthropic_error(call("POST", f"/{inline['id']}/pause"), 404, "not_found_error")
    error(pause(api, key, batch["id"]), 404)
    resumed = ok(call("POST", f"/{batch['id']}/resume"))
    assert resumed["paused_at"] is None
    assert finish(svc, batch["id"])["status"] == "completed"
    ended = ok(call("GET", f"/{batch['id']}"))
    assert ended["processing_status"] == "ended" and ended["request_counts"]["succeeded"] == 3
    anthropic_error(call("POST", f"/{batch['id']}/pause"), 409, "conflict_error", "has ended")
    assert_ledger_consistent(svc, batch["id"], authenticate(svc, key))
