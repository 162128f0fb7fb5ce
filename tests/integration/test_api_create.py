"""The OpenAI-shaped batch API as a user sees it, creating a batch: API keys and their refusals, the
request's checks, the model, the size and count limits, the account's quota and unfinished-work limits. Driven
through the real API Lambda handler (Mangum) with API Gateway HTTP API (2.0) events, on in-process moto and the
simulated backend."""

from __future__ import annotations

import json
import re

from batchinfer.service import accounts
from tests.helpers import (
    SPEC_BATCH_FIELDS,
    error,
    finish,
    new_key,
    no_batches,
    ok,
    req,
    s3_keys,
    settings,
    sim_requests,
    tiny,
)

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
