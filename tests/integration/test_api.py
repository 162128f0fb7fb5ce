"""The OpenAI-shaped batch API as a user sees it, driven through the real API Lambda handler (Mangum) with
API Gateway HTTP API (2.0) events, on in-process moto and the simulated backend."""

from __future__ import annotations

import json
import re

from batchinfer import ledger
from batchinfer.api.app import create_app
from batchinfer.layout import batch_key, hash_api_key
from batchinfer.scheduling.dispatcher import Dispatcher
from batchinfer.service import accounts
from batchinfer.service.background.sweep import sweep_once
from tests.helpers import (
    AS_SENT,
    CONTEXT_OVERFLOW,
    SIM_REJECTED,
    anthropic_error,
    check_as_sent,
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
    tick,
    tiny,
)

# The batch object of the spec's "Create a batch" example: every field a user may rely on.
SPEC_BATCH_FIELDS = {
    "id", "object", "endpoint", "model", "errors", "input_file_id", "completion_window", "status", "output_file_id",
    "error_file_id", "created_at", "in_progress_at", "expires_at", "finalizing_at", "completed_at", "failed_at",
    "expired_at", "cancelling_at", "cancelled_at", "request_counts", "metadata", "usage", "cost_usd",
    "cost_unknown_attempts", "results_expires_at", "error",
    "paused_at",  # an extension (pause and resume): null unless paused
    "priority",  # an extension: the batch's priority among its account's batches
    "analytics",  # an extension: how the batch ran (rates, latencies, attempts, errors by code)
    "execution", "saved_usd",  # extensions: how its parts run (provider batch tiers) and what that saved
}
BATCH_ID = re.compile(r"^batch_[0-9a-f]{32}$")


# --- Authentication ----------------------------------------------------------------------------------

def test_auth_refusals_are_401(api, svc):
    for reply in (api("GET", "/v1/batches"), api("POST", "/v1/batches", json_body={"requests": [req("a")]}),
                  api("GET", "/v1/batches", headers={"authorization": "Bearer "})):
        err = error(reply, 401, "Missing API key", code="invalid_api_key")
        assert "Authorization: Bearer" in err["message"] and "X-API-Key" in err["message"]
    error(api("GET", "/v1/batches", "hyi-not-a-real-key"), 401, message="The API key is invalid.",
          code="invalid_api_key")
    error(api("GET", "/v1/batches", "hyi-not-a-real-key", header="x-api-key"), 401, "invalid")
    account, key = new_key(svc)
    error(api("GET", "/v1/batches", headers={"authorization": f"Basic {key}"}), 401, "Missing API key")

    batch = api.created(key, [req("a")])
    accounts.revoke_key(svc, key)
    error(api("GET", f"/v1/batches/{batch['id']}", key), 401, message="The API key has been revoked.")
    error(api.create(key, [req("b")]), 401, "revoked")

    expired = accounts.create_key(svc, account["id"], expires_at=svc.now() - 1)
    error(api("GET", "/v1/batches", expired), 401, message="The API key has expired.")
    error(api("GET", f"/v1/batches/{batch['id']}", expired, header="x-api-key"), 401, "expired")
    later = accounts.create_key(svc, account["id"], expires_at=svc.now() + 3600)
    assert [b["id"] for b in ok(api("GET", "/v1/batches", later))["data"]] == [batch["id"]]
    # The batch runs under the key that created it: revoked, the batch fails, and another valid key of the
    # account still reads it.
    finish(svc, batch["id"])
    failed = ok(api("GET", f"/v1/batches/{batch['id']}", later))
    assert failed["status"] == "failed" and failed["failed_at"] and failed["error"]["code"] == "owner_unauthorized"
    assert failed["request_counts"] == {"total": 1, "completed": 0, "failed": 1}
    result = ok(api.results(later, batch["id"]))["data"][0]
    assert (result["status"], result["response"], result["error"]["code"]) == ("failed", None, "batch_failed")

    accounts.update_account(svc, account["id"], status="suspended")
    error(api("GET", "/v1/batches", later), 401, "not active")


def test_a_revoked_key_is_refused_at_once_its_record_read_strongly_consistent(api, svc):
    # DynamoDB reads are eventually consistent unless asked: a key revoked a moment ago could still pass one.
    _, key = new_key(svc)
    reads: list[dict] = []

    def spy(params: dict, **_: object) -> None:
        reads.append(params)

    events = svc.table.client.meta.events  # what boto3 sends DynamoDB, as it sends it
    events.register("provide-client-params.dynamodb.GetItem", spy)
    try:
        ok(api("GET", "/v1/batches", key))
    finally:
        events.unregister("provide-client-params.dynamodb.GetItem", spy)
    auth = {r["Key"]["sk"]["S"]: r.get("ConsistentRead") for r in reads if r["Key"]["sk"]["S"] in ("KEY", "ACCOUNT")}
    assert auth == {"KEY": True, "ACCOUNT": True}
    accounts.revoke_key(svc, key)
    error(api("GET", "/v1/batches", key), 401, message="The API key has been revoked.")


def test_bearer_and_x_api_key_of_any_account_key_work(api, svc):
    account, key = new_key(svc)
    other = accounts.create_key(svc, account["id"])
    batch = api.created(key, [req("a")])
    bid = batch["id"]
    assert ok(api("GET", f"/v1/batches/{bid}", key, header="x-api-key"))["id"] == bid
    assert [b["id"] for b in ok(api("GET", "/v1/batches", headers={"authorization": f"bearer {key}"}))["data"]] \
        == [bid]
    by_x = ok(api("POST", "/v1/batches", key, header="x-api-key", json_body={"requests": [req("b")]}))
    assert by_x["status"] == "validating"
    # Managing works with any valid key of the same account, not only the creating key.
    assert ok(api("GET", f"/v1/batches/{bid}", other))["id"] == bid
    assert [r["custom_id"] for r in ok(api.results(other, bid))["data"]] == ["a"]
    assert ok(api("POST", f"/v1/batches/{bid}/cancel", other, header="x-api-key"))["status"] == "cancelled"
    assert ok(api("GET", f"/v1/batches/{bid}/output.jsonl", other)) == {
        "id": "batch_req_1", "custom_id": "a", "response": None, "error": None}
    assert ok(api("DELETE", f"/v1/batches/{bid}", other))["deleted"] is True


def test_another_accounts_batch_reads_as_not_found(api, svc):
    _, mine = new_key(svc)
    _, theirs = new_key(svc)
    batch = api.created(theirs, [req("a")])
    finish(svc, batch["id"])
    bid = batch["id"]
    for method, path in [("GET", f"/v1/batches/{bid}"), ("GET", f"/v1/batches/{bid}/results"),
                         ("GET", f"/v1/batches/{bid}/output.jsonl"), ("POST", f"/v1/batches/{bid}/cancel"),
                         ("DELETE", f"/v1/batches/{bid}")]:
        error(api(method, path, mine), 404, message=f"No batch found with id '{bid}'.", code="batch_not_found",
              param="batch_id")
    assert no_batches(api, mine)
    error(api("GET", "/v1/batches", mine, query={"after": bid}), 400, "after")
    # Still there, untouched, for its owner.
    assert ok(api("GET", f"/v1/batches/{bid}", theirs))["status"] == "completed"
    assert ok(api("GET", f"/v1/batches/{bid}/output.jsonl", theirs))["custom_id"] == "a"
    error(api("GET", "/v1/batches/batch_0000", mine), 404, "No batch found")
    error(api("GET", "/v1/batches/not-a-batch-id", mine), 404, "No batch found")


# --- Create ------------------------------------------------------------------------------------------

SPEC_EXAMPLE = {
    "requests": [
        {"custom_id": "q-1", "method": "POST", "url": "/v1/chat/completions",
         "body": {"model": "glm-5.3-flash",
                  "messages": [{"role": "user", "content": "Summarize the plot of Hamlet in two sentences."}]}},
        {"custom_id": "q-2", "method": "POST", "url": "/v1/chat/completions",
         "body": {"model": "qwen3.6-35b",
                  "messages": [{"role": "user", "content": "Translate \"good morning\" into French."}],
                  "max_tokens": 50}},
    ],
    "metadata": {"project": "eval-42"},
}


def test_create_spec_example(api, svc, sim_control):
    _, key = new_key(svc)
    before = svc.now()
    reply = api("POST", "/v1/batches", key, json_body=SPEC_EXAMPLE, headers={"idempotency-key": "eval-42-run-1"})
    batch = ok(reply)
    assert set(batch) == SPEC_BATCH_FIELDS
    assert BATCH_ID.match(batch["id"]), batch["id"]
    assert isinstance(batch["created_at"], int) and before <= batch["created_at"] <= svc.now()
    assert batch == {
        "id": batch["id"], "object": "batch", "endpoint": "/v1/chat/completions", "model": None, "errors": None,
        "input_file_id": None, "completion_window": "24h", "status": "validating", "output_file_id": None,
        "error_file_id": None, "created_at": batch["created_at"], "in_progress_at": None,
        "expires_at": batch["created_at"] + 86400, "finalizing_at": None, "completed_at": None, "failed_at": None,
        "expired_at": None, "cancelling_at": None, "cancelled_at": None,
        "request_counts": {"total": 2, "completed": 0, "failed": 0}, "metadata": {"project": "eval-42"},
        "usage": {"input_tokens": 0, "output_tokens": 0, "total_tokens": 0}, "cost_usd": 0.0,
        "cost_unknown_attempts": 0, "results_expires_at": None, "error": None, "paused_at": None,
        "priority": "normal",
        "execution": None, "saved_usd": 0.0,
        "analytics": {"started_at": None, "last_finished_at": None, "running_seconds": 0, "requests_per_minute": None,
                      "output_tokens_per_second": None, "p50_ms": None, "p95_ms": None, "max_ms": None,
                      "attempts": 0, "retries": 0, "errors_by_code": {}, "cached_input_share": None,
                      "cache_saved_usd": 0.0},
    }
    assert ok(api("GET", f"/v1/batches/{batch['id']}", key)) == batch
    assert sim_requests(sim_control) == 0  # creating runs no inference

    finish(svc, batch["id"])
    final = ok(api("GET", f"/v1/batches/{batch['id']}", key))
    assert set(final) == SPEC_BATCH_FIELDS
    assert final["status"] == "completed"
    assert final["request_counts"] == {"total": 2, "completed": 2, "failed": 0}
    assert final["created_at"] <= final["in_progress_at"] <= final["completed_at"]
    assert final["results_expires_at"] == final["completed_at"] + 7 * 86400
    assert final["usage"]["input_tokens"] > 0 and final["usage"]["output_tokens"] > 0
    assert final["usage"]["total_tokens"] == final["usage"]["input_tokens"] + final["usage"]["output_tokens"]
    assert final["cost_usd"] > 0 and final["cost_unknown_attempts"] == 0
    page = ok(api.results(key, batch["id"]))
    assert [(r["custom_id"], r["status"]) for r in page["data"]] == [("q-1", "completed"), ("q-2", "completed")]
    assert [r["response"]["body"]["model"] for r in page["data"]] == ["glm-5.3-flash", "qwen3.6-35b"]
    assert all(r["response"]["status_code"] == 200 and r["error"] is None for r in page["data"])
    assert sim_requests(sim_control) == 2


def test_the_batch_object_names_its_one_model_and_none_for_a_mix(api, svc):
    """`model`, as OpenAI's batch object has it: the catalog id every request runs on (an alias is named by the
    model it points to); null for an inline batch over several models."""
    _, key = new_key(svc)
    one = ok(api.create(key, [req("a", model="glm-flash"), req("b", model="glm-5.3-flash")]))
    assert one["model"] == "glm-5.3-flash"
    assert ok(api("GET", f"/v1/batches/{one['id']}", key))["model"] == "glm-5.3-flash"
    mixed = ok(api.create(key, [req("a"), req("b", model="qwen3.6-35b")]))
    assert mixed["model"] is None
    listed = {b["id"]: b["model"] for b in ok(api("GET", "/v1/batches", key))["data"]}
    assert listed == {one["id"]: "glm-5.3-flash", mixed["id"]: None}
    finished = finish(svc, one["id"])
    assert finished["status"] == "completed"
    assert ok(api("GET", f"/v1/batches/{one['id']}", key))["model"] == "glm-5.3-flash"  # kept once it ran


def test_create_malformed_bodies_are_400(api, svc):
    _, key = new_key(svc)
    as_json = {"content-type": "application/json"}
    error(api("POST", "/v1/batches", key, body='{"requests": [', headers=as_json), 400,
          message="The body is not valid JSON.")
    error(api("POST", "/v1/batches", key, body=b"\xff\xfe{", headers=as_json), 400, "not valid JSON")
    error(api("POST", "/v1/batches", key, body=b"", headers=as_json), 400, "requests")
    for payload in ({}, {"requests": []}, {"requests": None}, {"requests": "q-1"}, {"requests": {"custom_id": "a"}},
                    [req("a")], "requests", 42):
        err = error(api("POST", "/v1/batches", key, json_body=payload), 400)
        assert "requests" in err["message"], (payload, err)
    error(api.create(key, [req("a"), "not a request"]), 400, "requests[1]", "object", param="requests[1]")
    error(api.create(key, [{**req("a"), "body": "hello"}]), 400, "requests[0] (custom_id 'a')", "body")
    error(api.create(key, [{**req("a"), "body": {"model": "glm-5.3-flash"}}]), 400, "messages")
    error(api.create(key, [{**req("a"), "body": {"messages": [{"role": "user", "content": "x"}]}}]), 400,
          "body.model")
    # Python's json reads NaN and Infinity; JSON and the backends do not, so such a body could never run.
    for constant in ("NaN", "Infinity", "-Infinity"):
        raw = ('{"requests":[' + json.dumps(req("a")) + ',{"custom_id":"b","body":{"model":"glm-5.3-flash",'
               '"messages":[{"role":"user","content":"x"}],"temperature":' + constant + '}}]}')
        error(api("POST", "/v1/batches", key, body=raw, headers=as_json), 400, "requests[1] (custom_id 'b')",
              "NaN or Infinity", param="requests[1]")
    # Every body is checked as its endpoint checks it: types and ranges of the known parameters, each fault
    # naming the request and the parameter (unknown parameters pass through to the backend).
    for extra, named in (({"temperature": "hot"}, "body.temperature: input should be a valid number (got 'hot')"),
                         ({"temperature": 2.5}, "body.temperature: input should be less than or equal to 2"),
                         ({"top_p": "0.9"}, "body.top_p"), ({"max_tokens": 0}, "body.max_tokens"),
                         ({"max_tokens": True}, "body.max_tokens"), ({"n": 1.5}, "body.n"),
                         ({"stop": [1, 2]}, "body.stop"), ({"stop": ["a", "b", "c", "d", "e"]}, "body.stop"),
                         ({"logprobs": "yes"}, "body.logprobs"), ({"seed": "42"}, "body.seed"),
                         ({"presence_penalty": -3}, "body.presence_penalty"),
                         ({"messages": [{"role": "robot", "content": "x"}]}, "body.messages[0].role"),
                         ({"messages": [{"role": "user", "content": 7}]}, "body.messages[0].content")):
        error(api.create(key, [req("a"), req("b", **extra)]), 400, "requests[1] (custom_id 'b'): ", named,
              param="requests[1]")
    # File batches are an extension that is off.
    error(api("POST", "/v1/batches", key, json_body={"input_file_id": "file-abc123",
                                                     "endpoint": "/v1/chat/completions", "completion_window": "24h"}),
          400, "File batches are not enabled", param="input_file_id")
    assert no_batches(api, key)
    assert s3_keys(svc) == []


def test_create_deeply_nested_body_is_400_not_500(api, svc):
    """Valid JSON nested deeper than Python's recursion limit must be refused like any unusable body (400),
    not crash the create call (batches.create_batch: json.loads/json.dumps raise RecursionError)."""
    _, key = new_key(svc)
    nested = "[" * 5000 + "]" * 5000
    raw = ('{"requests":[{"custom_id":"a","body":{"model":"glm-5.3-flash","messages":[{"role":"user",'
           '"content":"x"}],"x":' + nested + '}}]}')
    error(api("POST", "/v1/batches", key, body=raw, headers={"content-type": "application/json"}), 400)
    assert no_batches(api, key)


def test_create_model_checks(api, svc):
    _, key = new_key(svc)
    reply = api.create(key, [req("q-1"), req("q-2", model="no-such-model")])
    assert reply.status == 400
    assert reply.json() == {"error": {"message": "requests[1] (custom_id 'q-2'): Model 'no-such-model' not found",
                                      "type": "invalid_request_error", "param": "requests[1]", "code": None}}
    for model in ("auto", "auto-pro"):
        error(api.create(key, [req("a", model=model)]), 400, "requests[0] (custom_id 'a')", f"'{model}'",
              "auto model")
    error(api.create(key, [req("a"), req("b", stream=True)]), 400, "requests[1] (custom_id 'b')", "stream")
    assert no_batches(api, key)
    # A model the key may not use reads exactly like one that does not exist.
    _, limited = new_key(svc, allowed_models=["qwen3.6-35b"])
    error(api.create(limited, [req("q-1", model="glm-5.3-flash")]), 400,
          message="requests[0] (custom_id 'q-1'): Model 'glm-5.3-flash' not found")
    assert ok(api.create(limited, [req("q-1", model="qwen3.6-35b", stream=False)]))["status"] == "validating"
    # An alias runs on the model it points to.
    batch = api.created(key, [req("a", model="glm-flash")])
    finish(svc, batch["id"])
    result = ok(api.results(key, batch["id"]))["data"][0]
    assert result["status"] == "completed"
    assert result["response"]["body"]["model"] == "glm-5.3-flash"
    assert "glm-5.3-flash" in result["response"]["body"]["choices"][0]["message"]["content"]


def test_create_names_a_model_or_max_tokens_of_the_wrong_type(api, svc):
    _, key = new_key(svc)
    error(api.create(key, [req("a"), req("b", model=5)]), 400, param="requests[1]",
          message="requests[1] (custom_id 'b'): body.model: input should be a valid string (got 5)")
    error(api.create(key, [req("a", model="")]), 400,
          message="requests[0] (custom_id 'a'): body.model: string should have at least 1 character")
    error(api.create(key, [req("a", max_tokens="x")]), 400,
          message="requests[0] (custom_id 'a'): body.max_tokens: input should be a valid integer (got 'x')")
    no_model = req("a")
    del no_model["body"]["model"]
    error(api.create(key, [no_model]), 400, message="requests[0] (custom_id 'a'): body.model is required")
    assert no_batches(api, key)


def test_create_request_shape_checks(api, svc):
    _, key = new_key(svc)
    error(api.create(key, [req("a"), req("b"), req("a")]), 400, "requests[2] (custom_id 'a')",
          "used more than once", param="requests[2]")
    error(api.create(key, [req("x" * 513)]), 400, "requests[0]", "custom_id must be a string of 1-512 characters")
    error(api.create(key, [req("")]), 400, "requests[0]", "1-512")
    error(api.create(key, [{"custom_id": 7, "body": req("a")["body"]}]), 400, "requests[0]:", "custom_id")
    error(api.create(key, [{"body": req("a")["body"]}]), 400, "requests[0]:", "custom_id")
    error(api.create(key, [req("a"), {**req("b"), "method": "GET"}]), 400, "requests[1] (custom_id 'b')",
          "method must be POST")
    for url in ("/v1/embeddings", "/v1/responses", "/v1/completions"):
        error(api.create(key, [{**req("a"), "url": url}]), 400, "requests[0] (custom_id 'a')", url,
              "/v1/chat/completions is the only endpoint batches serve", param="requests[0]")
    mixed = [req("a"), {"custom_id": "b", "url": "/v1/embeddings", "body": {"model": "glm-5.3-flash", "input": "x"}}]
    error(api.create(key, mixed), 400, "requests[1] (custom_id 'b')", "/v1/chat/completions is the only endpoint")
    assert no_batches(api, key)
    assert ok(api.create(key, [req("x" * 512)]))["request_counts"]["total"] == 1
    defaults = ok(api.create(key, [{"custom_id": "d", "body": req("d")["body"]}]))  # method and url are optional
    assert defaults["endpoint"] == "/v1/chat/completions"
    settings(svc, embeddings_responses_batches_enabled=True)  # where enabled: still one url per batch
    error(api.create(key, mixed), 400, "requests[1] (custom_id 'b')", "same url")


def test_create_metadata_and_completion_window(api, svc):
    _, key = new_key(svc)
    for metadata, words in [
        ({f"k{i}": "v" for i in range(17)}, ["16"]),
        ({"k" * 65: "v"}, ["64"]),
        ({"k": "v" * 513}, ["512"]),
        ({"k": 1}, ["metadata['k']", "string"]),
        ({"k": None}, ["metadata['k']", "string"]),
        ({"k": {"nested": "x"}}, ["string"]),
        (["project"], ["metadata"]),
        ("eval-42", ["metadata"]),
    ]:
        error(api.create(key, [req("a")], metadata=metadata), 400, *words, param="metadata")
    assert no_batches(api, key)
    metadata = {f"{i:02d}" + "k" * 62: "v" * 512 for i in range(16)}
    assert ok(api.create(key, [req("a")], metadata=metadata))["metadata"] == metadata
    assert ok(api.create(key, [req("a")], metadata=None))["metadata"] is None
    # A completion_window sent is ignored: the service's setting decides.
    batch = api.created(key, [req("a")], completion_window="1h")
    assert batch["completion_window"] == "24h"
    assert batch["expires_at"] - batch["created_at"] == 86400
    settings(svc, batch_completion_window_seconds=7200)
    batch = api.created(key, [req("a")], completion_window="24h")
    assert batch["expires_at"] - batch["created_at"] == 7200


def test_create_request_count_limit(api, svc):
    _, key = new_key(svc)
    err = error(api.create(key, [tiny(i) for i in range(50_001)]), 400, "50001", "50000", param="requests")
    assert "Split" in err["message"]
    assert no_batches(api, key)
    batch = api.created(key, [tiny(i) for i in range(50_000)])  # exactly the limit
    assert batch["request_counts"] == {"total": 50_000, "completed": 0, "failed": 0}
    across = ok(api.results(key, batch["id"], limit=3, after="batch_req_4999"))  # across index chunks
    assert [(r["id"], r["custom_id"], r["status"]) for r in across["data"]] == [
        ("batch_req_5000", "4999", "queued"), ("batch_req_5001", "5000", "queued"),
        ("batch_req_5002", "5001", "queued")]
    last = ok(api.results(key, batch["id"], limit=1000, after="batch_req_49500"))
    assert len(last["data"]) == 500 and last["last_id"] == "batch_req_50000" and last["has_more"] is False


def test_create_body_over_the_size_limit_is_413(api, svc):
    _, key = new_key(svc)
    settings(svc, max_body_bytes=2000)
    big = {"requests": [req("a", "x" * 2500)]}
    error(api("POST", "/v1/batches", key, json_body=big), 413, "2000 bytes")
    # Without a declared length, the body itself is measured.
    raw = json.dumps(big)
    event_headers = {"content-type": "application/json", "content-length": ""}
    error(api("POST", "/v1/batches", key, body=raw, headers=event_headers), 413, "2000")
    assert no_batches(api, key)
    assert ok(api("POST", "/v1/batches", key, json_body={"requests": [req("a")]}))["status"] == "validating"


def test_create_needs_batch_access(api, svc):
    _, key = new_key(svc, tier="pro", batch_access=False)
    error(api.create(key, [req("a")]), 403, "may not create batches", code="batch_access_denied")
    assert no_batches(api, key)  # reading still works
    free = accounts.create_account(svc, tier="free")  # by default only internal accounts have access
    error(api.create(accounts.create_key(svc, free["id"]), [req("a")]), 403)
    internal = accounts.create_account(svc, tier="internal")
    assert ok(api.create(accounts.create_key(svc, internal["id"]), [req("a")]))["status"] == "validating"


def test_quota_used_up_refuses_create_only(api, svc):
    account, key = new_key(svc)
    done = api.created(key, [req("a")])
    finish(svc, done["id"])
    pending = api.created(key, [req("b")])
    other = api.created(key, [req("c")])
    accounts.update_account(svc, account["id"], daily_quota_usd=0)
    error(api.create(key, [req("d")]), 429, "quota", "00:00 UTC", code="quota_exceeded")
    assert ok(api("GET", f"/v1/batches/{done['id']}", key))["status"] == "completed"
    assert len(ok(api("GET", "/v1/batches", key))["data"]) == 3
    assert ok(api.results(key, done["id"]))["data"][0]["status"] == "completed"
    lines = api("GET", f"/v1/batches/{done['id']}/output.jsonl", key)
    assert lines.status == 200 and len(lines.text.splitlines()) == 1
    assert ok(api("POST", f"/v1/batches/{pending['id']}/cancel", key))["status"] == "cancelled"
    assert ok(api("DELETE", f"/v1/batches/{other['id']}", key))["deleted"] is True
    assert ok(api("DELETE", f"/v1/batches/{done['id']}", key))["deleted"] is True


def test_eleventh_unfinished_batch_is_429(api, svc):
    _, key = new_key(svc)
    batches = [api.created(key, [req("a")]) for _ in range(10)]
    error(api.create(key, [req("a")]), 429, "10 unfinished batches", code="too_many_batches")
    assert len(ok(api("GET", "/v1/batches", key))["data"]) == 10
    # A finished (here: cancelled) batch no longer counts.
    assert ok(api("POST", f"/v1/batches/{batches[0]['id']}/cancel", key))["status"] == "cancelled"
    assert ok(api.create(key, [req("a")]))["status"] == "validating"
    error(api.create(key, [req("a")]), 429, code="too_many_batches")
    # Deleting an unfinished batch frees its place too.
    assert ok(api("DELETE", f"/v1/batches/{batches[1]['id']}", key))["deleted"] is True
    assert ok(api.create(key, [req("a")]))["status"] == "validating"
    # Another account is not affected.
    _, stranger = new_key(svc)
    assert ok(api.create(stranger, [req("a")]))["status"] == "validating"


def test_unfinished_requests_over_the_limit_is_429(api, svc):
    _, key = new_key(svc)
    settings(svc, max_unfinished_requests=5)
    first = api.created(key, [req("a"), req("b"), req("c")])
    error(api.create(key, [req("d"), req("e"), req("f")]), 429, "unfinished batch requests", "5",
          code="too_many_requests")
    assert ok(api.create(key, [req("d"), req("e")]))["request_counts"]["total"] == 2  # exactly at the limit
    error(api.create(key, [req("f")]), 429, code="too_many_requests")
    finish(svc, first["id"])
    assert ok(api.create(key, [req("f")]))["status"] == "validating"
    assert len(ok(api("GET", "/v1/batches", key))["data"]) == 3


def test_batch_larger_than_the_unfinished_limit_is_429_and_stores_nothing(api, svc):
    """A refused batch leaves nothing behind (batches._store_new_batch raises for `total >
    max_unfinished_requests` after writing the batch's S3 objects and outside the clean-up)."""
    _, key = new_key(svc)
    settings(svc, max_unfinished_requests=2)
    error(api.create(key, [req("a"), req("b"), req("c")]), 429, code="too_many_requests")
    assert no_batches(api, key)
    assert s3_keys(svc) == []  # nothing of the refused batch may be left behind


# --- Idempotency -------------------------------------------------------------------------------------

def test_idempotent_replay_returns_the_same_batch(api, svc):
    account, key = new_key(svc)
    payload = {"requests": [req("a"), req("b")], "metadata": {"run": "1"}}
    created = api("POST", "/v1/batches", key, json_body=payload, headers={"idempotency-key": "job-1"})
    first = ok(created)
    replayed = api("POST", "/v1/batches", key, json_body=payload, headers={"idempotency-key": "job-1"})
    again = ok(replayed)
    assert again == first
    assert "idempotent-replayed" not in created.headers and replayed.headers["idempotent-replayed"] == "true"
    # Any key of the account replays it; so does the same JSON written differently.
    other = accounts.create_key(svc, account["id"])
    pretty = json.dumps({"metadata": {"run": "1"}, "requests": payload["requests"]}, indent=2)
    third = ok(api("POST", "/v1/batches", other, body=pretty,
                   headers={"idempotency-key": "job-1", "content-type": "application/json"}))
    assert third["id"] == first["id"]
    assert [b["id"] for b in ok(api("GET", "/v1/batches", key))["data"]] == [first["id"]]
    # A replay never changes which key the batch runs under.
    assert svc.table.get(*batch_key(first["id"]))["key_hash"] == hash_api_key(key)
    # Replaying a batch that has since progressed returns its current state.
    finish(svc, first["id"])
    replay = ok(api("POST", "/v1/batches", key, json_body=payload, headers={"idempotency-key": "job-1"}))
    assert replay["id"] == first["id"] and replay["status"] == "completed"
    # Another Idempotency-Key, or another account using the same one, is another batch.
    job2 = ok(api("POST", "/v1/batches", key, json_body=payload, headers={"idempotency-key": "job-2"}))
    assert job2["id"] != first["id"]
    _, stranger = new_key(svc)
    theirs = ok(api("POST", "/v1/batches", stranger, json_body=payload, headers={"idempotency-key": "job-1"}))
    assert theirs["id"] not in (first["id"], job2["id"])


def test_idempotency_key_reused_409_and_deleted_410(api, svc):
    _, key = new_key(svc)
    first = api.created(key, [req("a")], idem="job-1")
    error(api.create(key, [req("a", "something else")], idem="job-1"), 409, "Idempotency-Key",
          "different request", code="idempotency_key_reused")
    error(api.create(key, [req("a")], idem="job-1", metadata={"x": "y"}), 409)
    assert [b["id"] for b in ok(api("GET", "/v1/batches", key))["data"]] == [first["id"]]
    assert ok(api("DELETE", f"/v1/batches/{first['id']}", key))["deleted"] is True
    error(api.create(key, [req("a")], idem="job-1"), 410, "deleted", code="batch_deleted")
    assert no_batches(api, key)


def test_malformed_idempotency_key_is_400(api, svc):
    _, key = new_key(svc)
    for idem in ("", "k" * 256, "bad\tkey", "bad\x7fkey", "bad\x01key"):
        error(api.create(key, [req("a")], idem=idem), 400, "Idempotency-Key", "1-255", param="Idempotency-Key")
    assert no_batches(api, key)
    idem = "".join(chr(0x20 + i % 95) for i in range(255))  # 255 characters, every printable ASCII one
    first = api.created(key, [req("a")], idem=idem)
    assert api.created(key, [req("a")], idem=idem)["id"] == first["id"]


def test_replay_after_quota_used_up_and_access_lost(api, svc):
    account, key = new_key(svc)
    first = api.created(key, [req("a")], idem="job-1")
    accounts.update_account(svc, account["id"], daily_quota_usd=0)
    assert ok(api.create(key, [req("a")], idem="job-1"))["id"] == first["id"]
    error(api.create(key, [req("a")], idem="job-2"), 429, code="quota_exceeded")
    accounts.update_account(svc, account["id"], daily_quota_usd=10, batch_access=False)
    assert ok(api.create(key, [req("a")], idem="job-1"))["id"] == first["id"]
    error(api.create(key, [req("a")], idem="job-2"), 403)
    error(api.create(key, [req("z")], idem="job-1"), 409)
    assert [b["id"] for b in ok(api("GET", "/v1/batches", key))["data"]] == [first["id"]]


def test_idempotency_key_is_forgotten_a_day_after_its_batch_ended(api, svc):
    """Spec: a key is remembered until a day after its batch ends; afterwards it is a new key."""
    _, key = new_key(svc)
    first = api.created(key, [req("a")], idem="nightly")
    finish(svc, first["id"])
    assert ok(api.create(key, [req("a")], idem="nightly"))["id"] == first["id"]
    # Two days later the key is new again. Its record may still exist: DynamoDB's TTL removes expired items
    # only eventually (and moto never does).
    tick(svc, 2 * 86400)
    second = ok(api.create(key, [req("a")], idem="nightly"))
    assert second["id"] != first["id"] and second["status"] == "validating"


# --- Retrieve and list -------------------------------------------------------------------------------

def test_list_newest_first_with_pagination(api, svc):
    _, key = new_key(svc)
    ids = []
    for i in range(5):
        ids.append(api.created(key, [req(f"r{i}")])["id"])
        tick(svc)
    newest = ids[::-1]
    everything = ok(api("GET", "/v1/batches", key))
    assert everything["object"] == "list"
    assert [b["id"] for b in everything["data"]] == newest
    assert everything["has_more"] is False
    assert (everything["first_id"], everything["last_id"]) == (newest[0], newest[-1])
    assert all(set(b) == SPEC_BATCH_FIELDS for b in everything["data"])

    seen, after, pages = [], None, 0
    while True:
        page = ok(api("GET", "/v1/batches", key, query={"limit": 2, **({"after": after} if after else {})}))
        pages += 1
        assert page["first_id"] == page["data"][0]["id"] and page["last_id"] == page["data"][-1]["id"]
        seen += [b["id"] for b in page["data"]]
        if not page["has_more"]:
            break
        after = page["last_id"]
    assert seen == newest and pages == 3
    assert ok(api("GET", "/v1/batches", key, query={"limit": 1, "after": newest[-1]})) == {
        "object": "list", "data": [], "first_id": None, "last_id": None, "has_more": False}
    one = ok(api("GET", "/v1/batches", key, query={"limit": 1}))
    assert [b["id"] for b in one["data"]] == newest[:1] and one["has_more"] is True
    exact = ok(api("GET", "/v1/batches", key, query={"limit": 5}))
    assert len(exact["data"]) == 5 and exact["has_more"] is False
    assert len(ok(api("GET", "/v1/batches", key, query={"limit": 100}))["data"]) == 5
    for limit in ("0", "101", "-1", "abc"):
        error(api("GET", "/v1/batches", key, query={"limit": limit}), 400, "limit", param="limit")
    # A batch read on its own is the same object as in the list.
    assert ok(api("GET", f"/v1/batches/{newest[0]}", key)) == everything["data"][0]


def test_list_newest_first_within_one_second(api, svc):
    """Batches created within the same second must still list newest first (created_at has one-second
    resolution, and the list's sort key breaks ties by the random batch id: 1 chance in 720 to pass)."""
    _, key = new_key(svc)
    frozen = svc.now()
    svc.clock = lambda: frozen  # a script creating several batches in quick succession
    ids = [api.created(key, [req(f"r{i}")])["id"] for i in range(6)]
    assert [b["id"] for b in ok(api("GET", "/v1/batches", key))["data"]] == ids[::-1]


# --- Results -----------------------------------------------------------------------------------------

def test_results_in_submission_order_queued_then_completed(api, svc):
    _, key = new_key(svc)
    models = ["glm-5.3-flash", "qwen3.6-35b", "glm-5.3-flash", "qwen3.6-35b", "glm-flash"]
    batch = api.created(key, [req(f"c-{i}", f"question {i}", model=m) for i, m in enumerate(models)])
    before = ok(api.results(key, batch["id"]))
    assert before["object"] == "list"
    assert [(r["id"], r["custom_id"], r["status"], r["response"], r["error"]) for r in before["data"]] == [
        (f"batch_req_{i + 1}", f"c-{i}", "queued", None, None) for i in range(5)]
    assert (before["first_id"], before["last_id"], before["has_more"]) == ("batch_req_1", "batch_req_5", False)
    Dispatcher(svc).pass_once()
    progress = ok(api("GET", f"/v1/batches/{batch['id']}", key))
    assert progress["status"] == "in_progress" and progress["in_progress_at"] >= batch["created_at"]
    assert [r["status"] for r in ok(api.results(key, batch["id"]))["data"]] == ["queued"] * 5
    finish(svc, batch["id"])
    after = ok(api.results(key, batch["id"]))
    assert [(r["id"], r["custom_id"], r["status"]) for r in after["data"]] == [
        (f"batch_req_{i + 1}", f"c-{i}", "completed") for i in range(5)]
    for i, r in enumerate(after["data"]):
        assert set(r) == {"id", "custom_id", "status", "response", "error"}
        assert r["error"] is None
        assert set(r["response"]) == {"status_code", "request_id", "body"} and r["response"]["status_code"] == 200
        assert r["response"]["body"]["object"] == "chat.completion"
        assert r["response"]["body"]["model"] == ("glm-5.3-flash" if models[i] == "glm-flash" else models[i])
        assert f"question {i}" in r["response"]["body"]["choices"][0]["message"]["content"]


def test_results_pagination_and_parameters(api, svc):
    _, key = new_key(svc)
    batch = api.created(key, [req(f"p-{i}") for i in range(5)])
    first = ok(api.results(key, batch["id"], limit=2))
    assert [r["id"] for r in first["data"]] == ["batch_req_1", "batch_req_2"]
    assert (first["first_id"], first["last_id"], first["has_more"]) == ("batch_req_1", "batch_req_2", True)
    second = ok(api.results(key, batch["id"], limit=2, after=first["last_id"]))
    assert [r["custom_id"] for r in second["data"]] == ["p-2", "p-3"] and second["has_more"] is True
    third = ok(api.results(key, batch["id"], limit=2, after=second["last_id"]))
    assert [r["custom_id"] for r in third["data"]] == ["p-4"] and third["has_more"] is False
    assert ok(api.results(key, batch["id"], after="batch_req_5")) == {
        "object": "list", "data": [], "has_more": False, "first_id": None, "last_id": None}
    assert len(ok(api.results(key, batch["id"], limit=1000))["data"]) == 5
    assert ok(api.results(key, batch["id"], limit=1))["has_more"] is True
    for limit in ("0", "1001", "x"):
        error(api.results(key, batch["id"], limit=limit), 400, "limit", param="limit")
    for after in ("bogus", "batch_req_", "batch_req_0", "batch_req_-1", "req_1", "batch_req_1x"):
        error(api.results(key, batch["id"], after=after), 400, "batch_req_", f"'{after}'", param="after")


def test_results_of_failed_and_large_requests(api, svc):
    _, key = new_key(svc)
    settings(svc, max_result_bytes=60_000)  # results over inline_result_bytes (32 KiB) are kept in S3
    batch = api.created(key, [req("ok-1"), req("bad", "please [[sim:400]]"), req("big", "[[sim:big:40000]]"),
                              req("huge", "[[sim:big:100000]]")])
    finish(svc, batch["id"])
    data = ok(api.results(key, batch["id"]))["data"]
    assert [r["status"] for r in data] == ["completed", "failed", "completed", "failed"]
    bad = data[1]
    assert bad["id"] == "batch_req_2" and bad["custom_id"] == "bad"
    assert bad["response"] is None
    assert set(bad["error"]) == {"code", "message", "status", "request_id", "body"}
    assert bad["error"]["code"] == "invalid_request" and bad["error"]["status"] == 400
    assert isinstance(bad["error"]["message"], str) and bad["error"]["message"]
    big = data[2]["response"]["body"]["choices"][0]["message"]["content"]
    assert len(big) > 32 * 1024 and data[2]["error"] is None
    assert data[3]["response"] is None and data[3]["error"]["code"] == "result_too_large"
    assert "60000" in data[3]["error"]["message"]
    final = ok(api("GET", f"/v1/batches/{batch['id']}", key))
    assert final["status"] == "completed" and final["request_counts"] == {"total": 4, "completed": 2, "failed": 2}
    lines = [json.loads(line) for line in api("GET", f"/v1/batches/{batch['id']}/output.jsonl", key).text.splitlines()]
    assert [(line["response"], line["error"]) for line in lines] == [(r["response"], r["error"]) for r in data]




def test_a_failed_request_keeps_the_backends_status_request_id_and_error_body(api, svc, sim_control):
    """Beside the service's own code, the error of a request the backend refused holds what the backend
    answered: its status, its request id and its body as it sent it, its own fields and all (llama-server's
    n_ctx); a body too large to keep is left out, its size said."""
    _, key = new_key(svc)
    batch = api.created(key, [req("overflow", "[[sim:context-overflow]] a long story"), req("rejected", "[[sim:400]]")])
    finish(svc, batch["id"])
    page = api.results(key, batch["id"])
    overflow, rejected = ok(page)["data"]
    assert overflow["response"] is None and overflow["error"]["code"] == "invalid_request"
    assert overflow["error"]["message"] == CONTEXT_OVERFLOW and overflow["error"]["status"] == 400
    assert overflow["error"]["request_id"].startswith("req_sim_")
    sent = overflow["error"]["body"]
    assert sent["error"]["type"] == "exceed_context_size_error" and sent["error"]["code"] == 400
    assert sent["error"]["n_ctx"] == 4096 and sent["error"]["n_prompt_tokens"] > 4096
    assert rejected["error"]["body"] == SIM_REJECTED and rejected["error"]["request_id"].startswith("req_sim_")
    # As sent: the body's own bytes, in the page and in output.jsonl alike.
    exported = api("GET", f"/v1/batches/{batch['id']}/output.jsonl", key).text
    as_sent = f'{{"error":{{"code":400,"message":"{CONTEXT_OVERFLOW}","type":"exceed_context_size_error",'
    assert as_sent in page.text and as_sent in exported
    assert [json.loads(line)["error"] for line in exported.splitlines()] == [overflow["error"], rejected["error"]]

    settings(svc, max_error_body_bytes=50)
    small = api.created(key, [req("rejected", "[[sim:400]] again")])
    finish(svc, small["id"])
    [kept] = ok(api.results(key, small["id"]))["data"]
    assert kept["error"]["body"] is None and kept["error"]["body_omitted_bytes"] > 50
    assert kept["error"]["message"] == "Request rejected by the simulated backend"


def test_no_request_starts_after_the_completion_window_closed(api, svc, sim_control):
    """Spec: requests that have not started when the completion window closes expire. Only the sweeper
    looks at expires_at; the dispatcher and the worker start requests of a batch whose window has closed."""
    _, key = new_key(svc)
    batch = api.created(key, [req("a"), req("b")])
    tick(svc, 86400)  # the completion window closes before any request started
    finish(svc, batch["id"])  # dispatcher, worker and sweeper, each in its turn
    assert sim_requests(sim_control) == 0
    expired = ok(api("GET", f"/v1/batches/{batch['id']}", key))
    assert expired["status"] == "expired" and expired["expired_at"] >= expired["expires_at"]
    assert expired["request_counts"] == {"total": 2, "completed": 0, "failed": 2}
    data = ok(api.results(key, batch["id"]))["data"]
    assert [(r["status"], r["response"], r["error"]["code"]) for r in data] == [("expired", None, "batch_expired")] * 2
    assert ok(api("POST", f"/v1/batches/{batch['id']}/cancel", key)) == expired


def test_results_keep_the_backends_body_as_it_sent_it(api, svc, sim_control):
    """A result is what the endpoint answered: its bytes, small results (kept inline) and large ones alike."""
    sim_control.put("/_sim/config", json={"answer_extra_json": AS_SENT})
    _, key = new_key(svc)
    batch = api.created(key, [req("small"), req("large", "[[sim:big:40000]]")])
    finish(svc, batch["id"])
    page = ok(api.results(key, batch["id"]))
    exported = api("GET", f"/v1/batches/{batch['id']}/output.jsonl", key).text
    for text in (api.results(key, batch["id"]).text, exported):
        assert text.count(AS_SENT) == 2, text[:2000]
    for line, result in zip(exported.splitlines(), page["data"], strict=True):
        assert json.loads(line)["response"] == result["response"]
        check_as_sent(result["response"]["body"]["timings"])


# --- output.jsonl ------------------------------------------------------------------------------------

def test_output_jsonl_and_cancel_after_the_end(api, svc):
    _, key = new_key(svc)
    batch = api.created(key, [req("j-1"), req("j-2", "[[sim:400]] no"), req("j-3", model="qwen3.6-35b")])
    path = f"/v1/batches/{batch['id']}/output.jsonl"
    error(api("GET", path, key), 409, "has not finished", code="batch_not_finished")
    Dispatcher(svc).pass_once()
    error(api("GET", path, key), 409, "has not finished")
    finish(svc, batch["id"])
    reply = api("GET", path, key, headers={"accept": "application/binary"})
    assert reply.status == 200, reply.text
    assert reply.content_type.startswith("application/jsonl")
    assert batch["id"] in reply.headers.get("content-disposition", "")
    assert reply.text.endswith("\n")
    lines = [json.loads(line) for line in reply.text.splitlines()]
    assert [(line["id"], line["custom_id"]) for line in lines] == [
        ("batch_req_1", "j-1"), ("batch_req_2", "j-2"), ("batch_req_3", "j-3")]
    assert all(set(line) == {"id", "custom_id", "response", "error"} for line in lines)
    assert lines[0]["response"]["status_code"] == 200 and lines[0]["error"] is None
    assert lines[1]["response"] is None and lines[1]["error"]["code"] == "invalid_request"
    assert lines[2]["response"]["body"]["model"] == "qwen3.6-35b"
    paged = ok(api.results(key, batch["id"]))["data"]  # the same outcomes as the paged results
    assert [(r["response"], r["error"]) for r in paged] == [(line["response"], line["error"]) for line in lines]
    # Cancelling a batch that has finished returns it unchanged.
    done = ok(api("GET", f"/v1/batches/{batch['id']}", key))
    assert done["status"] == "completed"
    assert ok(api("POST", f"/v1/batches/{batch['id']}/cancel", key, body=b"",
                  headers={"content-type": "application/json"})) == done
    assert ok(api("GET", f"/v1/batches/{batch['id']}", key)) == done
    assert api("GET", path, key).text == reply.text


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
