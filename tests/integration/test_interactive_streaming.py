"""Interactive `stream: true` (chat completions and messages) where the route can carry it: server-sent events
in each API's shapes, relayed from the backend (Messages on an `openai` backend translated as they come),
under the same lease, quota and price as a whole answer; refused with a 400 where it is off (the deployed
default). Through the API Lambda handler, which gathers the events into one body (as API Gateway would: the
reason the switch is off there); tests/e2e/test_interactive_sdk.py reads them as they come with the SDKs."""

from __future__ import annotations

import argparse
import asyncio
import json
import math

import pytest

from batchinfer.cli import admin
from batchinfer.domain import utc_day
from batchinfer.providers import http
from batchinfer.service.accounts import authenticate
from batchinfer.service.running import interactive
from local.servers import free_port
from tests.faults.harness import with_backend_url
from tests.helpers import AS_SENT, anthropic_error, check_as_sent, error, new_key, ok, settings
from tests.integration.test_interactive import CHAT, GLM, budget, spent
from tests.integration.test_message_batches import CLAUDE, V1, catalog_file, svc  # noqa: F401

PARAMS = {"max_tokens": 64, "messages": [{"role": "user", "content": "Name three primes."}]}


@pytest.fixture
def streaming(svc):  # noqa: F811
    settings(svc, interactive_streaming_enabled=True)
    return svc


def events(reply) -> list[tuple[str | None, object]]:
    """(event name, data) of each server-sent event of a whole body."""
    assert reply.status == 200, reply.text
    assert reply.content_type.startswith("text/event-stream"), reply.headers
    found = []
    for block in reply.text.strip().split("\n\n"):
        fields = dict(line.split(": ", 1) for line in block.splitlines())
        data = fields["data"]
        found.append((fields.get("event"), data if data == "[DONE]" else json.loads(data)))
    return found


def test_a_streamed_chat_completion_adds_up_to_the_whole_answer_at_the_same_cost(api, streaming):
    svc = streaming  # noqa: F811 (the fixture imported above, by another name)
    account, key = new_key(svc)
    whole = ok(api("POST", "/v1/chat/completions", key, json_body=CHAT))
    cost_whole = float(spent(svc, account["id"])["cost_usd"])
    streamed = events(api("POST", "/v1/chat/completions", key,
                          json_body={**CHAT, "stream": True, "stream_options": {"include_usage": True}}))
    assert streamed[-1] == (None, "[DONE]")
    chunks = [data for _, data in streamed[:-1]]
    assert {c["object"] for c in chunks} == {"chat.completion.chunk"}
    text = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"])
    assert text == whole["choices"][0]["message"]["content"] and len(chunks) > 4
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"] == whole["usage"]
    assert abs(float(spent(svc, account["id"])["cost_usd"]) - 2 * cost_whole) < 1e-12
    # Without include_usage the caller gets no usage chunk and no usage fields, yet the cost is still known.
    plain = [data for _, data in events(api("POST", "/v1/chat/completions", key, json_body={**CHAT, "stream": True}))]
    assert plain[-1] == "[DONE]" and all("usage" not in c and c["choices"] for c in plain[:-1])
    assert abs(float(spent(svc, account["id"])["cost_usd"]) - 3 * cost_whole) < 1e-12
    assert spent(svc, account["id"]).get("cost_unknown_attempts", 0) == 0
    assert budget(svc).get("interactive", 0) == 0  # every lease ended


def test_a_streamed_chunk_goes_on_as_the_backend_sent_it(api, streaming, sim_control):
    sim_control.put("/_sim/config", json={"answer_extra_json": AS_SENT})  # on the finishing chunk
    _, key = new_key(streaming)
    reply = api("POST", "/v1/chat/completions", key,
                json_body={**CHAT, "stream": True, "stream_options": {"include_usage": True}})
    assert AS_SENT in reply.text
    [finishing] = [d for _, d in events(reply)[:-1] if d["choices"] and d["choices"][0]["finish_reason"]]
    check_as_sent(finishing["timings"])


def test_a_message_streams_translated_from_an_openai_backend_and_passed_on_from_an_anthropic_one(api, streaming):
    svc = streaming  # noqa: F811 (the fixture imported above, by another name)
    account, key = new_key(svc)
    for model in (GLM, CLAUDE):
        whole = ok(api("POST", "/v1/messages", key, json_body={**PARAMS, "model": model},
                       headers={"anthropic-version": V1}))
        streamed = events(api("POST", "/anthropic/v1/messages", key,
                              json_body={**PARAMS, "model": model, "stream": True}, headers={"anthropic-version": V1}))
        names = [name for name, _ in streamed if name != "ping"]
        assert names[:2] == ["message_start", "content_block_start"]
        assert names[-3:] == ["content_block_stop", "message_delta", "message_stop"]
        assert all(name == data["type"] for name, data in streamed)
        text = "".join(d["delta"]["text"] for n, d in streamed if n == "content_block_delta")
        assert text == whole["content"][0]["text"], model
        delta = next(d for n, d in streamed if n == "message_delta")
        assert delta["delta"]["stop_reason"] == whole["stop_reason"]
        assert delta["usage"]["output_tokens"] == whole["usage"]["output_tokens"]
    assert spent(svc, account["id"]).get("cost_unknown_attempts", 0) == 0
    assert all(budget(svc, m).get("interactive", 0) == 0 for m in (GLM, CLAUDE))


def test_a_translated_tool_call_streams_as_a_tool_use_block(api, streaming):
    _, key = new_key(streaming)
    tool = {"name": "lookup", "input_schema": {"type": "object", "properties": {"query": {"type": "string"}}}}
    streamed = events(api("POST", "/v1/messages", key, headers={"anthropic-version": V1}, json_body={
        **PARAMS, "model": GLM, "stream": True, "tools": [tool],
        "messages": [{"role": "user", "content": "Look it up [[sim:tool:lookup]]"}]}))
    start = next(d for n, d in streamed if n == "content_block_start")
    assert start["content_block"]["type"] == "tool_use" and start["content_block"]["name"] == "lookup"
    assert start["content_block"]["id"].startswith("call_")  # the backend's id, as a whole answer keeps it
    partial = "".join(d["delta"]["partial_json"] for n, d in streamed if n == "content_block_delta")
    assert json.loads(partial) == {"query": "Simulated"}
    assert next(d for n, d in streamed if n == "message_delta")["delta"]["stop_reason"] == "tool_use"


def test_a_backend_refusal_before_the_stream_starts_is_an_ordinary_error(api, streaming):
    _, key = new_key(streaming)
    rejected = {**CHAT, "stream": True, "messages": [{"role": "user", "content": "no [[sim:400]]"}]}
    error(api("POST", "/v1/chat/completions", key, json_body=rejected), 400, "rejected")
    anthropic_error(api("POST", "/v1/messages", key, headers={"anthropic-version": V1},
                        json_body={**PARAMS, "model": GLM, "stream": "yes"}), 400, "invalid_request_error", "stream")
    error(api("POST", "/v1/chat/completions", key, json_body={**CHAT, "stream": "yes"}), 400, "stream")
    error(api("POST", "/v1/responses", key, json_body={"model": GLM, "input": "hi", "stream": True}), 400,
          "/v1/responses", code="stream_unsupported", param="stream")
    assert budget(streaming).get("interactive", 0) == 0


def test_a_backend_that_refuses_connections_answers_503_and_costs_nothing(api, streaming):
    """A connection the backend refused never carried the request: the caller is told the service is
    unavailable, whole or streamed, and nothing counts as cost unknown."""
    svc = streaming  # noqa: F811 (the fixture imported above, by another name)
    account, key = new_key(svc)
    with_backend_url(svc, GLM, f"http://127.0.0.1:{free_port()}/v1")  # nothing listens there
    for body in (CHAT, {**CHAT, "stream": True}):
        reply = api("POST", "/v1/chat/completions", key, json_body=body)
        assert reply.status == 503, reply.text
        assert reply.json()["error"]["code"] == "service_unavailable"
    for params in (PARAMS, {**PARAMS, "stream": True}):
        reply = api("POST", "/v1/messages", key, headers={"anthropic-version": V1}, json_body={**params, "model": GLM})
        assert reply.status == 503 and reply.json()["type"] == "error", reply.text
    assert spent(svc, account["id"]).get("cost_unknown_attempts", 0) == 0
    assert float(spent(svc, account["id"]).get("cost_usd", 0)) == 0
    assert budget(svc).get("interactive", 0) == 0


def test_a_stream_without_usage_is_charged_an_estimate_from_its_text(api, streaming, sim_control, capsys):
    """A backend that sends no usage on a stream that ran to its end (llama-cpp-python sends no usage chunk,
    even when asked) is charged for the request's text and the streamed text at 4 characters a token (the
    catalog's default), counted as an estimate, not as cost unknown."""
    svc = streaming  # noqa: F811 (the fixture imported above, by another name)
    sim_control.put("/_sim/config", json={"stream_usage": False})
    account, key = new_key(svc)
    asked = len("Name three primes.")  # the request's text (CHAT's and PARAMS' one message)

    def charged_for(text: str, model: str) -> float:
        price = svc.catalog.get(model).price
        return (math.ceil(asked / 4) * price.input_per_mtok + math.ceil(len(text) / 4) * price.output_per_mtok) / 1e6

    chat = events(api("POST", "/v1/chat/completions", key,
                      json_body={**CHAT, "stream": True, "stream_options": {"include_usage": True}}))
    assert chat[-1] == (None, "[DONE]") and not any(d.get("usage") for _, d in chat[:-1])
    text = "".join(d["choices"][0]["delta"].get("content") or "" for _, d in chat[:-1] if d["choices"])
    expected = charged_for(text, GLM)
    for model in (GLM, CLAUDE):  # a message translated from chat chunks, and one passed on as it came
        message = events(api("POST", "/v1/messages", key, headers={"anthropic-version": V1},
                             json_body={**PARAMS, "model": model, "stream": True}))
        assert message[-1][0] == "message_stop"
        expected += charged_for("".join(d["delta"]["text"] for n, d in message if n == "content_block_delta"), model)
    day = spent(svc, account["id"])
    assert day.get("cost_unknown_attempts", 0) == 0 and day["usage_estimated_attempts"] == 3
    assert expected > 0 and abs(float(day["cost_usd"]) - expected) < 1e-12
    # `batchctl admin usage` shows the day's spending with its estimated attempts.
    admin.run(argparse.Namespace(command="usage", account=account["id"]), svc)
    shown = json.loads(capsys.readouterr().out)
    assert shown["account"] == account["id"] and len(shown["days"]) == 3
    assert shown["days"][0] == {"day": utc_day(svc.now()), "cost_usd": round(float(day["cost_usd"]), 10),
                                "cost_unknown_attempts": 0, "usage_estimated_attempts": 3}
    assert all(d["cost_usd"] == 0 and d["usage_estimated_attempts"] == 0 for d in shown["days"][1:])
    assert budget(svc).get("interactive", 0) == 0 and budget(svc, CLAUDE).get("interactive", 0) == 0


def test_a_stream_cut_off_midway_tells_the_caller_and_counts_its_cost_as_unknown(api, streaming, monkeypatch):
    svc = streaming  # noqa: F811 (the fixture imported above, by another name)
    account, key = new_key(svc)
    relayed = http.Events.__aiter__

    async def breaking(self):
        count = 0
        async for item in relayed(self):
            if (count := count + 1) > 3:
                raise http.CutOff("The backend's stream broke off: ReadError")
            yield item

    monkeypatch.setattr(http.Events, "__aiter__", breaking)
    chat = events(api("POST", "/v1/chat/completions", key, json_body={**CHAT, "stream": True}))
    assert chat[-1][1]["error"]["message"] == "The backend's stream broke off: ReadError"
    message = events(api("POST", "/v1/messages", key, headers={"anthropic-version": V1},
                         json_body={**PARAMS, "model": CLAUDE, "stream": True}))
    assert message[-1] == ("error", {"type": "error", "error": {
        "type": "api_error", "message": "The backend's stream broke off: ReadError"}})
    day = spent(svc, account["id"])
    assert day["cost_unknown_attempts"] == 2 and float(day.get("cost_usd", 0)) == 0
    assert budget(svc).get("interactive", 0) == 0 and budget(svc, CLAUDE).get("interactive", 0) == 0


def test_a_caller_that_goes_away_midway_ends_the_lease_and_counts_the_cost_as_unknown(streaming):
    svc = streaming  # noqa: F811 (the fixture imported above, by another name)
    account, key = new_key(svc)

    async def read_two_then_leave() -> list[bytes]:
        streamed = await interactive.serve_openai(svc, authenticate(svc, key), "/v1/chat/completions",
                                                  {**CHAT, "stream": True})
        first = [await anext(streamed.events), await anext(streamed.events)]
        assert budget(svc)["interactive"] == 1  # held while the answer streams
        await streamed.events.aclose()  # what Starlette does when the connection drops
        return first

    first = asyncio.run(read_two_then_leave())
    assert all(chunk.startswith(b"data: {") for chunk in first)
    assert budget(svc).get("interactive", 0) == 0
    assert spent(svc, account["id"])["cost_unknown_attempts"] == 1


def test_where_streaming_is_off_stream_true_is_refused_saying_why(api, svc):  # noqa: F811
    _, key = new_key(svc)
    error(api("POST", "/v1/chat/completions", key, json_body={**CHAT, "stream": True}), 400,
          "whole", code="stream_unsupported", param="stream")
    anthropic_error(api("POST", "/v1/messages", key, json_body={**PARAMS, "model": GLM, "stream": True},
                        headers={"anthropic-version": V1}), 400, "invalid_request_error", "stream")
