"""The OpenAI-shaped batch API as a user sees it, after creating a batch: replaying a create with its
Idempotency-Key, retrieving and listing batches, the results in submission order and output.jsonl. Driven through
the real API Lambda handler (Mangum) with API Gateway HTTP API (2.0) events, on in-process moto and the simulated
backend."""

from __future__ import annotations

import json

from batchinfer.layout import batch_key, hash_api_key
from batchinfer.scheduling.dispatcher import Dispatcher
from batchinfer.service import accounts
from tests.helpers import (
    AS_SENT,
    CONTEXT_OVERFLOW,
    SIM_REJECTED,
    SPEC_BATCH_FIELDS,
    check_as_sent,
    error,
    finish,
    new_key,
    no_batches,
    ok,
    req,
    settings,
    sim_requests,
    tick,
)

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
