"""Tests for the simulated model backend (local/simulated_backend.py), a deterministic test double."""

from __future__ import annotations

import asyncio
import base64
import json
import os
import re
import socket
import statistics
import struct
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi.testclient import TestClient

from local.simulated_answers import EMBEDDING_DIM
from local.simulated_backend import SimConfig, create_app, latency_of

REPO_ROOT = Path(__file__).resolve().parents[2]
CHAT = "/v1/chat/completions"


def chat_body(text: str = "What is the capital of France?", model: str = "gpt-sim", **extra: Any) -> dict:
    return {"model": model, "messages": [{"role": "system", "content": "Be brief."},
                                         {"role": "user", "content": text}], **extra}


@pytest.fixture
def client() -> TestClient:
    return TestClient(create_app())


def make_client(**config: Any) -> TestClient:
    return TestClient(create_app(SimConfig(**config)))


def assert_openai_error(resp: httpx.Response, status: int) -> dict:
    assert resp.status_code == status, resp.text
    err = resp.json()["error"]
    assert set(err) == {"message", "type", "param", "code"}
    return err


# --- chat completions -------------------------------------------------------------------------------

def test_chat_shape_and_determinism(client: TestClient) -> None:
    first = client.post(CHAT, json=chat_body()).json()
    second = client.post(CHAT, json=chat_body()).json()
    assert first["object"] == "chat.completion"
    assert first["id"].startswith("chatcmpl-") and first["id"] == second["id"]
    assert isinstance(first["created"], int)
    assert first["model"] == "gpt-sim"
    choice = first["choices"][0]
    assert choice["message"]["role"] == "assistant"
    assert choice["finish_reason"] == "stop"
    content = choice["message"]["content"]
    assert content.startswith("Simulated answer from gpt-sim to: What is the capital of France?")
    assert content == second["choices"][0]["message"]["content"]


def test_different_input_gives_different_output(client: TestClient) -> None:
    base = client.post(CHAT, json=chat_body()).json()
    other_text = client.post(CHAT, json=chat_body("What is the capital of Spain?")).json()
    other_model = client.post(CHAT, json=chat_body(model="other-model")).json()
    contents = {r["choices"][0]["message"]["content"] for r in (base, other_text, other_model)}
    assert len(contents) == 3
    assert len({r["id"] for r in (base, other_text, other_model)}) == 3
    assert other_model["model"] == "other-model"


def test_answer_truncates_long_message_and_hides_markers(client: TestClient) -> None:
    long_text = "x" * 200
    content = client.post(CHAT, json=chat_body(long_text)).json()["choices"][0]["message"]["content"]
    assert "x" * 60 in content and "x" * 61 not in content
    content = client.post(CHAT, json=chat_body("hi [[sim:big:10]]")).json()["choices"][0]["message"]["content"]
    assert "[[sim:" not in content


def test_usage_counts(client: TestClient) -> None:
    body = chat_body("one two three four")  # system "Be brief." = 2 words, 2 messages
    data = client.post(CHAT, json=body).json()
    usage = data["usage"]
    assert usage["prompt_tokens"] == 2 + 4 + 3 * 2
    assert usage["completion_tokens"] == len(data["choices"][0]["message"]["content"].split())
    assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]


@pytest.mark.parametrize("param", ["max_tokens", "max_completion_tokens"])
def test_max_tokens_truncation(client: TestClient, param: str) -> None:
    full = client.post(CHAT, json=chat_body()).json()
    data = client.post(CHAT, json=chat_body(**{param: 3})).json()
    assert data["choices"][0]["finish_reason"] == "length"
    assert data["usage"]["completion_tokens"] == 3
    words = full["choices"][0]["message"]["content"].split()
    assert data["choices"][0]["message"]["content"] == " ".join(words[:3])
    roomy = client.post(CHAT, json=chat_body(**{param: 1000})).json()
    assert roomy["choices"][0]["finish_reason"] == "stop"


def test_multimodal_content_parts(client: TestClient) -> None:
    parts = [{"type": "text", "text": "describe"}, {"type": "image_url", "image_url": {"url": "data:x"}}]
    data = client.post(CHAT, json={"model": "m", "messages": [{"role": "user", "content": parts}]}).json()
    assert "to: describe" in data["choices"][0]["message"]["content"]


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"messages": [{"role": "user", "content": "hi"}]}, "model"),
        ({"model": "m"}, "messages"),
        ({"model": "m", "messages": "hi"}, "messages"),
        ({"model": "m", "messages": []}, "messages"),
        ({"model": "m", "messages": [{"content": "no role"}]}, "messages[0]"),
        ({"model": "m", "messages": [{"role": "user", "content": 5}]}, "messages[0].content"),
        (chat_body(max_tokens=0), "max_tokens"),
        (chat_body(stream="yes"), "stream"),
        (chat_body(temperature="hot"), "temperature"),
        (chat_body(top_p=True), "top_p"),
        (chat_body(n="2"), "n"),
        (chat_body(logprobs="yes"), "logprobs"),
        (chat_body(stop=[1]), "stop"),
        ([1, 2], None),
    ],
)
def test_invalid_bodies_are_400(client: TestClient, body: Any, param: str | None) -> None:
    err = assert_openai_error(client.post(CHAT, json=body), 400)
    assert err["type"] == "invalid_request_error"
    assert err["param"] == param


def test_unparseable_json_is_400(client: TestClient) -> None:
    resp = client.post(CHAT, content=b"{not json", headers={"content-type": "application/json"})
    assert_openai_error(resp, 400)


def _sse(text: str) -> list[tuple[str | None, Any]]:
    found = []
    for block in text.strip().split("\n\n"):
        fields = dict(line.split(": ", 1) for line in block.splitlines())
        data = fields["data"]
        found.append((fields.get("event"), data if data == "[DONE]" else json.loads(data)))
    return found


def test_stream_is_the_same_answer_a_word_per_chunk(client: TestClient) -> None:
    whole = client.post(CHAT, json=chat_body()).json()
    resp = client.post(CHAT, json=chat_body(stream=True, stream_options={"include_usage": True}))
    assert resp.status_code == 200 and resp.headers["content-type"].startswith("text/event-stream")
    events = _sse(resp.text)
    assert events[-1] == (None, "[DONE]")
    chunks = [data for _, data in events[:-1]]
    assert "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"]) == \
        whole["choices"][0]["message"]["content"]
    assert chunks[-1]["usage"] == whole["usage"] and chunks[-2]["choices"][0]["finish_reason"] == "stop"
    plain = [data for _, data in _sse(client.post(CHAT, json=chat_body(stream=True)).text)[:-1]]
    assert all("usage" not in c for c in plain)  # only with stream_options.include_usage, as OpenAI


def test_stream_refused_where_the_endpoint_does_not_stream(client: TestClient) -> None:
    err = assert_openai_error(client.post("/v1/responses", json={"model": "m", "input": "hi", "stream": True}), 400)
    assert "stream" in err["message"]


def test_reject_markers_are_400(client: TestClient) -> None:
    assert_openai_error(client.post(CHAT, json=chat_body(model="reject-me")), 400)
    assert_openai_error(client.post(CHAT, json=chat_body("please [[sim:400]]")), 400)


def test_context_overflow_answers_llama_servers_own_error_body(client: TestClient) -> None:
    resp = client.post(CHAT, json=chat_body("a long story [[sim:context-overflow]]"))
    assert resp.status_code == 400
    error = resp.json()["error"]
    assert set(error) == {"code", "message", "type", "n_prompt_tokens", "n_ctx"}
    assert (error["code"], error["type"], error["n_ctx"]) == (400, "exceed_context_size_error", 4096)
    assert error["n_prompt_tokens"] > error["n_ctx"]


def test_every_answer_carries_a_request_id(client: TestClient) -> None:
    ids = [client.post(CHAT, json=chat_body(text)).headers["x-request-id"] for text in ("a", "b [[sim:400]]")]
    assert all(i.startswith("req_sim_") for i in ids) and ids[0] != ids[1]
    message = client.post("/v1/messages", json={"model": "m", "max_tokens": 8,
                                                "messages": [{"role": "user", "content": "hi"}]})
    assert message.headers["request-id"].startswith("req_sim_")


def test_answer_extra_json_is_added_to_whole_answers_as_it_is_written() -> None:
    extra = '"timings":{"prompt_per_second":12500.0,"predicted_ms":1e-7}'
    client = make_client(answer_extra_json=extra)
    resp = client.post(CHAT, json=chat_body())
    assert resp.text.endswith("," + extra + "}") and resp.json()["choices"]
    assert client.put("/_sim/config", json={"answer_extra_json": '"a":'}).status_code == 400


def test_stream_usage_off_never_sends_the_usage_chunk() -> None:
    client = make_client(stream_usage=False)
    resp = client.post(CHAT, json=chat_body(stream=True, stream_options={"include_usage": True}))
    chunks = [data for _, data in _sse(resp.text)[:-1]]
    assert chunks and all("usage" not in c for c in chunks) and _sse(resp.text)[-1][1] == "[DONE]"


def test_fail_always_is_500_every_time(client: TestClient) -> None:
    for _ in range(3):
        err = assert_openai_error(client.post(CHAT, json=chat_body("x [[sim:fail-always]]")), 500)
        assert err["type"] == "server_error"


@pytest.mark.parametrize("size", [50, 5_000, 1_000_000])
def test_big_answer_size(client: TestClient, size: int) -> None:
    resp = client.post(CHAT, json=chat_body(f"give me a lot [[sim:big:{size}]]"))
    content = resp.json()["choices"][0]["message"]["content"]
    assert size - 20 <= len(content.encode()) <= size
    assert resp.json()["usage"]["completion_tokens"] == len(content.split())


# --- faults -----------------------------------------------------------------------------------------

def test_rate_429_always() -> None:
    client = make_client(rate_429=1.0)
    for _ in range(5):
        resp = client.post(CHAT, json=chat_body())
        err = assert_openai_error(resp, 429)
        assert resp.headers["retry-after"] == "1"
        assert err["code"] == "rate_limit_exceeded"


def test_rates_zero_never_fail(client: TestClient) -> None:
    assert all(client.post(CHAT, json=chat_body(f"q{i}")).status_code == 200 for i in range(50))


def test_rate_500_and_timeout() -> None:
    client = make_client(rate_500=1.0)
    assert_openai_error(client.post(CHAT, json=chat_body()), 500)
    client = make_client(rate_timeout=1.0, timeout_sleep_seconds=0.05)
    start = time.monotonic()
    assert_openai_error(client.post(CHAT, json=chat_body()), 504)
    assert time.monotonic() - start >= 0.05


def test_timeout_makes_client_timeout_fire() -> None:
    async def run() -> dict:
        app = create_app(SimConfig(rate_timeout=1.0))  # default timeout_sleep_seconds = 30
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://sim") as c:
            with pytest.raises(TimeoutError):
                await asyncio.wait_for(c.post(CHAT, json=chat_body()), 0.2)
            return (await c.get("/_sim/stats")).json()

    stats = asyncio.run(run())
    assert stats["in_flight"] == 0 and stats["by_status"] == {"499": 1}  # abandoned request is recorded


def test_partial_rates_are_seeded_and_reproducible() -> None:
    def statuses(seed: int) -> list[int]:
        client = make_client(rate_429=0.3, rate_500=0.3, seed=seed)
        return [client.post(CHAT, json=chat_body(f"q{i}")).status_code for i in range(40)]

    first = statuses(7)
    assert first == statuses(7)
    assert {200, 429, 500} == set(first)
    assert first != statuses(8)


def test_put_seed_reseeds() -> None:
    client = make_client(rate_429=0.5, seed=3)
    first = [client.post(CHAT, json=chat_body()).status_code for _ in range(20)]
    client.put("/_sim/config", json={"seed": 3})
    assert [client.post(CHAT, json=chat_body()).status_code for _ in range(20)] == first


@pytest.mark.parametrize(("code", "status"), [("429", 429), ("500", 500), ("timeout", 504)])
def test_flaky_fails_first_n_then_succeeds(code: str, status: int) -> None:
    client = make_client(timeout_sleep_seconds=0.01)
    body = chat_body(f"retry me [[sim:flaky:2:{code}]]")
    assert [client.post(CHAT, json=body).status_code for _ in range(4)] == [status, status, 200, 200]
    other = chat_body(f"another body [[sim:flaky:2:{code}]]")  # counted separately
    assert client.post(CHAT, json=other).status_code == status
    client.post("/_sim/stats/reset")  # also forgets flaky attempts
    assert client.post(CHAT, json=body).status_code == status


def messages_body(text: str = "Hello") -> dict:
    return {"model": "claude-sim", "max_tokens": 64, "messages": [{"role": "user", "content": text}]}


def test_messages_endpoint_has_the_same_faults_in_anthropics_envelope() -> None:
    """The Messages endpoint draws the same faults as chat (one draw per request), answered as Anthropic
    answers them, so Message Batches on an anthropic-kind backend meet every fault the others do."""
    def anthropic_error(resp: httpx.Response, status: int, kind: str) -> None:
        assert resp.status_code == status, resp.text
        assert resp.json() == {"type": "error", "error": {"type": kind, "message": resp.json()["error"]["message"]}}

    resp = make_client(rate_429=1.0).post("/v1/messages", json=messages_body())
    anthropic_error(resp, 429, "rate_limit_error")
    assert resp.headers["retry-after"] == "1"
    anthropic_error(make_client(rate_500=1.0).post("/v1/messages", json=messages_body()), 500, "api_error")
    anthropic_error(make_client(rate_timeout=1.0, timeout_sleep_seconds=0.01).post(
        "/v1/messages", json=messages_body()), 504, "timeout_error")
    client = make_client(timeout_sleep_seconds=0.01)
    anthropic_error(client.post("/v1/messages", json=messages_body("x [[sim:fail-always]]")), 500, "api_error")
    anthropic_error(client.post("/v1/messages", json=messages_body("x [[sim:400]]")), 400, "invalid_request_error")
    flaky = messages_body("retry me [[sim:flaky:1:429]]")
    assert [client.post("/v1/messages", json=flaky).status_code for _ in range(3)] == [429, 200, 200]
    slow = make_client(latency_seconds=0.1)
    start = time.monotonic()
    assert slow.post("/v1/messages", json=messages_body()).status_code == 200
    assert time.monotonic() - start >= 0.1


def test_latency_applies() -> None:
    client = make_client(latency_seconds=0.1)
    start = time.monotonic()
    assert client.post(CHAT, json=chat_body()).status_code == 200
    assert time.monotonic() - start >= 0.1


@pytest.mark.parametrize("distribution", ["lognormal", "long_tail"])
def test_latency_distributions_keep_the_mean_and_give_one_request_one_latency(distribution: str) -> None:
    config = SimConfig(latency_seconds=1.0, latency_distribution=distribution, latency_sigma=0.5)
    bodies = [chat_body(messages=[{"role": "user", "content": f"question {i}"}]) for i in range(4000)]
    draws = [latency_of(config, body) for body in bodies]
    assert abs(statistics.fmean(draws) - 1.0) < 0.05  # the mean is the configured latency
    assert max(draws) > 2.5 and min(draws) < 0.6  # spread, not fixed
    assert [latency_of(config, body) for body in bodies[:50]] == draws[:50]  # deterministic per request
    assert latency_of(config, dict(reversed(list(bodies[0].items())))) == draws[0]  # key order does not matter
    if distribution == "long_tail":
        assert sum(d > 2 for d in draws) / len(draws) == pytest.approx(0.1, abs=0.02)


def test_a_spread_latency_is_slept() -> None:
    client = make_client(latency_seconds=0.05, latency_distribution="long_tail")
    body = next(b for i in range(200) if latency_of(client.app.state.sim.config, b := chat_body(
        messages=[{"role": "user", "content": f"slow {i}"}])) > 0.2)
    start = time.monotonic()
    assert client.post(CHAT, json=body).status_code == 200
    assert time.monotonic() - start >= 0.2


# --- control API and stats --------------------------------------------------------------------------

def test_the_timeline_lists_each_request_with_its_tag(client: TestClient) -> None:
    client.post("/_sim/stats/reset")
    client.post(CHAT, json=chat_body())
    tagged = client.post(CHAT, json=chat_body(messages=[{"role": "user", "content": "hi [[sim:tag:interactive]]"}]))
    assert "[[sim" not in tagged.json()["choices"][0]["message"]["content"]
    timeline = client.get("/_sim/timeline").json()
    assert timeline["tags"] == [None, "interactive"]
    assert len(timeline["requests"]) == 2 and all(a <= b for a, b in timeline["requests"])


def test_config_get_put(client: TestClient) -> None:
    assert client.get("/_sim/config").json() == SimConfig().model_dump()
    updated = client.put("/_sim/config", json={"rate_429": 1.0, "latency_seconds": 0.0}).json()
    assert updated["rate_429"] == 1.0 and updated["timeout_sleep_seconds"] == 30.0
    assert client.get("/_sim/config").json() == updated
    assert client.post(CHAT, json=chat_body()).status_code == 429
    assert_openai_error(client.put("/_sim/config", json={"rate_500": 2}), 400)
    assert_openai_error(client.put("/_sim/config", json={"bogus": 1}), 400)
    assert_openai_error(client.put("/_sim/config", json=[1]), 400)
    assert client.get("/_sim/config").json() == updated


def test_env_is_not_read_outside_main(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SIM_RATE_429", "1")
    monkeypatch.setenv("SIM_LATENCY_SECONDS", "9")
    assert TestClient(create_app()).get("/_sim/config").json() == SimConfig().model_dump()


def test_stats_counters(client: TestClient) -> None:
    client.post(CHAT, json=chat_body())
    client.post(CHAT, json=chat_body(model="reject-me"))
    client.post("/v1/embeddings", json={"model": "e", "input": "hi"})
    stats = client.get("/_sim/stats").json()
    assert stats["total_requests"] == 3
    assert stats["by_status"] == {"200": 2, "400": 1}
    assert stats["by_path"] == {CHAT: 2, "/v1/embeddings": 1}
    assert stats["in_flight"] == 0 and stats["max_in_flight"] == 1
    assert 0 < stats["busy_seconds"] <= stats["last_ended_at"] - stats["first_started_at"] + 0.5
    reset = client.post("/_sim/stats/reset").json()
    assert reset == {"total_requests": 0, "by_status": {}, "by_path": {}, "in_flight": 0, "max_in_flight": 0,
                     "busy_seconds": 0.0, "first_started_at": None, "last_ended_at": None,
                     "prompt_tokens": 0, "prompt_tokens_cached": 0}


def test_stats_busy_seconds_add_up_the_time_requests_spend_in_flight(client: TestClient) -> None:
    client.put("/_sim/config", json={"latency_seconds": 0.2})
    for _ in range(2):
        client.post(CHAT, json=chat_body())
    stats = client.get("/_sim/stats").json()
    assert 0.4 <= stats["busy_seconds"] < 0.6
    assert stats["last_ended_at"] - stats["first_started_at"] >= 0.4


def test_concurrent_requests_max_in_flight() -> None:
    async def run() -> tuple[list[int], float, dict, dict]:
        app = create_app(SimConfig(latency_seconds=1.0))
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://sim") as c:
            start = time.monotonic()
            tasks = [c.post(CHAT, json=chat_body(f"q{i}")) for i in range(20)]
            pending = asyncio.gather(*tasks)
            # Look while they are all in flight: as soon as the last has arrived (a fixed sleep is flaky on a
            # busy machine), and before the first can have answered.
            while True:
                await asyncio.sleep(0.02)
                mid = (await c.get("/_sim/stats")).json()
                if mid["in_flight"] == 20 or time.monotonic() - start > 0.8:
                    break
            responses = await pending
            elapsed = time.monotonic() - start
            return [r.status_code for r in responses], elapsed, mid, (await c.get("/_sim/stats")).json()

    codes, elapsed, mid, stats = asyncio.run(run())
    assert codes == [200] * 20
    assert elapsed < 2.0  # 20 x 0.3 s run concurrently, not one after another
    assert mid["in_flight"] == 20
    assert stats["max_in_flight"] == 20 and stats["in_flight"] == 0
    assert stats["total_requests"] == 20 and stats["by_status"] == {"200": 20}


# --- other endpoints --------------------------------------------------------------------------------

def test_embeddings(client: TestClient) -> None:
    body = {"model": "emb", "input": ["hello world", "other text"]}
    data = client.post("/v1/embeddings", json=body).json()
    assert data["object"] == "list" and data["model"] == "emb"
    vectors = [d["embedding"] for d in data["data"]]
    assert [d["index"] for d in data["data"]] == [0, 1]
    assert all(len(v) == EMBEDDING_DIM and all(-1 <= x <= 1 for x in v) for v in vectors)
    assert vectors[0] != vectors[1]
    assert client.post("/v1/embeddings", json=body).json()["data"][0]["embedding"] == vectors[0]
    assert data["usage"] == {"prompt_tokens": 4, "total_tokens": 4}
    b64 = client.post("/v1/embeddings", json={**body, "encoding_format": "base64"}).json()
    decoded = struct.unpack(f"<{EMBEDDING_DIM}f", base64.b64decode(b64["data"][0]["embedding"]))
    assert decoded == pytest.approx(vectors[0], abs=1e-6)
    assert_openai_error(client.post("/v1/embeddings", json={"model": "emb"}), 400)


def test_responses_endpoint(client: TestClient) -> None:
    body = {"model": "resp-model", "input": "Tell me a fact", "instructions": "be short"}
    data = client.post("/v1/responses", json=body).json()
    assert data["id"].startswith("resp_") and data["object"] == "response"
    assert data["status"] == "completed" and data["model"] == "resp-model"
    item = data["output"][0]
    assert item["type"] == "message" and item["role"] == "assistant"
    text = item["content"][0]["text"]
    assert item["content"][0]["type"] == "output_text" and "Tell me a fact" in text
    usage = data["usage"]
    assert usage["input_tokens"] == 4 + 2 + 3 * 2
    assert usage["output_tokens"] == len(text.split())
    assert usage["total_tokens"] == usage["input_tokens"] + usage["output_tokens"]
    as_list = {"model": "resp-model", "input": [{"role": "user", "content": [
        {"type": "input_text", "text": "Tell me a fact"}]}]}
    assert "Tell me a fact" in client.post("/v1/responses", json=as_list).json()["output"][0]["content"][0]["text"]
    assert client.post("/v1/responses", json={**body, "max_output_tokens": 2}).json()["status"] == "incomplete"
    assert_openai_error(client.post("/v1/responses", json={"model": "m"}), 400)


def test_anthropic_messages_endpoint(client: TestClient) -> None:
    body = {"model": "claude-sim", "max_tokens": 100, "system": "be nice",
            "messages": [{"role": "user", "content": "Hello Claude"}]}
    data = client.post("/v1/messages", json=body).json()
    assert data["id"].startswith("msg_") and data["type"] == "message" and data["role"] == "assistant"
    assert data["model"] == "claude-sim" and data["stop_reason"] == "end_turn"
    assert data["content"][0]["type"] == "text" and "Hello Claude" in data["content"][0]["text"]
    assert data["usage"]["output_tokens"] == len(data["content"][0]["text"].split())
    assert data["usage"]["input_tokens"] == 2 + 2 + 3 * 2
    assert client.post("/v1/messages", json={**body, "max_tokens": 2}).json()["stop_reason"] == "max_tokens"
    resp = client.post("/v1/messages", json={**body, "model": "reject-me"})
    assert resp.status_code == 400
    assert resp.json()["type"] == "error" and resp.json()["error"]["type"] == "invalid_request_error"


def test_chat_tool_marker_answers_a_tool_call(client: TestClient) -> None:
    body = chat_body("What is the weather? [[sim:tool:get_weather]]")
    data = client.post(CHAT, json=body).json()
    choice = data["choices"][0]
    assert choice["finish_reason"] == "tool_calls"
    assert choice["message"]["content"] is None
    (call,) = choice["message"]["tool_calls"]
    assert re.fullmatch(r"call_[0-9a-f]{16}", call["id"])
    assert call["type"] == "function" and call["function"]["name"] == "get_weather"
    assert json.loads(call["function"]["arguments"]) == {"query": "Simulated"}  # the answer's first word
    assert data["usage"]["completion_tokens"] == len(call["function"]["arguments"].split())
    assert client.post(CHAT, json=body).json()["choices"][0]["message"]["tool_calls"][0]["id"] == call["id"]
    other = client.post(CHAT, json=chat_body("Another question [[sim:tool:get_weather]]")).json()
    assert other["choices"][0]["message"]["tool_calls"][0]["id"] != call["id"]

    # Sending the tool's answer back ends the loop: the marker only counts in the last message.
    follow_up = {**body, "messages": [*body["messages"], choice["message"],
                                      {"role": "tool", "tool_call_id": call["id"], "content": "sunny"}]}
    answer = client.post(CHAT, json=follow_up).json()["choices"][0]
    assert answer["finish_reason"] == "stop" and "tool_calls" not in answer["message"]
    assert answer["message"]["content"].startswith("Simulated answer")


def test_messages_tool_marker_answers_tool_use(client: TestClient) -> None:
    body = {"model": "claude-sim", "max_tokens": 100,
            "tools": [{"name": "search", "input_schema": {"type": "object"}}],
            "messages": [{"role": "user", "content": [{"type": "text", "text": "Look it up [[sim:tool:search]]"}]}]}
    data = client.post("/v1/messages", json=body).json()
    assert data["stop_reason"] == "tool_use" and data["stop_sequence"] is None
    (block,) = data["content"]
    assert block["type"] == "tool_use" and block["name"] == "search" and block["input"] == {"query": "Simulated"}
    assert re.fullmatch(r"toolu_[0-9a-f]{16}", block["id"])
    assert data["usage"]["output_tokens"] == 2

    # The follow-up with tool_use / tool_result blocks is accepted; the tool result counts as the user's text.
    tool_results = [{"type": "tool_result", "tool_use_id": block["id"], "content": "rainy in Oslo"},
                    {"type": "tool_result", "tool_use_id": "toolu_2",
                     "content": [{"type": "text", "text": "and windy"}]}]
    follow_up = {**body, "messages": [*body["messages"], {"role": "assistant", "content": data["content"]},
                                      {"role": "user", "content": tool_results}]}
    resp = client.post("/v1/messages", json=follow_up)
    assert resp.status_code == 200, resp.text
    answer = resp.json()
    assert answer["stop_reason"] == "end_turn" and answer["content"][0]["type"] == "text"
    assert "to: rainy in Oslo and windy" in answer["content"][0]["text"]
    assert answer["usage"]["input_tokens"] == 4 + 0 + 5 + 3 * 3  # the marker counts as a word; tool_use adds none


def test_tool_marker_names_must_be_tool_names(client: TestClient) -> None:
    data = client.post(CHAT, json=chat_body("x [[sim:tool:not a name]]")).json()
    assert data["choices"][0]["finish_reason"] == "stop"


def test_sdks_read_simulated_tool_calls() -> None:
    openai = pytest.importorskip("openai")
    anthropic = pytest.importorskip("anthropic")
    app = create_app()
    chat = openai.OpenAI(base_url="http://testserver/v1", api_key="sim", http_client=TestClient(app))
    answer = chat.chat.completions.create(model="gpt-sim", messages=[{"role": "user", "content": "[[sim:tool:f]]"}])
    assert answer.choices[0].message.tool_calls[0].function.name == "f"
    messages = anthropic.Anthropic(base_url="http://testserver", api_key="sim", http_client=TestClient(app))
    msg = messages.messages.create(model="claude-sim", max_tokens=50,
                                   messages=[{"role": "user", "content": "[[sim:tool:f]]"}])
    assert msg.stop_reason == "tool_use" and msg.content[0].type == "tool_use" and msg.content[0].input == {
        "query": "Simulated"}


def test_models_list(client: TestClient) -> None:
    assert client.get("/v1/models").json() == {"object": "list", "data": []}


# --- real SDK clients against the double ------------------------------------------------------------

def test_openai_sdk_compatibility() -> None:
    openai = pytest.importorskip("openai")
    sdk = openai.OpenAI(base_url="http://testserver/v1", api_key="sim", max_retries=2,
                        http_client=TestClient(create_app()))
    chat = sdk.chat.completions.create(model="gpt-sim", messages=[{"role": "user", "content": "hi"}])
    assert chat.choices[0].message.content.startswith("Simulated answer from gpt-sim")
    emb = sdk.embeddings.create(model="emb", input="hello")
    assert len(emb.data[0].embedding) == EMBEDDING_DIM
    assert sdk.responses.create(model="gpt-sim", input="hi").output_text.startswith("Simulated answer")
    flaky = sdk.chat.completions.create(model="gpt-sim", messages=[{"role": "user", "content": "[[sim:flaky:1:500]]"}])
    assert flaky.choices[0].finish_reason == "stop"  # the SDK retried once
    with pytest.raises(openai.BadRequestError):
        sdk.chat.completions.create(model="reject-me", messages=[{"role": "user", "content": "hi"}])


def test_anthropic_sdk_compatibility() -> None:
    anthropic = pytest.importorskip("anthropic")
    sdk = anthropic.Anthropic(base_url="http://testserver", api_key="sim", http_client=TestClient(create_app()))
    msg = sdk.messages.create(model="claude-sim", max_tokens=50, messages=[{"role": "user", "content": "hi"}])
    assert msg.content[0].text.startswith("Simulated answer from claude-sim")
    with pytest.raises(anthropic.BadRequestError):
        sdk.messages.create(model="reject-me", max_tokens=50, messages=[{"role": "user", "content": "hi"}])


# --- CLI --------------------------------------------------------------------------------------------

def test_cli_serves_on_localhost_with_env_defaults() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {**os.environ, "SIM_SEED": "5", "SIM_LATENCY_SECONDS": "0.01"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "local.simulated_backend", "--host", "127.0.0.1", "--port", str(port),
         "--rate-500", "0.25"], cwd=REPO_ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        config = None
        for _ in range(100):
            try:
                config = httpx.get(f"http://127.0.0.1:{port}/_sim/config", timeout=1).json()
                break
            except httpx.TransportError:
                time.sleep(0.1)
        assert config is not None, proc.stderr.read() if proc.poll() is not None else "server did not start"
        assert config["seed"] == 5 and config["latency_seconds"] == 0.01 and config["rate_500"] == 0.25
        resp = httpx.post(f"http://127.0.0.1:{port}{CHAT}", json=chat_body(), timeout=5)
        assert resp.status_code in (200, 500)
    finally:
        proc.terminate()
        proc.wait(timeout=10)
