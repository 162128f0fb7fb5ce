"""The simulated backend's prompt cache: per slot (llama.cpp's server) and shared (vLLM), counted in `usage`."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
from fastapi.testclient import TestClient

from local.simulated_backend import SimConfig, create_app

CHAT = "/v1/chat/completions"
SYSTEM_A = " ".join(f"alpha{i}" for i in range(100))
SYSTEM_B = " ".join(f"beta{i}" for i in range(100))


def body(system: str, question: str) -> dict:
    return {"model": "m", "messages": [{"role": "system", "content": system}, {"role": "user", "content": question}]}


def cached(answer: httpx.Response) -> int:
    assert answer.status_code == 200, answer.text
    return answer.json()["usage"]["prompt_tokens_details"]["cached_tokens"]


def test_slot_cache_serves_the_prefix_the_slot_holds() -> None:
    client = TestClient(create_app(SimConfig(prompt_cache="slot", cache_slots=1)))
    assert cached(client.post(CHAT, json=body(SYSTEM_A, "one"))) == 0
    # The system message (3 + 100 tokens) and the user message's own 3 tokens are the same.
    assert cached(client.post(CHAT, json=body(SYSTEM_A, "two"))) == 106
    assert cached(client.post(CHAT, json=body(SYSTEM_B, "one"))) == 3  # one slot: B replaced A
    assert cached(client.post(CHAT, json=body(SYSTEM_A, "three"))) == 3
    stats = client.get("/_sim/stats").json()
    assert stats["prompt_tokens"] == 4 * 107 and stats["prompt_tokens_cached"] == 106 + 3 + 3


def test_a_request_takes_the_idle_slot_that_matches_best() -> None:
    client = TestClient(create_app(SimConfig(prompt_cache="slot", cache_slots=2)))
    client.post(CHAT, json=body(SYSTEM_A, "one"))
    client.post(CHAT, json=body(SYSTEM_B, "one"))
    assert cached(client.post(CHAT, json=body(SYSTEM_A, "two"))) == 106
    assert cached(client.post(CHAT, json=body(SYSTEM_B, "two"))) == 106


def test_slots_do_not_share_and_a_request_waits_for_a_free_slot() -> None:
    async def run() -> tuple[list[int], dict]:
        app = create_app(SimConfig(prompt_cache="slot", cache_slots=2, latency_seconds=0.05))
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://sim") as c:
            first = await asyncio.gather(*(c.post(CHAT, json=body(SYSTEM_A, f"q{i}")) for i in range(3)))
            return [cached(a) for a in first], (await c.get("/_sim/stats")).json()

    counts, stats = asyncio.run(run())
    # Two start together on two cold slots; the third waits for one of them and finds A there.
    assert sorted(counts) == [0, 0, 106]
    assert stats["max_in_flight"] == 3  # it was in flight, waiting for a slot, as llama-server queues it


def test_shared_cache_serves_whole_blocks_to_every_later_request() -> None:
    client = TestClient(create_app(SimConfig(prompt_cache="shared")))
    assert cached(client.post(CHAT, json=body(SYSTEM_A, "one"))) == 0
    assert cached(client.post(CHAT, json=body(SYSTEM_A, "two"))) == 96  # 106 shared: 6 blocks of 16
    assert cached(client.post(CHAT, json=body(SYSTEM_B, "x"))) == 0
    assert cached(client.post(CHAT, json=body(SYSTEM_A, "three"))) == 96  # shared: B did not push A out


def test_uncached_tokens_take_their_time() -> None:
    async def run() -> list[float]:
        app = create_app(SimConfig(prompt_cache="shared", prompt_token_seconds=0.005))
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://sim") as c:
            times = []
            for question in ("one", "two"):
                started = asyncio.get_running_loop().time()
                await c.post(CHAT, json=body(SYSTEM_A, question))
                times.append(asyncio.get_running_loop().time() - started)
            return times

    cold, warm = asyncio.run(run())
    # 107 uncached tokens (0.535 s), then 11 (0.055 s): the warm one is shorter by the 96 it found cached.
    assert cold >= 107 * 0.005 and cold - warm >= 0.3


def test_messages_report_cache_reads_as_anthropic_does() -> None:
    client = TestClient(create_app(SimConfig(prompt_cache="slot", cache_slots=1)))
    sent: dict[str, Any] = {"model": "m", "max_tokens": 5, "system": SYSTEM_A,
                            "messages": [{"role": "user", "content": "one"}]}
    client.post("/v1/messages", json=sent)
    usage = client.post("/v1/messages", json={**sent, "messages": [{"role": "user", "content": "two"}]}).json()["usage"]
    assert usage["cache_read_input_tokens"] == 106 and usage["input_tokens"] == 1


def test_set_at_run_time_and_emptied_by_a_reset() -> None:
    client = TestClient(create_app())
    plain = client.post(CHAT, json=body(SYSTEM_A, "one")).json()["usage"]
    assert plain["prompt_tokens_details"]["cached_tokens"] == 103  # off: the system prompt, as before
    assert client.put("/_sim/config", json={"prompt_cache": "slot", "cache_slots": 1}).status_code == 200
    assert client.put("/_sim/config", json={"prompt_cache": "lru"}).status_code == 400
    client.post(CHAT, json=body(SYSTEM_A, "one"))
    assert cached(client.post(CHAT, json=body(SYSTEM_A, "two"))) == 106
    client.post("/_sim/stats/reset")
    assert cached(client.post(CHAT, json=body(SYSTEM_A, "three"))) == 0
