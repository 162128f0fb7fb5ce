"""Anthropic Message Batches through the real API handler (Mangum, API Gateway events) and the real worker
and sweeper handlers, as the `anthropic` SDKs call them (wire contracts part B): objects, paging, per-request
checks, translation to an OpenAI-compatible backend and an Anthropic-kind backend, results, cancel, delete."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from batchinfer.layout import batch_key
from tests.helpers import (
    AS_SENT,
    CONTEXT_OVERFLOW,
    anthropic_error,
    catalog_with,
    check_as_sent,
    error,
    finish,
    new_key,
    ok,
    services_in_use,
    settings,
    sim_requests,
    step_by_record,
)

V1, V2 = "2023-06-01", "2026-10-21"
GLM = "glm-5.3-flash"  # an openai-kind model: Messages requests are translated to chat completions
CLAUDE = "claude-sim"  # an anthropic-kind model on the simulator's Messages endpoint


@pytest.fixture
def catalog_file(tmp_path: Path, sim) -> Path:
    """The default catalog plus an anthropic-kind model, both on the simulated backend."""
    return catalog_with(tmp_path, {
        "id": CLAUDE, "backend": {"kind": "anthropic", "base_url": "${SIMULATED_BACKEND_URL}/v1",
                                  "api_key_env": "CLAUDE_SIM_KEY"},
        "batch_budget": 4, "price": {"input_per_mtok": 3.0, "output_per_mtok": 15.0}})


@pytest.fixture
def svc(svc, sim, catalog_file):
    """The suite's services on the same moto, with the catalog above and Message Batches on."""
    with services_in_use(svc, sim.url, "msg", models_file=str(catalog_file),
                         message_batches_enabled=True) as services:
        yield services


def params(content: str = "Hello", model: str = GLM, **extra) -> dict:
    return {"model": model, "max_tokens": 64, "messages": [{"role": "user", "content": content}], **extra}


def entry(custom_id: str, content: str = "Hello", model: str = GLM, **extra) -> dict:
    return {"custom_id": custom_id, "params": params(content, model, **extra)}


class Messages:
    """The calls the anthropic SDK makes, with its headers (2.x: Bearer; 1.x: X-Api-Key)."""

    def __init__(self, api, key: str, version: str = V2, prefix: str = "/anthropic") -> None:
        self.api, self.key, self.version, self.prefix = api, key, version, prefix

    def __call__(self, method: str, path: str = "", **kwargs):
        headers = {"anthropic-version": self.version, **kwargs.pop("headers", {})}
        header = "bearer" if self.version == V2 else "x-api-key"
        return self.api(method, f"{self.prefix}/v1/messages/batches{path}", self.key, header=header,
                        headers=headers, **kwargs)

    def create(self, requests: list, idem: str | None = None, **kwargs):
        headers = {"idempotency-key": idem} if idem else {}
        return self("POST", json_body={"requests": requests}, headers=headers, **kwargs)

    def created(self, requests: list, **kwargs) -> dict:
        return ok(self.create(requests, **kwargs))

    def results(self, batch_id: str) -> list[dict]:
        reply = self("GET", f"/{batch_id}/results", headers={"accept": "application/binary"})
        assert reply.status == 200, reply.text
        assert reply.headers["content-type"].startswith("application/x-jsonl"), reply.headers
        assert b"\r" not in reply.body and b"\n\n" not in reply.body and reply.body.endswith(b"\n"), reply.body
        return [json.loads(line) for line in reply.body.split(b"\n")[:-1]]


@pytest.fixture
def messages(api, svc) -> Messages:
    _, key = new_key(svc)
    return Messages(api, key)


def test_a_model_max_tokens_or_messages_of_the_wrong_type_is_named_as_such(messages, svc):
    wrong = {"model-number": {"model": 5}, "model-empty": {"model": ""},
             "max-tokens-text": {"max_tokens": "x"}, "max-tokens-zero": {"max_tokens": 0},
             "max-tokens-true": {"max_tokens": True}, "messages-text": {"messages": "hi"},
             "messages-empty": {"messages": []}}
    said = {"model-number": "model: Input should be a valid string (got 5).",
            "model-empty": "model: String should have at least 1 character.",
            "max-tokens-text": "max_tokens: Input should be a valid integer (got 'x').",
            "max-tokens-zero": "max_tokens: Input should be greater than or equal to 1 (got 0).",
            "max-tokens-true": "max_tokens: Input should be a valid integer (got True).",
            "messages-text": "messages: Input should be a valid list (got 'hi').",
            "messages-empty": "messages: List should have at least 1 item."}
    batch = messages.created([{"custom_id": cid, "params": {**params(), **fault}} for cid, fault in wrong.items()])
    finish(svc, batch["id"])
    errors = {line["custom_id"]: line["result"]["error"]["error"] for line in messages.results(batch["id"])}
    assert errors == {cid: {"type": "invalid_request_error", "message": message} for cid, message in said.items()}
    # A Messages call is checked by the same code: a 400 in Anthropic's envelope, with the same message.
    for cid, fault in wrong.items():
        for path in ("/v1/messages", "/anthropic/v1/messages"):
            reply = messages.api("POST", path, messages.key, json_body={**params(), **fault},
                                 headers={"anthropic-version": V1})
            assert anthropic_error(reply, 400, "invalid_request_error")["message"] == said[cid]


def test_create_run_and_read_as_the_sdk_does(messages, svc):
    batch = messages.created([entry("q-0", "Summarize Hamlet"), entry("q-1", "Name three primes")])
    assert batch["id"].startswith("msgbatch_") and batch["type"] == "message_batch"
    assert batch["processing_status"] == "in_progress" and batch["results_url"] is None
    assert batch["request_counts"] == {"processing": 2, "succeeded": 0, "errored": 0, "canceled": 0, "expired": 0}
    assert batch["created_at"].endswith("Z") and batch["ended_at"] is None and batch["cancel_initiated_at"] is None
    assert set(batch) == {"id", "type", "processing_status", "request_counts", "ended_at", "created_at",
                          "expires_at", "archived_at", "cancel_initiated_at", "results_url",
                          "usage", "cost_usd", "cost_unknown_attempts", "paused_at",
                          "priority", "analytics", "execution", "saved_usd"}  # the last eight: extensions
    assert batch["usage"] == {"input_tokens": 0, "output_tokens": 0, "total_tokens": 0}
    assert batch["cost_usd"] == 0 and batch["cost_unknown_attempts"] == 0
    assert batch["priority"] == "normal"
    anthropic_error(messages("GET", f"/{batch['id']}/results"), 400, "invalid_request_error", "has not ended")
    anthropic_error(messages("DELETE", f"/{batch['id']}"), 400, "invalid_request_error", "has not ended")
    finish(svc, batch["id"])
    got = ok(messages("GET", f"/{batch['id']}"))
    assert got["processing_status"] == "ended" and got["ended_at"]
    assert got["request_counts"] == {"processing": 0, "succeeded": 2, "errored": 0, "canceled": 0, "expired": 0}
    # An absolute URL on the host and base path the client used.
    assert got["results_url"] == (f"https://a1b2c3d4e5.execute-api.us-east-1.amazonaws.com/anthropic/v1/messages/"
                                  f"batches/{batch['id']}/results")
    lines = messages.results(batch["id"])
    assert [line["custom_id"] for line in lines] == ["q-0", "q-1"]
    for line in lines:
        message = line["result"]["message"]
        assert line["result"]["type"] == "succeeded"
        assert message["type"] == "message" and message["role"] == "assistant" and message["model"] == GLM
        assert message["content"][0]["type"] == "text" and "Simulated answer" in message["content"][0]["text"]
        assert message["stop_reason"] == "end_turn" and message["usage"]["output_tokens"] > 0
    # The usage and cost of the batch are those of every attempt, as for the other batches, and shown on its
    # object (an extension) as the OpenAI-shaped batch object shows them.
    item = svc.table.get(*batch_key(batch["id"]))
    assert item["input_tokens"] > 0 and float(item["cost_usd"]) > 0
    answered = [line["result"]["message"]["usage"] for line in lines]
    assert got["usage"] == {"input_tokens": sum(u["input_tokens"] for u in answered),
                            "output_tokens": sum(u["output_tokens"] for u in answered),
                            "total_tokens": sum(u["input_tokens"] + u["output_tokens"] for u in answered)}
    assert got["cost_usd"] == round(float(item["cost_usd"]), 10) > 0 and got["cost_unknown_attempts"] == 0
    assert ok(messages("GET", ""))["data"][0]["usage"] == got["usage"]  # listed the same way
    assert ok(messages("DELETE", f"/{batch['id']}")) == {"id": batch["id"], "type": "message_batch_deleted"}
    anthropic_error(messages("GET", f"/{batch['id']}"), 404, "not_found_error")


def test_results_keep_an_anthropic_backends_message_as_it_sent_it(messages, svc, sim_control):
    sim_control.put("/_sim/config", json={"answer_extra_json": AS_SENT})
    batch = messages.created([entry("q-0", model=CLAUDE), entry("q-1", "[[sim:big:40000]]", model=CLAUDE)])
    finish(svc, batch["id"])
    reply = messages("GET", f"/{batch['id']}/results", headers={"accept": "application/binary"})
    assert reply.text.count(AS_SENT) == 2
    for line in messages.results(batch["id"]):
        check_as_sent(line["result"]["message"]["timings"])


def test_both_base_urls_and_both_sdk_majors(api, svc):
    _, key = new_key(svc)
    for version, prefix in [(V1, ""), (V2, ""), (V1, "/anthropic"), (V2, "/anthropic")]:
        client = Messages(api, key, version, prefix)
        batch = client.created([entry("a")])
        finish(svc, batch["id"])
        got = ok(client("GET", f"/{batch['id']}"))
        assert got["results_url"].endswith(f"{prefix}/v1/messages/batches/{batch['id']}/results")
        assert client.results(batch["id"])[0]["result"]["type"] == "succeeded"


def test_headers_version_and_beta(api, messages, svc):
    body = {"requests": [entry("a")]}
    path = "/v1/messages/batches"
    anthropic_error(api("POST", path, messages.key, json_body=body), 400, "invalid_request_error",
                    "anthropic-version: header is required")
    anthropic_error(api("POST", path, messages.key, json_body=body, headers={"anthropic-version": "2024-01-01"}),
                    400, "invalid_request_error", "'2024-01-01' is not a version")
    anthropic_error(api("GET", path, messages.key, headers={"anthropic-version": V1,
                                                            "anthropic-beta": "message-batches-2024-09-24"}),
                    400, "invalid_request_error", "anthropic-beta")
    # No key: 401 whatever the headers.
    anthropic_error(api("GET", path), 401, "authentication_error")
    assert no_message_batches(messages)


def no_message_batches(messages: Messages) -> bool:
    return ok(messages("GET"))["data"] == []


def test_batch_shape_faults_refuse_the_whole_batch(messages, svc):
    cases = [
        ({"requests": []}, "requests"),
        ({"requests": [entry("a")], "extra": 1}, "extra: Extra inputs"),
        ({"requests": [entry("a"), {"custom_id": "b"}]}, "requests[1] (custom_id 'b').params: Field required"),
        ({"requests": [entry("a"), entry("a")]}, "requests[1] (custom_id 'a').custom_id: 'a' is used more than once"),
        ({"requests": [entry("x" * 65)]}, "custom_id: must be 1-64"),
        ({"requests": [entry("a b")]}, "requests[0] (custom_id 'a b').custom_id"),
        ({"requests": [{**entry("a"), "method": "POST"}]}, "requests[0] (custom_id 'a').method: Extra inputs"),
        ([entry("a")], "must be a JSON object"),
    ]
    for body, message in cases:
        anthropic_error(messages("POST", json_body=body), 400, "invalid_request_error", message)
    anthropic_error(messages("POST", body=b"{not json", headers={"content-type": "application/json"}), 400,
                    "invalid_request_error", "not valid JSON")
    settings(svc, max_requests_per_batch=2)
    anthropic_error(messages.create([entry("a"), entry("b"), entry("c")]), 400, "invalid_request_error",
                    "at most 2")
    settings(svc, max_body_bytes=1000)
    anthropic_error(messages.create([entry("a", "x" * 2000)]), 413, "request_too_large")
    assert no_message_batches(messages)


def test_each_request_is_checked_on_its_own(messages, svc, sim_control):
    _, restricted_key = new_key(svc, allowed_models=[GLM])
    requests = [
        entry("ok-1"),
        {"custom_id": "no-model", "params": {"max_tokens": 5, "messages": [{"role": "user", "content": "x"}]}},
        entry("unknown-model", model="no-such-model"),
        entry("thinking", thinking={"type": "enabled", "budget_tokens": 1024}),
        entry("server-tool", tools=[{"type": "web_search_20250305", "name": "web_search"}]),
        entry("sampling-under-v2", temperature=0.5),
        entry("auto", model="auto"),
        entry("top-k", top_k=5),
        entry("ok-2", "Name three primes"),
    ]
    batch = messages.created(requests)
    assert batch["request_counts"]["processing"] == len(requests)
    finish(svc, batch["id"])
    assert sim_requests(sim_control) == 2  # only the two valid requests reached the backend
    got = ok(messages("GET", f"/{batch['id']}"))
    assert got["request_counts"] == {"processing": 0, "succeeded": 2, "errored": 7, "canceled": 0, "expired": 0}
    by_id = {line["custom_id"]: line["result"] for line in messages.results(batch["id"])}
    assert list(by_id) == [r["custom_id"] for r in requests]  # submission order
    assert by_id["ok-1"]["type"] == by_id["ok-2"]["type"] == "succeeded"

    def errored(custom_id: str) -> dict:
        result = by_id[custom_id]
        assert result["type"] == "errored" and result["error"]["type"] == "error", result
        return result["error"]["error"]

    assert errored("no-model")["message"].startswith("model: Field required")
    assert errored("unknown-model") == {"type": "not_found_error", "message": "model: no-such-model"}
    assert errored("thinking")["message"].startswith("thinking")
    assert errored("server-tool")["message"].startswith("tools[0]")
    assert errored("sampling-under-v2")["message"] == (
        "temperature: not a parameter of the Messages API at anthropic-version 2026-10-21.")
    assert "auto model" in errored("auto")["message"]
    assert errored("top-k")["message"].startswith("top_k")
    # A model the key may not use reads like one that does not exist.
    limited = Messages(messages.api, restricted_key)
    other = limited.created([entry("claude", model=CLAUDE), entry("glm")])
    finish(svc, other["id"])
    lines = limited.results(other["id"])
    assert lines[0]["result"]["error"]["error"] == {"type": "not_found_error", "message": f"model: {CLAUDE}"}
    assert lines[1]["result"]["type"] == "succeeded"


def test_every_request_invalid_ends_at_once(messages, svc, sim_control):
    batch = messages.created([entry("a", model="nope"), entry("b", model="nope")])
    assert batch["processing_status"] == "ended", batch
    assert batch["request_counts"] == {"processing": 0, "succeeded": 0, "errored": 2, "canceled": 0, "expired": 0}
    assert [line["result"]["type"] for line in messages.results(batch["id"])] == ["errored", "errored"]
    assert sim_requests(sim_control) == 0


def test_sampling_parameters_under_2023_06_01_and_an_anthropic_backend(api, svc, sim_control):
    _, key = new_key(svc)
    client = Messages(api, key, V1, "")
    batch = client.created([entry("t", temperature=0.2, top_p=0.9, stop_sequences=["END"]),
                            entry("claude", "Hi Claude", model=CLAUDE, top_k=3,
                                  thinking={"type": "enabled", "budget_tokens": 1024}),
                            entry("tool", "look it up [[sim:tool:lookup]]",
                                  tools=[{"name": "lookup", "description": "Look up a word",
                                          "input_schema": {"type": "object"}}])])
    finish(svc, batch["id"])
    lines = {line["custom_id"]: line["result"] for line in client.results(batch["id"])}
    assert lines["t"]["type"] == "succeeded", lines["t"]
    # An anthropic-kind model gets the request as it is, thinking and top_k included.
    claude = lines["claude"]
    assert claude["type"] == "succeeded" and claude["message"]["model"] == CLAUDE, claude
    assert sim_control.get("/_sim/stats").json()["by_path"] == {"/v1/chat/completions": 2, "/v1/messages": 1}
    # A tool call comes back to the caller as a tool_use block with its input parsed.
    tool = lines["tool"]["message"]
    assert tool["stop_reason"] == "tool_use", tool
    block = next(b for b in tool["content"] if b["type"] == "tool_use")
    assert block["name"] == "lookup" and isinstance(block["input"], dict)


def test_backend_errors_become_errored_results_with_anthropic_types(messages, svc, sim_control):
    batch = messages.created([entry("rejected", "[[sim:400]] no"), entry("flaky", "[[sim:flaky:1:500]] hi"),
                              entry("claude-rejected", "[[sim:400]] no", model=CLAUDE)])
    finish(svc, batch["id"])
    lines = {line["custom_id"]: line["result"] for line in messages.results(batch["id"])}
    assert lines["rejected"]["error"]["error"]["type"] == "invalid_request_error", lines
    assert lines["claude-rejected"]["error"]["error"]["type"] == "invalid_request_error", lines
    assert "rejected by the simulated backend" in lines["claude-rejected"]["error"]["error"]["message"]
    assert lines["flaky"]["type"] == "succeeded"  # retried, as every batch request is


def test_an_errored_result_keeps_the_backends_error(messages, svc, sim_control):
    """An Anthropic backend's error envelope comes back as it sent it, with its request id; an OpenAI-compatible
    backend's error object keeps its own fields, its type one of Anthropic's."""
    batch = messages.created([entry("claude", "[[sim:400]] no", model=CLAUDE),
                              entry("overflow", "[[sim:context-overflow]] a long story")])
    finish(svc, batch["id"])
    lines = {line["custom_id"]: line["result"] for line in messages.results(batch["id"])}
    claude = lines["claude"]["error"]
    assert claude == {"type": "error", "error": {"type": "invalid_request_error",
                                                 "message": "Request rejected by the simulated backend"},
                      "request_id": claude["request_id"]}
    assert claude["request_id"].startswith("req_sim_")
    overflow = lines["overflow"]["error"]
    assert overflow["request_id"].startswith("req_sim_")
    assert overflow["error"] == {"type": "invalid_request_error", "message": CONTEXT_OVERFLOW, "code": 400,
                                 "n_prompt_tokens": overflow["error"]["n_prompt_tokens"], "n_ctx": 4096}


def test_cancel_then_delete(messages, svc):
    batch = messages.created([entry(f"r{i}") for i in range(5)])
    cancelled = ok(messages("POST", f"/{batch['id']}/cancel", body=b"", headers={"content-type": "application/json"}))
    assert cancelled["processing_status"] in ("canceling", "ended") and cancelled["cancel_initiated_at"]
    final = finish(svc, batch["id"])
    assert final["status"] == "cancelled"
    got = ok(messages("GET", f"/{batch['id']}"))
    assert got["processing_status"] == "ended"
    assert got["request_counts"] == {"processing": 0, "succeeded": 0, "errored": 0, "canceled": 5, "expired": 0}
    assert [line["result"] for line in messages.results(batch["id"])] == [{"type": "canceled"}] * 5
    # Cancelling an ended batch returns it unchanged.
    assert ok(messages("POST", f"/{batch['id']}/cancel"))["request_counts"] == got["request_counts"]
    assert ok(messages("DELETE", f"/{batch['id']}"))["type"] == "message_batch_deleted"
    anthropic_error(messages("DELETE", f"/{batch['id']}"), 404, "not_found_error")


def test_cancel_while_running_is_canceling_until_it_finishes(messages, svc):
    from batchinfer.scheduling.dispatcher import Dispatcher

    batch = messages.created([entry(f"r{i}") for i in range(3)])
    Dispatcher(svc).pass_once()  # its requests are dispatched (they hold slots) but have not run
    cancelled = ok(messages("POST", f"/{batch['id']}/cancel"))
    assert cancelled["processing_status"] == "canceling" and cancelled["results_url"] is None
    anthropic_error(messages("DELETE", f"/{batch['id']}"), 400, "invalid_request_error", "has not ended")
    finish(svc, batch["id"])
    got = ok(messages("GET", f"/{batch['id']}"))
    assert got["processing_status"] == "ended" and sum(got["request_counts"].values()) == 3


def test_expired_requests(messages, svc):
    batch = messages.created([entry("a"), entry("b", model="nope")])
    assert batch["expires_at"] > batch["created_at"]
    svc.clock = (lambda base=svc.clock: base() + 24 * 3600 + 1)
    final = finish(svc, batch["id"])
    assert final["status"] == "expired"
    got = ok(messages("GET", f"/{batch['id']}"))
    assert got["processing_status"] == "ended"
    assert got["request_counts"] == {"processing": 0, "succeeded": 0, "errored": 1, "canceled": 0, "expired": 1}
    assert [line["result"]["type"] for line in messages.results(batch["id"])] == ["expired", "errored"]


def test_list_pages_with_after_id_and_before_id(messages, svc, api):
    ids = [messages.created([entry("a")])["id"] for _ in range(5)]  # oldest first
    newest_first = ids[::-1]
    page = ok(messages("GET", query={"limit": 2}))
    assert [b["id"] for b in page["data"]] == newest_first[:2] and page["has_more"] is True
    assert (page["first_id"], page["last_id"]) == (newest_first[0], newest_first[1])
    seen, query = [], {"limit": 2}
    while True:  # the SDK's forward paging: after_id = last_id until has_more is false
        page = ok(messages("GET", query=query))
        seen += [b["id"] for b in page["data"]]
        if not page["has_more"]:
            break
        query = {"limit": 2, "after_id": page["last_id"]}
    assert seen == newest_first
    # Backwards: before_id = first_id, pages of the newer ones, each shown newest first.
    page = ok(messages("GET", query={"limit": 2, "before_id": ids[0]}))
    assert [b["id"] for b in page["data"]] == [ids[2], ids[1]] and page["has_more"] is True
    page = ok(messages("GET", query={"limit": 2, "before_id": page["first_id"]}))
    assert [b["id"] for b in page["data"]] == [ids[4], ids[3]] and page["has_more"] is False
    anthropic_error(messages("GET", query={"after_id": "msgbatch_nope"}), 400, "invalid_request_error", "after_id")
    anthropic_error(messages("GET", query={"limit": 0}), 400, "invalid_request_error", "limit")


def test_separate_from_openai_batches_and_other_accounts(messages, svc, api):
    from tests.helpers import req

    msg = messages.created([entry("a")])
    openai_batch = api.created(messages.key, [req("b")])
    # An id from one API reads as not found on the other; each list holds its own.
    error(api("GET", f"/v1/batches/{msg['id']}", messages.key), 404)
    anthropic_error(messages("GET", f"/{openai_batch['id']}"), 404, "not_found_error")
    assert [b["id"] for b in ok(api("GET", "/v1/batches", messages.key))["data"]] == [openai_batch["id"]]
    assert [b["id"] for b in ok(messages("GET"))["data"]] == [msg["id"]]
    _, other_key = new_key(svc)
    other = Messages(api, other_key)
    anthropic_error(other("GET", f"/{msg['id']}"), 404, "not_found_error")
    assert ok(other("GET"))["data"] == []


def test_idempotency_key(messages, svc):
    first = messages.create([entry("a")], idem="job-1")
    again = messages.create([entry("a")], idem="job-1")
    assert ok(first)["id"] == ok(again)["id"] and again.headers.get("idempotent-replayed") == "true"
    anthropic_error(messages.create([entry("b")], idem="job-1"), 409, "conflict_error")
    finish(svc, ok(first)["id"])
    ok(messages("DELETE", f"/{ok(first)['id']}"))
    anthropic_error(messages.create([entry("a")], idem="job-1"), 410, "gone_error")


def test_switched_off_refuses_create_and_keeps_the_rest(messages, svc):
    batch = messages.created([entry("a")])
    settings(svc, message_batches_enabled=False)
    anthropic_error(messages.create([entry("b")]), 403, "permission_error", "Message Batches are not enabled")
    ok(messages("GET", f"/{batch['id']}"))
    finish(svc, batch["id"])  # it keeps running
    assert messages.results(batch["id"])[0]["result"]["type"] == "succeeded"
    ok(messages("DELETE", f"/{batch['id']}"))


def test_large_results_redirect_to_storage(messages, svc):
    settings(svc, export_redirect_bytes=1000)
    batch = messages.created([entry(f"r{i}", "[[sim:big:2000]] hi") for i in range(3)])
    finish(svc, batch["id"])
    step_by_record(svc)
    reply = messages("GET", f"/{batch['id']}/results")
    assert reply.status == 302 and reply.headers["location"].startswith("http"), reply.text
