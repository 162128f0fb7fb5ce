"""A batch's priority changed while its lanes are being made or are away: a file batch still validating, a
paused batch (its lanes removed until the resume), a resume racing the change. The change is neither lost (the
lanes the scheduler reads carry it) nor refused."""

from __future__ import annotations

from batchinfer.records import Batch
from batchinfer.service.creating import intake
from batchinfer.service.steering import pausing, priority
from tests.helpers import chat_request, finish, new_key, ok, settings
from tests.integration.test_files import create_from, jsonl, line, upload
from tests.integration.test_priority import lane_priorities


def set_priority(api, key: str, batch_id: str, priority: str):
    return api("POST", f"/v1/batches/{batch_id}/priority", key, json_body={"priority": priority})


def test_a_change_while_the_file_is_being_checked_reaches_the_lanes(api, svc, monkeypatch):
    """The sweeper read the batch (priority low) and checks its lines; the change to high commits before the
    sweeper writes the lanes: they are made with high, not with the low it had read."""
    settings(svc, file_batches_enabled=True)
    _, key = new_key(svc)
    uploaded = ok(upload(api, key, jsonl(line("a"), line("b"))))
    created = ok(create_from(api, key, uploaded["id"], priority="low"))
    real = intake.write_requests

    def changed_meanwhile(*args, **kwargs):
        assert ok(set_priority(api, key, created["id"], "high"))["priority"] == "high"
        return real(*args, **kwargs)

    monkeypatch.setattr(intake, "write_requests", changed_meanwhile)
    assert intake.validate_file_batch(svc, Batch.get(svc.table, created["id"])) == "validated"
    assert lane_priorities(svc) == {created["id"]: "high"}
    assert ok(api("GET", f"/v1/batches/{created['id']}", key))["priority"] == "high"
    assert finish(svc, created["id"])["status"] == "completed"


def test_a_file_batch_paused_while_validating_takes_a_change_and_its_lanes_carry_it(api, svc):
    settings(svc, file_batches_enabled=True)
    _, key = new_key(svc)
    uploaded = ok(upload(api, key, jsonl(line("a"), line("b"))))
    created = ok(create_from(api, key, uploaded["id"]))
    ok(api("POST", f"/v1/batches/{created['id']}/pause", key))
    assert intake.validate_file_batch(svc, Batch.get(svc.table, created["id"])) == "validated"
    assert ok(set_priority(api, key, created["id"], "low"))["priority"] == "low"  # paused: no lane to change
    ok(api("POST", f"/v1/batches/{created['id']}/resume", key))
    assert lane_priorities(svc) == {created["id"]: "low"}
    assert finish(svc, created["id"])["status"] == "completed"


def test_a_change_racing_a_resume_reaches_the_lanes_the_resume_makes(api, svc, monkeypatch):
    _, key = new_key(svc)
    batch = api.created(key, [chat_request("a", "Hello"), chat_request("b", "Hello")])
    ok(api("POST", f"/v1/batches/{batch['id']}/pause", key))
    assert lane_priorities(svc) == {}
    real = pausing._change
    raced = []

    def changed_meanwhile(svc_, read, what, writes):
        if what == "resumed" and not raced:  # the resume read the batch; the change commits first
            raced.append(priority.change(svc, Batch.get(svc.table, batch["id"]), "high"))  # what the route calls
        return real(svc_, read, what, writes)

    monkeypatch.setattr(pausing, "_change", changed_meanwhile)
    assert ok(api("POST", f"/v1/batches/{batch['id']}/resume", key))["priority"] == "high"
    assert raced and lane_priorities(svc) == {batch["id"]: "high"}
    assert finish(svc, batch["id"])["status"] == "completed"
