"""The OpenAI-shaped batch API as a user sees it: cancelling and deleting a batch, the extensions that are
off, unknown routes and unavailability answered as JSON, trailing slashes and query parameters. Driven through
the real API Lambda handler (Mangum) with API Gateway HTTP API (2.0) events, on in-process moto and the simulated
backend."""

from __future__ import annotations

import json

from batchinfer import ledger
from batchinfer.api.app import create_app
from batchinfer.layout import batch_key
from batchinfer.scheduling.dispatcher import Dispatcher
from batchinfer.service.background.sweep import sweep_once
from tests.helpers import (
    SPEC_BATCH_FIELDS,
    anthropic_error,
    error,
    finish,
    new_key,
    no_batches,
    ok,
    req,
    s3_keys,
    settings,
    sim_requests,
    step_by_record,
)

# --- Cancel ------------------------------------------------------------------------------------------

def test_cancel_with_nothing_running(api, svc, sim_control):
    _, key = new_key(svc)
    batch = api.created(key, [req("a"), req("b", model="qwen3.6-35b")])
    # The OpenAI SDK sends the cancel with `content-type: application/json` and no body.
    reply = api("POST", f"/v1/batches/{batch['id']}/cancel", key,
                headers={"content-type": "application/json", "content-length": "0"})
    assert "body" not in api.events[-1]
    cancelled = ok(reply)
    assert set(cancelled) == SPEC_BATCH_FIELDS
    assert cancelled["status"] == "cancelled"
    assert cancelled["cancelling_at"] and cancelled["cancelled_at"] and cancelled["results_expires_at"]
    assert cancelled["request_counts"] == {"total": 2, "completed": 0, "failed": 0}
    data = ok(api.results(key, batch["id"]))["data"]
    assert [(r["status"], r["response"], r["error"]) for r in data] == [("cancelled", None, None)] * 2
    lines = api("GET", f"/v1/batches/{batch['id']}/output.jsonl", key)
    assert lines.status == 200
    assert [json.loads(line) for line in lines.text.splitlines()] == [
        {"id": "batch_req_1", "custom_id": "a", "response": None, "error": None},
        {"id": "batch_req_2", "custom_id": "b", "response": None, "error": None}]
    step_by_record(svc)  # nothing runs afterwards
    assert sim_requests(sim_control) == 0
    assert ok(api("GET", f"/v1/batches/{batch['id']}", key)) == cancelled
    assert ok(api("POST", f"/v1/batches/{batch['id']}/cancel", key)) == cancelled  # again: unchanged
    # A JSON body is accepted too.
    other = api.created(key, [req("c")])
    assert ok(api("POST", f"/v1/batches/{other['id']}/cancel", key, json_body={}))["status"] == "cancelled"


def test_cancel_and_delete_while_a_request_is_running(api, svc):
    _, key = new_key(svc)
    batch = api.created(key, [req("a"), req("b")])
    bid = batch["id"]
    dispatcher = Dispatcher(svc)
    model = svc.catalog.get("glm-5.3-flash")
    first, second = (dispatcher.claim(model, limit=1)[0] for _ in range(2))  # two groups of one request
    svc.queues.send(model.id, [ledger.queue_message(second)])
    running = ledger.start_group(svc, first)  # a worker is calling the backend for "a"
    assert [r["status"] for r in ok(api.results(key, bid))["data"]] == ["running", "queued"]
    error(api("DELETE", f"/v1/batches/{bid}", key), 409, "still running", code="batch_running")
    cancelling = ok(api("POST", f"/v1/batches/{bid}/cancel", key))
    assert cancelling["status"] == "cancelling" and cancelling["cancelling_at"] and not cancelling["cancelled_at"]
    error(api("DELETE", f"/v1/batches/{bid}", key), 409, "Cancel the batch")
    error(api("GET", f"/v1/batches/{bid}/output.jsonl", key), 409)
    assert ok(api("GET", f"/v1/batches/{bid}", key))["status"] == "cancelling"
    # The running request finishes and keeps its result; the other one never starts.
    answer = {"status_code": 200, "request_id": "req_x", "body": {"object": "chat.completion"}}
    outcome = ledger.Settlement(to=ledger.RequestState.COMPLETED, input_tokens=3, output_tokens=4, response=answer)
    item = ledger.position_item(svc, running, running["positions"][0], outcome, attempt=1)
    ledger.record_position(svc, item)
    ledger.close_group(svc, running, [item])
    step_by_record(svc)
    sweep_once(svc)
    final = ok(api("GET", f"/v1/batches/{bid}", key))
    assert final["status"] == "cancelled" and final["request_counts"] == {"total": 2, "completed": 1, "failed": 0}
    assert final["usage"] == {"input_tokens": 3, "output_tokens": 4, "total_tokens": 7}
    assert [r["status"] for r in ok(api.results(key, bid))["data"]] == ["completed", "cancelled"]
    assert ok(api("DELETE", f"/v1/batches/{bid}", key))["deleted"] is True


# --- Delete ------------------------------------------------------------------------------------------

def test_delete(api, svc, sim_control):
    _, key = new_key(svc)
    keep = api.created(key, [req("k")])
    batch = api.created(key, [req("a")])
    finish(svc, batch["id"])
    calls = sim_requests(sim_control)
    reply = api("DELETE", f"/v1/batches/{batch['id']}", key, headers={"content-type": "application/json"})
    assert ok(reply) == {"id": batch["id"], "object": "batch.deleted", "deleted": True}
    for method, path in [("GET", ""), ("GET", "/results"), ("GET", "/output.jsonl"), ("POST", "/cancel"),
                         ("DELETE", "")]:
        error(api(method, f"/v1/batches/{batch['id']}{path}", key), 404, batch["id"], code="batch_not_found")
    # The delete answered at once; the sweeper's purge removes what the batch held.
    assert s3_keys(svc, f"batches/{batch['id']}/")
    assert sweep_once(svc)["purged"] == 1
    assert s3_keys(svc, f"batches/{batch['id']}/") == [] and svc.table.get(*batch_key(batch["id"])) is None
    # An unfinished batch can be deleted too; none of its requests runs afterwards.
    assert ok(api("DELETE", f"/v1/batches/{keep['id']}", key))["deleted"] is True
    step_by_record(svc)
    assert sim_requests(sim_control) == calls
    assert no_batches(api, key)


# --- Extensions that are off, availability, routing --------------------------------------------------

def test_extensions_that_are_off(api, svc):
    _, key = new_key(svc)
    boundary = "672e0c9c1d2ba60237426016355a8290"
    multipart = (f"--{boundary}\r\nContent-Disposition: form-data; name=\"purpose\"\r\n\r\nbatch\r\n"
                 f"--{boundary}\r\nContent-Disposition: form-data; name=\"file\"; filename=\"batchinput.jsonl\"\r\n"
                 f"Content-Type: application/octet-stream\r\n\r\n{json.dumps(req('a'))}\n\r\n--{boundary}--\r\n")
    reply = api("POST", "/v1/files", key, body=multipart,
                headers={"content-type": f"multipart/form-data; boundary={boundary}"})
    assert api.events[-1]["isBase64Encoded"] is True
    error(reply, 400, "File batches are not enabled", code="file_batches_disabled")
    error(api("POST", "/v1/files"), 401)

    body = {"requests": [{"custom_id": "a", "params": {"model": "glm-5.3-flash", "max_tokens": 10,
                                                        "messages": [{"role": "user", "content": "hi"}]}}]}
    for prefix in ("", "/anthropic"):
        reply = api("POST", f"{prefix}/v1/messages/batches", key, header="x-api-key", json_body=body,
                    headers={"anthropic-version": "2023-06-01"})
        anthropic_error(reply, 403, "permission_error", "Message Batches are not enabled")
        anthropic_error(api("POST", f"{prefix}/v1/messages/batches", json_body=body), 401, "authentication_error")
        version = {"anthropic-version": "2023-06-01"}
        assert ok(api("GET", f"{prefix}/v1/messages/batches", key, headers=version))["data"] == []
        anthropic_error(api("GET", f"{prefix}/v1/messages/batches/msgbatch_1", key, headers=version), 404,
                        "not_found_error")

    error(api("PUT", "/v1/batch_webhook", key, json_body={"url": "https://example.com/hooks/freeinference"}), 400,
          "Batch webhooks are not enabled", code="webhooks_disabled")
    error(api("GET", "/v1/batch_webhook", key), 404)
    assert no_batches(api, key)


def test_unknown_routes_and_unavailable_are_json_never_500(api, svc):
    _, key = new_key(svc)
    for method, path in [("GET", "/v1/nothing-here"), ("GET", "/"), ("POST", "/v1/batches/x/y/z"),
                         ("GET", "/v2/batches"), ("DELETE", "/v1")]:
        error(api(method, path, key), 404, message="Not found.")
        error(api(method, path), 404, message="Not found.")
    error(api("PUT", "/v1/batches", key, json_body={}), 405)
    error(api("PATCH", "/v1/batches/batch_x", key), 405)
    # The envelope is the one of the API a route belongs to, for its own errors, a method it does not
    # serve, a parameter it cannot read, and a path under that API's base URL that nothing serves.
    anthropic_error(api("PATCH", "/anthropic/v1/messages/batches", key), 405, "invalid_request_error")
    anthropic_error(api("GET", "/anthropic/v1/nothing-here", key), 404, "not_found_error")
    anthropic_error(api("GET", "/v1/messages/batches/msgbatch_1"), 401, "authentication_error")
    error(api("GET", "/v1/batches", key, query={"limit": "many"}), 400, "limit", code=None)
    assert api("GET", "/health").json() == {"status": "ok"}
    # Batch inference switched off: every batch route answers 404 "unavailable".
    batch = api.created(key, [req("a")])
    settings(svc, batches_enabled=False)
    error(api("GET", "/v1/batches", key), 404, "unavailable", code="batches_unavailable")
    error(api("GET", f"/v1/batches/{batch['id']}", key), 404, "unavailable")
    error(api.create(key, [req("a")]), 404, "unavailable")


def test_a_trailing_slash_is_served_as_the_path_without_it_and_never_redirected(api, svc):
    # Redirecting to the path without the slash would build its URL from the Host header the client chose.
    settings(svc, file_batches_enabled=True, message_batches_enabled=True, batch_webhooks_enabled=True)
    _, key = new_key(svc)
    api.created(key, [req("a")])
    collections = sorted((method.upper(), path) for path, operations in create_app().openapi()["paths"].items()
                         if path.startswith(("/v1/", "/anthropic/")) and "{" not in path for method in operations)
    assert ("GET", "/v1/batches") in collections and ("POST", "/anthropic/v1/messages/batches") in collections
    for method, path in collections:
        body = {} if method in ("POST", "PUT") else None
        headers = {"anthropic-version": "2023-06-01"} if "/messages" in path else {}
        plain = api(method, path, key, headers=headers, **({"json_body": body} if body is not None else {}))
        slashed = api(method, path + "/", key, headers={**headers, "host": "evil.example"},
                      **({"json_body": body} if body is not None else {}))
        assert "location" not in slashed.headers, (method, path, slashed.status, slashed.headers)
        assert (slashed.status, slashed.json()) == (plain.status, plain.json()), (method, path)
    # Without a key too: the route's own 401, in its API's envelope.
    anthropic_error(api("GET", "/anthropic/v1/messages/batches/", headers={"host": "evil.example"}), 401,
                    "authentication_error")
    error(api("GET", "/v1/batches/", headers={"host": "evil.example"}), 401)


def test_known_parameters_in_range_and_unknown_ones_pass_through(api, svc, sim_control):
    _, key = new_key(svc)
    batch = api.created(key, [req("z", temperature=0, top_p=1, max_tokens=5, stop="\n", seed=7, n=1,
                                  logit_bias={"50256": -100}, some_new_parameter={"x": 1})])
    final = finish(svc, batch["id"])
    assert final["status"] == "completed" and final["completed"] == 1
