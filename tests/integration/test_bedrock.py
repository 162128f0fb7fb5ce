"""Amazon Bedrock models through the HTTP API: inline batches, Message Batches, interactive chat completions,
messages and embeddings, run by the real worker through boto3's `bedrock-runtime` client against the simulated
backend's Converse and InvokeModel routes (SigV4 with dummy credentials, real botocore parsing); what Converse
cannot carry refused at intake naming the parameter; each Bedrock error class mapped to the service's rules."""

from __future__ import annotations

import base64
import json
import struct
from pathlib import Path

import pytest

from batchinfer.domain import utc_day
from batchinfer.layout import model_budget_key
from batchinfer.records import Usage
from tests.helpers import (
    anthropic_error,
    bedrock_embedder,
    catalog_with,
    error,
    finish,
    new_key,
    ok,
    req,
    services_in_use,
    sim_requests,
)
from tests.integration.test_message_batches import V1, Messages

CLAUDE = "claude-bedrock"  # the default catalog's Bedrock model
CLAUDE_ID = "us.anthropic.claude-haiku-4-5-20251001-v1:0"
TITAN, COHERE = "titan-embed-bedrock", "cohere-embed-bedrock"
PNG = base64.b64encode(b"\x89PNG\r\n\x1a\n" + b"\0" * 16).decode()


@pytest.fixture
def catalog_file(tmp_path: Path) -> Path:
    """The default catalog plus two Bedrock embedding models (Titan text and Cohere embed bodies)."""
    return catalog_with(tmp_path, bedrock_embedder(TITAN, "amazon.titan-embed-text-v2:0", "titan"),
                        bedrock_embedder(COHERE, "cohere.embed-english-v3", "cohere"))


@pytest.fixture
def svc(svc, sim, catalog_file):
    with services_in_use(svc, sim.url, "bedrock", models_file=str(catalog_file), message_batches_enabled=True,
                         embeddings_responses_batches_enabled=True, interactive_streaming_enabled=True) as services:
        yield services


def converse_calls(sim_control) -> int:
    paths = sim_control.get("/_sim/stats").json()["by_path"]
    return sum(n for path, n in paths.items() if path.startswith("/model/") and path.endswith("/converse"))


def cost(svc, model: str, usage: dict) -> float:
    price = svc.catalog.get(model).price
    return (usage["prompt_tokens"] * price.input_per_mtok + usage["completion_tokens"] * price.output_per_mtok) / 1e6


def test_an_inline_batch_runs_on_bedrock_with_its_usage_and_cost(api, svc, sim_control):
    _, key = new_key(svc)
    batch = api.created(key, [req("q-0", "Summarize Hamlet", model=CLAUDE, max_tokens=40),
                              req("q-1", "Name three primes", model=CLAUDE, temperature=0.2, top_p=0.9,
                                  stop=["END"])])
    final = finish(svc, batch["id"])
    assert final["status"] == "completed"
    page = ok(api.results(key, batch["id"]))["data"]
    assert [r["status"] for r in page] == ["completed", "completed"]
    body = page[0]["response"]["body"]
    assert body["object"] == "chat.completion" and body["model"] == CLAUDE
    assert body["choices"][0]["message"]["content"].startswith(f"Simulated answer from {CLAUDE_ID} to: Summarize")
    assert body["choices"][0]["finish_reason"] == "stop"
    assert body["usage"]["prompt_tokens"] == 2 + 3 and body["usage"]["completion_tokens"] > 0
    assert page[0]["response"]["request_id"].startswith("req_sim_")  # Bedrock's x-amzn-RequestId
    assert converse_calls(sim_control) == 2
    total = sum(cost(svc, CLAUDE, r["response"]["body"]["usage"]) for r in page)
    shown = ok(api("GET", f"/v1/batches/{batch['id']}", key))
    assert abs(shown["cost_usd"] - total) < 1e-9 and shown["cost_unknown_attempts"] == 0
    tokens = sum(r["response"]["body"]["usage"]["total_tokens"] for r in page)
    assert shown["usage"]["total_tokens"] == tokens


def test_a_file_batch_line_that_converse_cannot_carry_is_refused_naming_the_parameter(api, svc, sim_control):
    _, key = new_key(svc)
    for extra, param in (({"seed": 7}, "seed"), ({"n": 2}, "n"), ({"logprobs": True}, "logprobs"),
                         ({"response_format": {"type": "json_object"}}, "response_format"),
                         ({"tool_choice": "none", "tools": [{"type": "function", "function": {"name": "f"}}]},
                          "tool_choice")):
        reply = api.create(key, [req("a", model=CLAUDE, **extra)])
        error(reply, 400, f"{param}: ")
    assert sim_requests(sim_control) == 0


def test_interactive_chat_carries_system_turns_tools_images_and_answers_tool_calls(api, svc, sim_control):
    _, key = new_key(svc)
    tools = [{"type": "function", "function": {"name": "search", "description": "Look it up",
                                               "parameters": {"type": "object", "properties": {}}}}]
    called = ok(api("POST", "/v1/chat/completions", key, json_body={
        "model": CLAUDE, "tools": tools, "tool_choice": "auto",
        "messages": [{"role": "system", "content": "Be brief."},
                     {"role": "user", "content": [
                         {"type": "text", "text": "What is this? [[sim:tool:search]]"},
                         {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{PNG}"}}]}]}))
    choice = called["choices"][0]
    assert choice["finish_reason"] == "tool_calls" and choice["message"]["content"] is None
    [call] = choice["message"]["tool_calls"]
    assert call["type"] == "function" and call["function"]["name"] == "search"
    assert call["id"].startswith("tooluse_") and call["function"]["arguments"] == '{"query": "Simulated"}'
    # The tool's answer goes back; the model answers in text.
    answered = ok(api("POST", "/v1/chat/completions", key, json_body={
        "model": CLAUDE, "tools": tools, "max_completion_tokens": 64,
        "messages": [{"role": "user", "content": "What is this?"}, choice["message"],
                     {"role": "tool", "tool_call_id": call["id"], "content": "a png"}]}))
    assert answered["choices"][0]["finish_reason"] == "stop"
    assert answered["choices"][0]["message"]["content"].startswith(f"Simulated answer from {CLAUDE_ID}")
    # Cut at max_tokens: finish_reason "length".
    cut = ok(api("POST", "/v1/chat/completions", key, json_body={
        "model": CLAUDE, "max_tokens": 2, "messages": [{"role": "user", "content": "Tell me a story"}]}))
    assert cut["choices"][0]["finish_reason"] == "length" and cut["usage"]["completion_tokens"] == 2


def test_interactive_refusals_name_the_parameter_and_send_nothing(api, svc, sim_control):
    _, key = new_key(svc)
    base = {"model": CLAUDE, "messages": [{"role": "user", "content": "hi"}]}
    for extra, param in (({"stream": True, "stream_options": {"include_obfuscation": True}}, "stream_options"),
                         ({"seed": 1}, "seed"), ({"logprobs": True}, "logprobs"),
                         ({"reasoning_effort": "low"}, "reasoning_effort"),
                         ({"messages": [{"role": "user", "content": [
                             {"type": "image_url", "image_url": {"url": "https://example.com/a.png"}}]}]},
                          "messages[0].content[0].image_url.url")):
        error(api("POST", "/v1/chat/completions", key, json_body={**base, **extra}), 400, f"{param}: ", param=param)
    thinking = {"model": CLAUDE, "max_tokens": 10, "stream": True, "thinking": {"type": "enabled", "budget_tokens": 9},
                "messages": [{"role": "user", "content": "hi"}]}
    anthropic_error(api("POST", "/v1/messages", key, json_body=thinking, headers={"anthropic-version": V1}), 400,
                    "invalid_request_error", "thinking: ")
    assert sim_requests(sim_control) == 0


def sse(reply) -> list[tuple[str | None, object]]:
    assert reply.status == 200 and reply.content_type.startswith("text/event-stream"), reply.text
    found = []
    for block in reply.text.strip().split("\n\n"):
        fields = dict(line.split(": ", 1) for line in block.splitlines())
        data = fields["data"]
        found.append((fields.get("event"), data if data == "[DONE]" else json.loads(data)))
    return found


def test_stream_true_streams_through_converse_stream_at_the_same_cost(api, svc, sim_control):
    """The simulated runtime sends real application/vnd.amazon.eventstream frames; botocore parses them."""
    account, key = new_key(svc)
    chat = {"model": CLAUDE, "messages": [{"role": "user", "content": "Name three primes"}]}
    whole = ok(api("POST", "/v1/chat/completions", key, json_body=chat))
    streamed = sse(api("POST", "/v1/chat/completions", key,
                       json_body={**chat, "stream": True, "stream_options": {"include_usage": True}}))
    assert streamed[-1] == (None, "[DONE]")
    chunks = [data for _, data in streamed[:-1]]
    text = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"])
    assert text == whole["choices"][0]["message"]["content"] and len(chunks) > 4
    assert chunks[-2]["choices"][0]["finish_reason"] == "stop"
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"] == whole["usage"]
    day = Usage.get(svc.table, account["id"], utc_day(svc.now()))
    assert abs(float(day["cost_usd"]) - 2 * cost(svc, CLAUDE, whole["usage"])) < 1e-12
    assert day.get("cost_unknown_attempts", 0) == 0
    paths = sim_control.get("/_sim/stats").json()["by_path"]
    assert sum(n for p, n in paths.items() if p.endswith("/converse-stream")) == 1
    # A Messages stream, with a tool call: the Anthropic events, translated as they come.
    message = sse(api("POST", "/v1/messages", key, headers={"anthropic-version": V1}, json_body={
        "model": CLAUDE, "max_tokens": 64, "stream": True, "tools": [{"name": "search", "input_schema": {}}],
        "messages": [{"role": "user", "content": "Look up [[sim:tool:search]]"}]}))
    names = [name for name, _ in message]
    assert names[0] == "message_start" and names[-2:] == ["message_delta", "message_stop"]
    [start] = [data for name, data in message if name == "content_block_start"]
    assert start["content_block"]["type"] == "tool_use" and start["content_block"]["name"] == "search"
    [delta] = [data for name, data in message if name == "content_block_delta"]
    assert json.loads(delta["delta"]["partial_json"]) == {"query": "Simulated"}
    assert message[-2][1]["delta"]["stop_reason"] == "tool_use" and message[-2][1]["usage"]["output_tokens"] > 0
    # Cut off before its end: the caller is told, the cost is unknown.
    cut = sse(api("POST", "/v1/chat/completions", key, json_body={**chat, "stream": True, "messages": [
        {"role": "user", "content": "cut [[sim:cut-stream]]"}]}))
    assert "error" in cut[-1][1]
    assert Usage.get(svc.table, account["id"], utc_day(svc.now()))["cost_unknown_attempts"] == 1


def test_interactive_messages_on_bedrock(api, svc, sim_control):
    _, key = new_key(svc)
    message = ok(api("POST", "/v1/messages", key, headers={"anthropic-version": V1}, json_body={
        "model": CLAUDE, "max_tokens": 64, "system": "Be brief.", "top_k": 5, "stop_sequences": ["###"],
        "messages": [{"role": "user", "content": "Hello there"}]}))
    assert message["type"] == "message" and message["stop_reason"] == "end_turn"
    assert message["content"][0]["text"].startswith(f"Simulated answer from {CLAUDE_ID} to: Hello there")
    assert message["usage"]["input_tokens"] == 2 + 2 + 3 + 3 and message["usage"]["output_tokens"] > 0


def test_a_message_batch_on_bedrock_with_tools_and_a_refused_request(api, svc, sim_control):
    _, key = new_key(svc)
    messages = Messages(api, key)
    tools = [{"name": "search", "input_schema": {"type": "object"}}]
    batch = messages.created([
        {"custom_id": "tool", "params": {"model": CLAUDE, "max_tokens": 64, "tools": tools,
                                         "tool_choice": {"type": "any"},
                                         "messages": [{"role": "user", "content": "Look up [[sim:tool:search]]"}]}},
        {"custom_id": "loop", "params": {"model": CLAUDE, "max_tokens": 64, "tools": tools, "messages": [
            {"role": "user", "content": "Look it up"},
            {"role": "assistant", "content": [{"type": "tool_use", "id": "toolu_1", "name": "search", "input": {}}]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "none found",
                                          "is_error": True}]}]}},
        {"custom_id": "thinking", "params": {"model": CLAUDE, "max_tokens": 64,
                                             "thinking": {"type": "enabled", "budget_tokens": 1024},
                                             "messages": [{"role": "user", "content": "hi"}]}}])
    finish(svc, batch["id"])
    results = {line["custom_id"]: line["result"] for line in messages.results(batch["id"])}
    tool = results["tool"]["message"]
    assert results["tool"]["type"] == "succeeded" and tool["stop_reason"] == "tool_use"
    assert tool["content"] == [{"type": "tool_use", "id": tool["content"][0]["id"], "name": "search",
                                "input": {"query": "Simulated"}}]
    assert results["loop"]["type"] == "succeeded" and results["loop"]["message"]["stop_reason"] == "end_turn"
    assert results["thinking"]["type"] == "errored"
    assert results["thinking"]["error"]["error"]["message"].startswith("thinking: ")
    assert converse_calls(sim_control) == 2


def test_embeddings_through_invoke_model_in_titan_and_cohere_bodies(api, svc, sim_control):
    _, key = new_key(svc)
    for model in (TITAN, COHERE):
        answer = ok(api("POST", "/v1/embeddings", key, json_body={"model": model, "input": ["one two", "three"]}))
        assert [d["index"] for d in answer["data"]] == [0, 1] and len(answer["data"][0]["embedding"]) == 8
        assert answer["usage"] == {"prompt_tokens": 3, "total_tokens": 3}, model
        packed = ok(api("POST", "/v1/embeddings", key, json_body={"model": model, "input": "one two",
                                                                   "encoding_format": "base64"}))
        vector = struct.unpack("<8f", base64.b64decode(packed["data"][0]["embedding"]))
        assert [round(v, 5) for v in vector] == [round(v, 5) for v in answer["data"][0]["embedding"]]
    error(api("POST", "/v1/embeddings", key, json_body={"model": COHERE, "input": "x", "dimensions": 256}), 400,
          "dimensions: ", param="dimensions")
    error(api("POST", "/v1/embeddings", key, json_body={"model": TITAN, "input": [[1, 2]]}), 400, "input: ")
    paths = sim_control.get("/_sim/stats").json()["by_path"]
    assert sum(n for p, n in paths.items() if p.endswith("/invoke")) == 3 + 2  # Titan: a call per text


# Bedrock's error class -> (status the caller sees, the OpenAI error type's status, the service's code, retried)
ERROR_CLASSES = {
    "ThrottlingException": (429, "rate_limited", True),
    "ServiceQuotaExceededException": (429, "rate_limited", True),
    "ModelTimeoutException": (502, "timeout", True),
    "ServiceUnavailableException": (503, "service_unavailable", True),
    "ModelNotReadyException": (503, "service_unavailable", True),
    "InternalServerException": (502, "upstream_error", True),
    "ValidationException": (400, "invalid_request", False),
    "AccessDeniedException": (403, "forbidden", False),
    "ResourceNotFoundException": (404, "model_not_found", False),
    "ModelErrorException": (502, "upstream_error", True),
}


def test_each_bedrock_error_class_maps_to_the_services_rules(api, svc, sim_control):
    _, key = new_key(svc)
    svc.settings = svc.settings.model_copy(update={"max_attempts": 2})
    batch = api.created(key, [req(name, f"x [[sim:bedrock:{name}]]", model=CLAUDE) for name in ERROR_CLASSES])
    finish(svc, batch["id"])
    page = {r["custom_id"]: r for r in ok(api.results(key, batch["id"]))["data"]}
    for name, (_, code, _) in ERROR_CLASSES.items():
        failed = page[name]
        assert failed["status"] == "failed" and failed["error"]["code"] == code, (name, failed["error"])
        assert failed["error"]["message"] == f"Amazon Bedrock {name}: Simulated {name}", failed["error"]
        assert failed["error"]["request_id"].startswith("req_sim_"), failed["error"]
    paths = sim_control.get("/_sim/stats").json()["by_status"]
    retried = sum(2 if r else 1 for _, _, r in ERROR_CLASSES.values())
    assert converse_calls(sim_control) == retried, paths
    # Interactive: the status a caller sees.
    for name, (status, _, _) in ERROR_CLASSES.items():
        reply = api("POST", "/v1/chat/completions", key, json_body={
            "model": CLAUDE, "messages": [{"role": "user", "content": f"x [[sim:bedrock:{name}]]"}]})
        assert reply.status == status, (name, reply.status, reply.text)
        assert f"Amazon Bedrock {name}" in reply.json()["error"]["message"]


def test_a_throttled_request_is_retried_and_backs_the_budget_off(api, svc, sim_control):
    _, key = new_key(svc)
    batch = api.created(key, [req("a", "Hello [[sim:flaky:2:429]]", model=CLAUDE)])
    finish(svc, batch["id"])
    final = ok(api("GET", f"/v1/batches/{batch['id']}", key))
    assert final["request_counts"] == {"total": 1, "completed": 1, "failed": 0}
    assert converse_calls(sim_control) == 3
    assert sim_control.get("/_sim/stats").json()["by_status"]["429"] == 2
    # The adaptive cap backed off from the model's budget (8), as for any backend's 429.
    cap = svc.table.get(*model_budget_key(CLAUDE))["adaptive_cap"]
    assert svc.catalog.get(CLAUDE).batch_floor <= cap < svc.catalog.get(CLAUDE).batch_budget


def test_a_lost_connection_and_a_timeout_are_told_apart_by_what_they_may_have_cost(svc, sim_control):
    """No connection: the call never reached Bedrock (it cost nothing, unsent). No answer in time after it was
    sent: Bedrock may have run it (cost unknown), as for the HTTP kinds."""
    import asyncio

    from batchinfer.providers import call_backend
    from local.servers import free_port

    model = svc.catalog.get(CLAUDE)
    closed = model.model_copy(update={"backend": model.backend.model_copy(
        update={"endpoint_url": f"http://127.0.0.1:{free_port()}"})})
    body = {"model": CLAUDE, "messages": [{"role": "user", "content": "hi"}]}
    unsent = asyncio.run(call_backend(closed, "/v1/chat/completions", body, None, 2.0))
    assert (unsent.status_code, unsent.sent, unsent.cost_known) == (None, False, True), unsent
    assert unsent.error()["code"] == "service_unavailable"
    sim_control.put("/_sim/config", json={"latency_seconds": 3})
    late = asyncio.run(call_backend(model, "/v1/chat/completions", body, None, 0.5))
    assert (late.status_code, late.sent, late.cost_known) == (None, True, False), late
    assert late.error()["code"] == "timeout"


def test_a_json_schema_goes_as_output_config_to_a_model_that_takes_it(svc, sim_control):
    """botocore validates and sends Converse's outputConfig; a model without the feature refuses it at intake."""
    import asyncio

    from batchinfer.providers import call_backend

    model = svc.catalog.get(CLAUDE)
    structured = model.model_copy(update={"backend": model.backend.model_copy(
        update={"features": ["structured_outputs"]})})
    body = {"model": CLAUDE, "messages": [{"role": "user", "content": "hi"}], "response_format": {
        "type": "json_schema", "json_schema": {"name": "a", "schema": {"type": "object"}, "strict": True}}}
    ran = asyncio.run(call_backend(structured, "/v1/chat/completions", body, None, 5.0))
    assert ran.ok and ran.body["object"] == "chat.completion", ran
    refused = asyncio.run(call_backend(model, "/v1/chat/completions", body, None, 5.0))
    assert refused.status_code == 400 and not refused.sent and refused.message.startswith("response_format: ")
    assert converse_calls(sim_control) == 1


def test_thinking_reaches_a_model_that_takes_it_and_comes_back_as_thinking_blocks(svc, sim_control):
    import asyncio

    from batchinfer.providers import call_backend, open_stream

    model = svc.catalog.get(CLAUDE)
    thinker = model.model_copy(update={"backend": model.backend.model_copy(update={"features": ["thinking"]})})
    params = {"model": CLAUDE, "max_tokens": 2048, "thinking": {"type": "enabled", "budget_tokens": 1024},
              "messages": [{"role": "user", "content": "Why is the sky blue?"}]}
    ran = asyncio.run(call_backend(thinker, "/v1/messages", params, None, 5.0))
    assert ran.ok, ran
    thought, text = ran.body["content"]
    assert thought["type"] == "thinking" and thought["thinking"].startswith("Thinking about: Why is the sky")
    assert thought["signature"].startswith("sig_") and text["type"] == "text"
    # Back again in the next turn, signature and all.
    again = {**params, "messages": [*params["messages"], {"role": "assistant", "content": ran.body["content"]},
                                    {"role": "user", "content": "And at sunset?"}]}
    assert asyncio.run(call_backend(thinker, "/v1/messages", again, None, 5.0)).ok
    # Streamed, it would be lost on the way: refused, unsent.
    streamed = asyncio.run(open_stream(thinker, "/v1/messages", params, None, 5.0))
    assert streamed.status_code == 400 and not streamed.sent and streamed.message.startswith("thinking: ")
    assert converse_calls(sim_control) == 2
