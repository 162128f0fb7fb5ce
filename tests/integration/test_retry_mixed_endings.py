"""Retries that reach requests a cancel or an expiry left before they were dispatched (no request item of
their own): named by custom id, on inline, file and Message Batches; and batches whose requests ended in more
than one way (cancelled, retried for the failed one, then expired), each request counted as it ended."""

from __future__ import annotations

import pytest

from batchinfer.service.accounts import authenticate
from tests.helpers import error, finish, new_key, ok, req, services_in_use, settings, step_by_record, tick
from tests.integration.test_files import create_from, jsonl, line, upload
from tests.integration.test_message_batches import (
    Messages,
    catalog_file,  # noqa: F401  (a fixture)
    entry,
)
from tests.integration.test_retry import FLAKY, by_id, retry
from tests.invariants import assert_ledger_consistent

IDS = ["flaky"] + [f"n-{i}" for i in range(30)]


@pytest.fixture
def messages(api, svc, sim, catalog_file):  # noqa: F811
    with services_in_use(svc, sim.url, "mixed", models_file=str(catalog_file), message_batches_enabled=True,
                         max_attempts=1) as services:
        _, key = new_key(services, tier="free")  # 8 requests in flight at most: one round runs 8 of them
        yield Messages(api, key), services


def cancelled_with_one_failed(client: Messages, services) -> tuple[dict, list[str]]:
    """A Message Batch cancelled after one round: `flaky` errored, some never started (canceled)."""
    created = ok(client.create([entry("flaky", FLAKY)] + [entry(c) for c in IDS[1:]]))
    step_by_record(services)
    ok(client("POST", f"/{created['id']}/cancel"))
    finish(services, created["id"])
    types = {r["custom_id"]: r["result"]["type"] for r in client.results(created["id"])}
    assert types["flaky"] == "errored"
    never = [c for c, t in types.items() if t == "canceled"]
    assert never, "every request ran before the cancel"
    return created, never


def test_a_message_batch_cancelled_then_expired_counts_each_request_as_it_ended(messages):
    client, services = messages
    created, never = cancelled_with_one_failed(client, services)
    again = ok(client("POST", f"/{created['id']}/retry", json_body={"statuses": ["errored"]}))
    assert again["processing_status"] == "in_progress"
    tick(services, 86400 + 1)  # the new window closes before the retried request runs
    finish(services, created["id"])
    ended = ok(client("GET", f"/{created['id']}"))
    types = {r["custom_id"]: r["result"]["type"] for r in client.results(created["id"])}
    assert types["flaky"] == "expired" and all(types[c] == "canceled" for c in never)
    assert ended["request_counts"] == {"processing": 0, "succeeded": len(IDS) - 1 - len(never), "errored": 0,
                                       "canceled": len(never), "expired": 1}
    assert_ledger_consistent(services, created["id"], authenticate(services, client.key), IDS)


def cancelled_early(api, svc, key: str, file: bool = False) -> tuple[dict, list[str]]:
    """A batch cancelled after one round of 8 requests (a free key): the rest were never dispatched."""
    if file:
        uploaded = ok(upload(api, key, jsonl(*[line(c) for c in IDS[1:]])))
        batch = ok(create_from(api, key, uploaded["id"]))
        step_by_record(svc)  # validated
    else:
        batch = api.created(key, [req(c) for c in IDS[1:]])
    step_by_record(svc)
    ok(api("POST", f"/v1/batches/{batch['id']}/cancel", key))
    assert finish(svc, batch["id"])["status"] == "cancelled"
    never = [c for c, r in by_id(api, key, batch["id"]).items() if r["status"] == "cancelled"]
    assert len(never) >= 10, "most requests should not have been dispatched"
    return batch, never


@pytest.mark.parametrize("file", [False, True], ids=["inline", "file"])
def test_custom_ids_reach_requests_never_dispatched(api, svc, sim_control, file):
    settings(svc, file_batches_enabled=True)
    _, key = new_key(svc, tier="free")
    batch, never = cancelled_early(api, svc, key, file)
    named = [never[0], never[-1]]
    again = ok(retry(api, key, batch["id"], {"custom_ids": named}))
    assert again["status"] == "in_progress" and again["request_counts"]["failed"] == 0
    during = by_id(api, key, batch["id"])
    assert [during[c]["status"] for c in named] == ["queued"] * 2
    assert all(during[c]["status"] == "cancelled" for c in never if c not in named)
    final = finish(svc, batch["id"])
    assert final["status"] == "cancelled"  # the requests it left keep their fate, and so does the batch
    after = by_id(api, key, batch["id"])
    assert [after[c]["status"] for c in named] == ["completed"] * 2
    assert sum(r["status"] == "cancelled" for r in after.values()) == len(never) - 2
    assert_ledger_consistent(svc, batch["id"], authenticate(svc, key), IDS[1:])
    # With a status too, and again by name: a later retry without a filter takes all the rest.
    ok(retry(api, key, batch["id"], {"custom_ids": [never[1]], "statuses": ["cancelled"]}))
    assert by_id(api, key, batch["id"])[never[1]]["status"] == "queued"
    finish(svc, batch["id"])
    ok(retry(api, key, batch["id"]))
    final = finish(svc, batch["id"])
    assert final["status"] == "completed" and final["completed"] == len(IDS) - 1
    assert_ledger_consistent(svc, batch["id"], authenticate(svc, key), IDS[1:])


def test_custom_ids_reach_requests_an_expiry_left_undispatched(api, svc):
    _, key = new_key(svc)
    batch = api.created(key, [req("a"), req("b", model="qwen3.6-35b"), req("c")])
    tick(svc, 86400)  # the window closes before anything started
    assert finish(svc, batch["id"])["status"] == "expired"
    error(retry(api, key, batch["id"], {"custom_ids": ["b"], "statuses": ["failed"]}), 400, param="custom_ids")
    again = ok(retry(api, key, batch["id"], {"custom_ids": ["b"], "statuses": ["expired"]}))
    assert again["request_counts"] == {"total": 3, "completed": 0, "failed": 2}
    assert [r["status"] for r in ok(api.results(key, batch["id"]))["data"]] == ["expired", "queued", "expired"]
    final = finish(svc, batch["id"])
    assert final["status"] == "expired" and final["completed"] == 1
    assert [r["status"] for r in ok(api.results(key, batch["id"]))["data"]] == ["expired", "completed", "expired"]
    assert_ledger_consistent(svc, batch["id"], authenticate(svc, key), ["a", "b", "c"])


def test_a_message_batch_retries_a_never_dispatched_request_by_custom_id(messages):
    client, services = messages
    created, never = cancelled_with_one_failed(client, services)
    again = ok(client("POST", f"/{created['id']}/retry", json_body={"custom_ids": [never[0]]}))
    assert again["processing_status"] == "in_progress"
    finish(services, created["id"])
    ended = ok(client("GET", f"/{created['id']}"))
    types = {r["custom_id"]: r["result"]["type"] for r in client.results(created["id"])}
    assert types[never[0]] == "succeeded" and types["flaky"] == "errored"
    assert all(types[c] == "canceled" for c in never[1:])
    assert ended["request_counts"] == {"processing": 0, "succeeded": len(IDS) - len(never), "errored": 1,
                                       "canceled": len(never) - 1, "expired": 0}
    assert_ledger_consistent(services, created["id"], authenticate(services, client.key), IDS)


def test_a_large_batch_files_its_never_dispatched_requests_over_several_calls(api, svc, monkeypatch):
    """Naming never-dispatched requests first gives each of them a request item, a page at a time: a call that
    runs out of time (CALL_SECONDS; none here) answers 409 `batch_busy` and the next one goes on, each page
    once; the retry is made by the call that finishes."""
    from batchinfer.service.steering import never_dispatched
    monkeypatch.setattr(never_dispatched, "FILE_PAGE", 4)
    monkeypatch.setattr(never_dispatched, "CALL_SECONDS", 0.0)
    _, key = new_key(svc)
    ids = [f"e-{i}" for i in range(10)]
    batch = api.created(key, [req(c) for c in ids])
    tick(svc, 86400)
    assert finish(svc, batch["id"])["status"] == "expired"
    refusals = 0
    while (reply := retry(api, key, batch["id"], {"custom_ids": ["e-9"]})).status == 409:
        error(reply, 409, "call again", code="batch_busy")
        refusals += 1
    assert refusals == 2 and ok(reply)["status"] == "in_progress"
    assert [r["status"] for r in ok(api.results(key, batch["id"]))["data"]] == ["expired"] * 9 + ["queued"]
    final = finish(svc, batch["id"])
    assert final["status"] == "expired" and final["completed"] == 1
    assert_ledger_consistent(svc, batch["id"], authenticate(svc, key), ids)


def test_a_later_retry_keeps_the_fate_of_the_never_dispatched_requests_filed_by_an_earlier_one(api, svc):
    """Cancelled with most requests never dispatched, retried by custom id (which stores every never-dispatched
    request as an unstarted item, with the cancel's fate), then retried again naming another: the second run
    ends without a stop of its own, and the requests neither retry took still show as cancelled, and so does
    the batch."""
    _, key = new_key(svc, tier="free")
    batch, never = cancelled_early(api, svc, key)
    ok(retry(api, key, batch["id"], {"custom_ids": [never[0], never[1]]}))
    assert finish(svc, batch["id"])["status"] == "cancelled"
    ok(retry(api, key, batch["id"], {"custom_ids": [never[2]]}))
    final = finish(svc, batch["id"])
    assert final["status"] == "cancelled"
    shown = ok(api("GET", f"/v1/batches/{batch['id']}", key))
    assert shown["status"] == "cancelled" and shown["cancelled_at"] is not None
    assert shown["request_counts"] == {"total": len(IDS) - 1, "completed": len(IDS) - 1 - (len(never) - 3),
                                       "failed": 0}
    after = by_id(api, key, batch["id"])
    assert [after[c]["status"] for c in never[:3]] == ["completed"] * 3
    assert all(after[c]["status"] == "cancelled" for c in never[3:])
    assert_ledger_consistent(svc, batch["id"], authenticate(svc, key), IDS[1:])


def test_a_later_retry_of_a_message_batch_keeps_its_filed_never_dispatched_requests_canceled(messages):
    client, services = messages
    created, never = cancelled_with_one_failed(client, services)
    ok(client("POST", f"/{created['id']}/retry", json_body={"custom_ids": [never[0]]}))
    finish(services, created["id"])
    ok(client("POST", f"/{created['id']}/retry", json_body={"custom_ids": ["flaky", never[1]]}))
    finish(services, created["id"])
    ended = ok(client("GET", f"/{created['id']}"))
    assert ended["processing_status"] == "ended"
    types = {r["custom_id"]: r["result"]["type"] for r in client.results(created["id"])}
    assert types[never[0]] == types[never[1]] == "succeeded"
    assert all(types[c] == "canceled" for c in never[2:])
    assert types["flaky"] == "succeeded"  # it fails once only
    assert ended["request_counts"] == {"processing": 0, "succeeded": len(IDS) - len(never) + 2,
                                       "errored": 0, "canceled": len(never) - 2, "expired": 0}
    assert_ledger_consistent(services, created["id"], authenticate(services, client.key), IDS)
