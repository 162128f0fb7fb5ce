"""Retry in place (an extension): an ended batch runs again the requests of it that did not succeed, keeping
every success, through the HTTP API of each batch kind (inline, file, Message Batch)."""

from __future__ import annotations

import json

import pytest

from batchinfer.layout import batch_key
from batchinfer.service.accounts import authenticate
from batchinfer.service.steering import retry as retry_module
from local.lambda_runtime import invoke
from tests.helpers import (
    anthropic_error,
    error,
    finish,
    new_key,
    ok,
    req,
    services_in_use,
    settings,
    sim_requests,
    step_by_record,
    tick,
)
from tests.integration.test_files import content, create_from, jsonl, line, upload
from tests.integration.test_message_batches import (
    Messages,
    catalog_file,  # noqa: F401  (a fixture)
    entry,
)
from tests.invariants import assert_ledger_consistent

FLAKY = "[[sim:flaky:1:500]] once"  # fails the first time this exact body is sent, then answers


def retry(api, key: str, batch_id: str, body: object = None, idem: str | None = None):
    headers = {"idempotency-key": idem} if idem else {}
    kwargs = {} if body is None else {"json_body": body}
    return api("POST", f"/v1/batches/{batch_id}/retry", key, headers=headers, **kwargs)


def by_id(api, key: str, batch_id: str) -> dict[str, dict]:
    return {r["custom_id"]: r for r in ok(api.results(key, batch_id))["data"]}


def test_a_retry_runs_again_what_failed_and_keeps_every_success(api, svc, sim_control):
    settings(svc, max_attempts=1)  # a backend error fails the request at once
    _, key = new_key(svc)
    batch = api.created(key, [req("ok"), req("flaky", FLAKY), req("bad", "[[sim:400]]")])
    first = finish(svc, batch["id"])
    assert (first["status"], first["completed"], first["failed"]) == ("completed", 1, 2)
    before = by_id(api, key, batch["id"])
    assert before["flaky"]["error"]["code"] == "upstream_error"
    sent = sim_requests(sim_control)
    usage = ok(api("GET", f"/v1/batches/{batch['id']}", key))["usage"]

    now = svc.now()
    again = ok(retry(api, key, batch["id"]))
    assert again["status"] == "in_progress" and again["retry_count"] == 1
    assert again["expires_at"] >= now + 86400 and again["completed_at"] is None
    assert again["results_expires_at"] is None and again["finalizing_at"] is None
    # The invalid request is final for its input: not retried unless named.
    assert again["request_counts"] == {"total": 3, "completed": 1, "failed": 1}
    during = by_id(api, key, batch["id"])
    assert during["ok"] == before["ok"]
    assert (during["flaky"]["status"], during["flaky"]["error"]) == ("queued", None)
    assert during["bad"] == before["bad"]
    error(retry(api, key, batch["id"]), 409, "has not ended", code="batch_not_ended")

    final = finish(svc, batch["id"])
    assert final["status"] == "completed" and final["retry_count"] == 1
    assert sim_requests(sim_control) == sent + 1  # only the one retried ran again
    after = by_id(api, key, batch["id"])
    assert after["ok"] == before["ok"] and after["flaky"]["status"] == "completed"
    shown = ok(api("GET", f"/v1/batches/{batch['id']}", key))
    assert shown["request_counts"] == {"total": 3, "completed": 2, "failed": 1}
    assert shown["usage"]["input_tokens"] > usage["input_tokens"]  # usage and cost keep adding up
    assert shown["completed_at"] >= now and shown["results_expires_at"]
    who = authenticate(svc, key)
    assert_ledger_consistent(svc, batch["id"], who, ["ok", "flaky", "bad"])

    # Nothing left but the invalid request: the default takes nothing; naming its code takes it.
    error(retry(api, key, batch["id"]), 400, "No request", code="nothing_to_retry")
    error(retry(api, key, batch["id"], {"custom_ids": ["ok"]}), 400, "custom_ids=['ok']", param="custom_ids")
    error(retry(api, key, batch["id"], {"statuses": ["finished"]}), 400, param="statuses.0")
    error(retry(api, key, batch["id"], {"colour": "red"}), 400)
    named = ok(retry(api, key, batch["id"], {"error_codes": ["invalid_request"]}))
    assert named["retry_count"] == 2 and named["request_counts"] == {"total": 3, "completed": 2, "failed": 0}
    final = finish(svc, batch["id"])
    assert (final["status"], final["completed"], final["failed"]) == ("completed", 2, 1)
    assert_ledger_consistent(svc, batch["id"], who, ["ok", "flaky", "bad"])

    # Another account's batch is not found; an unknown one neither.
    _, other = new_key(svc)
    error(retry(api, other, batch["id"]), 404)
    error(retry(api, key, "batch_" + "0" * 32), 404)


def test_a_retried_run_is_served_by_one_worker_pulling_the_model_budget(api, svc, sim_control):
    """Where workers pull work, the retried requests are not sent one message each: one of them starts a
    worker whose pump claims the others; the user sees every retried request complete, its earlier failure
    replaced, and counts that add up at every read."""
    settings(svc, max_attempts=1, worker_pull=True)
    _, key = new_key(svc)
    ids = [f"f-{i}" for i in range(8)]
    batch = api.created(key, [req(c, f"{FLAKY} {c}") for c in ids] + [req("ok")])
    first = finish(svc, batch["id"])
    assert (first["completed"], first["failed"]) == (1, 8)

    again = ok(retry(api, key, batch["id"]))
    assert again["request_counts"] == {"total": 9, "completed": 1, "failed": 0}
    from batchinfer.scheduling.dispatcher import Dispatcher
    assert Dispatcher(svc).pass_once() == 1  # one message: its worker's pump claims the other seven
    step_by_record(svc)
    during = ok(api("GET", f"/v1/batches/{batch['id']}", key))["request_counts"]
    assert during["total"] == 9 and during["failed"] == 0 and 1 <= during["completed"] <= 9
    final = finish(svc, batch["id"])
    assert (final["status"], final["completed"], final["failed"]) == ("completed", 9, 0)
    results = by_id(api, key, batch["id"])
    assert all(results[c]["status"] == "completed" and results[c]["error"] is None for c in ids)
    assert ok(api("GET", f"/v1/batches/{batch['id']}", key))["request_counts"] == {
        "total": 9, "completed": 9, "failed": 0}
    assert_ledger_consistent(svc, batch["id"], authenticate(svc, key), ids + ["ok"])


def test_a_large_retry_answers_at_once_and_the_sweeper_finishes_re_queueing(api, svc, monkeypatch):
    """The call re-queues for a few seconds at most (CALL_SECONDS; none here) and answers; the sweeper carries
    the walk on a page at a time, and the batch does not end before the walk is over."""
    settings(svc, max_attempts=1)
    monkeypatch.setattr(retry_module, "RETRY_PAGE", 4)
    monkeypatch.setattr(retry_module, "CALL_SECONDS", 0.0)
    _, key = new_key(svc)
    ids = [f"f-{i}" for i in range(12)]
    batch = api.created(key, [req(c, f"[[sim:flaky:1:500]] {c}") for c in ids] + [req("ok")])
    finish(svc, batch["id"])
    again = ok(retry(api, key, batch["id"]))
    assert again["status"] == "in_progress" and again["request_counts"]["failed"] == 12  # nothing moved yet
    assert svc.table.get(*batch_key(batch["id"]))["retrying"]["n"] == 1
    invoke("sweeper", {})
    walked = svc.table.get(*batch_key(batch["id"]))
    assert "retrying" not in walked and (walked["failed"], walked["open"]) == (0, 12)
    final = finish(svc, batch["id"])
    assert final["status"] == "completed" and final["completed"] == 13
    assert_ledger_consistent(svc, batch["id"], authenticate(svc, key), ids + ["ok"])


def test_every_success_is_kept_and_nothing_to_retry_is_a_400(api, svc):
    _, key = new_key(svc)
    batch = api.created(key, [req("a"), req("b")])
    finish(svc, batch["id"])
    error(retry(api, key, batch["id"]), 400, "succeeded", code="nothing_to_retry")


def test_an_expired_batch_runs_its_never_started_requests_again_by_their_lanes(api, svc, sim_control):
    _, key = new_key(svc)
    batch = api.created(key, [req("a"), req("b", model="qwen3.6-35b"), req("c")])
    tick(svc, 86400)  # the window closes before anything started
    expired = finish(svc, batch["id"])
    assert expired["status"] == "expired" and sim_requests(sim_control) == 0
    # Never-dispatched requests read as expired: a filter for failed ones takes none of them.
    error(retry(api, key, batch["id"], {"statuses": ["failed"]}), 400, "statuses=['failed']", param="statuses")
    error(retry(api, key, batch["id"], {"custom_ids": ["nobody"]}), 400, param="custom_ids")
    again = ok(retry(api, key, batch["id"], {"error_codes": ["batch_expired"], "statuses": ["expired"]}))
    assert again["status"] == "in_progress" and again["expired_at"] is None
    assert again["request_counts"] == {"total": 3, "completed": 0, "failed": 0}
    assert [r["status"] for r in ok(api.results(key, batch["id"]))["data"]] == ["queued"] * 3
    final = finish(svc, batch["id"])
    assert final["status"] == "completed" and final["completed"] == 3 and sim_requests(sim_control) == 3
    assert_ledger_consistent(svc, batch["id"], authenticate(svc, key), ["a", "b", "c"])


def test_a_retry_that_leaves_never_started_requests_keeps_their_fate(api, svc, sim_control):
    """A cancelled batch of which one request ran and failed: retrying only the failed one leaves the never
    started ones cancelled, and the batch ends cancelled again once the retried one has run."""
    settings(svc, max_attempts=1)
    _, key = new_key(svc, tier="free")  # 8 requests in flight at most: one round runs 8 of them
    batch = api.created(key, [req("flaky", FLAKY)] + [req(f"n-{i}") for i in range(30)])
    step_by_record(svc)
    ok(api("POST", f"/v1/batches/{batch['id']}/cancel", key))
    cancelled = finish(svc, batch["id"])
    assert cancelled["status"] == "cancelled"
    results = by_id(api, key, batch["id"])
    assert results["flaky"]["status"] == "failed"
    never = [c for c, r in results.items() if r["status"] == "cancelled"]
    assert never, "every request ran before the cancel"
    again = ok(retry(api, key, batch["id"], {"statuses": ["failed"]}))
    assert again["status"] == "in_progress"
    during = by_id(api, key, batch["id"])
    assert during["flaky"]["status"] == "queued" and all(during[c]["status"] == "cancelled" for c in never)
    final = finish(svc, batch["id"])
    assert final["status"] == "cancelled" and by_id(api, key, batch["id"])["flaky"]["status"] == "completed"
    assert_ledger_consistent(svc, batch["id"], authenticate(svc, key), ["flaky"] + [f"n-{i}" for i in range(30)])
    # A later retry without a filter takes the cancelled ones back with their lanes.
    ok(retry(api, key, batch["id"]))
    final = finish(svc, batch["id"])
    assert final["status"] == "completed" and final["completed"] == 31
    assert_ledger_consistent(svc, batch["id"], authenticate(svc, key), ["flaky"] + [f"n-{i}" for i in range(30)])


def test_the_idempotency_key_of_a_retry(api, svc):
    settings(svc, max_attempts=1)
    _, key = new_key(svc)
    batch = api.created(key, [req("flaky", FLAKY)], idem="create-1")
    finish(svc, batch["id"])
    first = retry(api, key, batch["id"], idem="retry-1")
    assert first.status == 200 and "idempotent-replayed" not in first.headers
    finish(svc, batch["id"])
    replayed = retry(api, key, batch["id"], idem="retry-1")
    assert replayed.status == 200 and replayed.headers["idempotent-replayed"] == "true"
    assert replayed.json()["retry_count"] == 1 and replayed.json()["status"] == "completed"
    error(retry(api, key, batch["id"], {"statuses": ["failed"]}, idem="retry-1"), 409, code="idempotency_key_reused")
    # The create's own key still answers with the batch.
    assert ok(api.create(key, [req("flaky", FLAKY)], idem="create-1"))["id"] == batch["id"]


def test_a_file_batch_writes_new_result_files_and_deletes_the_old_ones(api, svc):
    settings(svc, file_batches_enabled=True, max_attempts=1)
    _, key = new_key(svc)
    uploaded = ok(upload(api, key, jsonl(line("a"), line("flaky", FLAKY), line("b"))))
    created = ok(create_from(api, key, uploaded["id"]))
    first = finish(svc, created["id"])
    assert first["output_file_id"] and first["error_file_id"]
    errors = [json.loads(x) for x in content(api, key, first["error_file_id"])[0].splitlines()]
    assert [e["custom_id"] for e in errors] == ["flaky"]
    again = ok(retry(api, key, created["id"]))
    assert again["status"] == "in_progress" and again["output_file_id"] is None and again["error_file_id"] is None
    for old in (first["output_file_id"], first["error_file_id"]):
        error(api("GET", f"/v1/files/{old}", key), 404)
        error(api("GET", f"/v1/files/{old}/content", key), 404)
    final = finish(svc, created["id"])
    assert final["status"] == "completed" and final["error_file_id"] is None
    assert final["output_file_id"] not in (first["output_file_id"], first["error_file_id"])
    outputs = [json.loads(x) for x in content(api, key, final["output_file_id"])[0].splitlines()]
    assert sorted(o["custom_id"] for o in outputs) == ["a", "b", "flaky"]
    assert_ledger_consistent(svc, created["id"], authenticate(svc, key), ["a", "flaky", "b"])


def test_the_completion_webhook_fires_again_with_a_new_event(api, svc, receiver):
    settings(svc, batch_webhooks_enabled=True, webhook_allow_loopback=True, max_attempts=1)
    _, key = new_key(svc)
    ok(api("PUT", "/v1/batch_webhook", key, json_body={"url": receiver.url("/hook")}))
    batch = api.created(key, [req("flaky", FLAKY)])
    finish(svc, batch["id"])
    ok(retry(api, key, batch["id"]))
    finish(svc, batch["id"])
    events = [e for e in ok(api("GET", "/v1/batch_webhook/events", key))["data"] if e["data"]["id"] == batch["id"]]
    assert len(events) == 2 and events[0]["id"] != events[1]["id"]
    assert {e["type"] for e in events} == {"batch.completed"}


@pytest.fixture
def messages(api, svc, sim, catalog_file):  # noqa: F811
    with services_in_use(svc, sim.url, "msg", models_file=str(catalog_file), message_batches_enabled=True,
                         max_attempts=1) as services:
        _, key = new_key(services)
        yield Messages(api, key), services


def test_a_message_batch_is_retried_in_place(messages, svc):
    client, services = messages
    created = ok(client.create([entry("ok"), entry("flaky", FLAKY)]))
    finish(services, created["id"])
    ended = ok(client("GET", f"/{created['id']}"))
    assert ended["processing_status"] == "ended" and ended["request_counts"]["errored"] == 1
    anthropic_error(client("POST", f"/{created['id']}/retry", json_body={"statuses": ["failed"]}), 400,
                    "invalid_request_error", "statuses")
    anthropic_error(client("POST", f"/{created['id']}/retry", json_body={"statuses": ["canceled"]}), 400,
                    "invalid_request_error", "No request")
    again = ok(client("POST", f"/{created['id']}/retry", json_body={"statuses": ["errored"]}))
    assert again["processing_status"] == "in_progress" and again["retry_count"] == 1
    assert again["results_url"] is None and again["ended_at"] is None
    anthropic_error(client("POST", f"/{created['id']}/retry"), 409, "conflict_error", "has not ended")
    finish(services, created["id"])
    final = ok(client("GET", f"/{created['id']}"))
    assert final["processing_status"] == "ended" and final["results_url"]
    assert final["request_counts"] == {"processing": 0, "succeeded": 2, "errored": 0, "canceled": 0, "expired": 0}
    assert [r["result"]["type"] for r in client.results(created["id"])] == ["succeeded", "succeeded"]
    batch = services.table.get(*batch_key(created["id"]))
    assert batch["retry_count"] == 1
    assert_ledger_consistent(services, created["id"], authenticate(services, client.key), ["ok", "flaky"])
    # The same route under the service's own base URL.
    plain = Messages(client.api, client.key, prefix="")
    anthropic_error(plain("POST", f"/{created['id']}/retry"), 400, "invalid_request_error", "succeeded")
