"""The interactive endpoints, through the API Lambda handler (Mangum) on in-process moto and the simulated
backend: the same checks, execution, price and quota as batch requests; the interactive load signal that
makes batch work yield, with a lease a crashed request cannot leave behind. (tests/e2e/test_interactive_sdk.py
calls them with the official SDKs.)"""

from __future__ import annotations

import asyncio
import json
import threading
import time

from batchinfer.domain import next_utc_midnight, utc_day
from batchinfer.layout import model_budget_key
from batchinfer.records import InteractiveLease, Usage
from batchinfer.scheduling.capacity import budget_shards, effective_budget, read_budget
from batchinfer.service import accounts
from batchinfer.service.background.sweep import sweep_once
from batchinfer.service.running import interactive
from tests.helpers import (
    AS_SENT,
    check_as_sent,
    error,
    finish,
    new_key,
    ok,
    req,
    settings,
    sim_requests,
    step_by_record,
    tick,
)
from tests.integration.test_files import content, create_from, jsonl, upload
from tests.integration.test_message_batches import V1, anthropic_error

GLM, QWEN = "glm-5.3-flash", "qwen3.6-35b"
CHAT = {"model": GLM, "messages": [{"role": "user", "content": "Name three primes."}], "max_tokens": 40}


def spent(svc, account_id: str) -> dict:
    return Usage.get(svc.table, account_id, utc_day(svc.now())) or {}


def budget(svc, model: str = GLM) -> dict:
    return svc.table.get(*model_budget_key(model)) or {}


def test_chat_embeddings_responses_and_models(api, svc, sim_control):
    account, key = new_key(svc)
    chat = ok(api("POST", "/v1/chat/completions", key, json_body=CHAT))
    assert chat["object"] == "chat.completion" and chat["choices"][0]["message"]["content"]
    usage = chat["usage"]
    price = svc.catalog.get(GLM).price
    expected = (usage["prompt_tokens"] * price.input_per_mtok
                + usage["completion_tokens"] * price.output_per_mtok) / 1e6
    assert abs(float(spent(svc, account["id"])["cost_usd"]) - expected) < 1e-12
    embedding = ok(api("POST", "/v1/embeddings", key, json_body={"model": GLM, "input": ["a", "b"]}))
    assert embedding["object"] == "list" and len(embedding["data"]) == 2 and embedding["data"][0]["embedding"]
    response = ok(api("POST", "/v1/responses", key, json_body={"model": GLM, "input": "Say hi", "store": False}))
    assert response["object"] == "response" and response["output"]
    models = ok(api("GET", "/v1/models", key))
    assert models["object"] == "list"
    assert [m["id"] for m in models["data"]] == [GLM, QWEN, "claude-bedrock", "auto", "auto-pro"]
    assert ok(api("GET", f"/v1/models/{QWEN}", key)) == {"id": QWEN, "object": "model", "created": 0,
                                                        "owned_by": "batchinfer"}
    error(api("GET", "/v1/models/no-such-model", key), 404, "no-such-model", code="model_not_found")
    error(api("GET", "/v1/models", None), 401)
    # A key limited to some models sees only those.
    accounts.update_account(svc, account["id"], allowed_models=[QWEN])
    assert [m["id"] for m in ok(api("GET", "/v1/models", key))["data"]] == [QWEN]
    error(api("POST", "/v1/chat/completions", key, json_body=CHAT), 404, f"'{GLM}'", code="model_not_found",
          param="model")
    assert budget(svc).get("interactive", 0) == 0  # every lease ended


def test_the_same_request_interactively_and_in_a_batch_gives_the_same_body_usage_and_cost(api, svc, sim_control):
    account, key = new_key(svc)
    body = {**CHAT, "temperature": 0.2, "seed": 7}
    direct = ok(api("POST", "/v1/chat/completions", key, json_body=body))
    interactive_cost = float(spent(svc, account["id"])["cost_usd"])
    batch = api.created(key, [{"custom_id": "same", "body": body}])
    final = finish(svc, batch["id"])
    [result] = ok(api.results(key, batch["id"]))["data"]
    batched = result["response"]["body"]
    assert set(batched) == set(direct)
    assert batched["usage"] == direct["usage"] and batched["choices"] == direct["choices"]
    assert batched["model"] == direct["model"]
    assert abs(float(final["cost_usd"]) - interactive_cost) < 1e-12
    assert abs(float(spent(svc, account["id"])["cost_usd"]) - 2 * interactive_cost) < 1e-12  # one quota


def test_an_interactive_answer_is_the_backends_body_as_it_sent_it(api, svc, sim_control):
    sim_control.put("/_sim/config", json={"answer_extra_json": AS_SENT})
    _, key = new_key(svc)
    reply = api("POST", "/v1/chat/completions", key, json_body=CHAT)
    assert reply.status == 200 and AS_SENT in reply.text
    check_as_sent(reply.json()["timings"])


def test_bodies_are_checked_as_batch_requests_are(api, svc, sim_control):
    _, key = new_key(svc)
    before = sim_requests(sim_control)
    for extra, param in (({"temperature": "hot"}, "temperature"), ({"top_p": 3}, "top_p"),
                         ({"max_tokens": 0}, "max_tokens"), ({"messages": []}, "messages")):
        err = error(api("POST", "/v1/chat/completions", key, json_body={**CHAT, **extra}), 400, f"body.{param}")
        assert err["param"] == param
    error(api("POST", "/v1/chat/completions", key, json_body={**CHAT, "stream": True}), 400,
          "stream", "whole", code="stream_unsupported", param="stream")
    error(api("POST", "/v1/embeddings", key, json_body={"model": GLM, "input": 5}), 400, "body.input")
    error(api("POST", "/v1/embeddings", key, json_body={"model": QWEN, "input": "x"}), 400,
          "does not serve /v1/embeddings", code="unsupported_endpoint")
    error(api("POST", "/v1/responses", key, json_body={"model": GLM, "input": "x", "store": True}), 400, "store")
    error(api("POST", "/v1/chat/completions", key, json_body={**CHAT, "model": "nope"}), 404, code="model_not_found")
    error(api("POST", "/v1/chat/completions", key, body="{", headers={"content-type": "application/json"}), 400,
          "not valid JSON")
    assert sim_requests(sim_control) == before  # nothing refused reached the backend


def test_auto_models_route_by_the_catalogs_rule_and_stay_refused_in_batches(api, svc, sim_control):
    _, key = new_key(svc)
    assert ok(api("POST", "/v1/chat/completions", key, json_body={**CHAT, "model": "auto"}))["model"] == GLM
    assert ok(api("POST", "/v1/chat/completions", key, json_body={**CHAT, "model": "auto-pro"}))["model"] == QWEN
    # auto-pro prefers qwen, which serves no embeddings: the next in its route does.
    assert ok(api("POST", "/v1/embeddings", key, json_body={"model": "auto-pro", "input": "x"}))["model"] == GLM
    error(api.create(key, [{"custom_id": "a", "body": {**CHAT, "model": "auto"}}]), 400, "auto model")


def test_messages_interactive_in_anthropics_shape_and_envelope(api, svc, sim_control):
    _, key = new_key(svc)
    params = {"model": GLM, "max_tokens": 64, "messages": [{"role": "user", "content": "Name three primes."}]}
    for path in ("/v1/messages", "/anthropic/v1/messages"):
        message = ok(api("POST", path, key, json_body=params, headers={"anthropic-version": V1}))
        assert message["type"] == "message" and message["role"] == "assistant"
        assert message["content"][0]["type"] == "text" and message["usage"]["output_tokens"] > 0
    anthropic_error(api("POST", "/v1/messages", key, json_body=params), 400, "invalid_request_error",
                    "anthropic-version")
    anthropic_error(api("POST", "/v1/messages", key, json_body={**params, "max_tokens": None},
                        headers={"anthropic-version": V1}), 400, "invalid_request_error", "max_tokens")
    anthropic_error(api("POST", "/v1/messages", key, json_body={**params, "stream": True},
                        headers={"anthropic-version": V1}), 400, "invalid_request_error", "stream")
    anthropic_error(api("POST", "/v1/messages", key, json_body={**params, "model": "nope"},
                        headers={"anthropic-version": V1}), 404, "not_found_error", "nope")
    anthropic_error(api("POST", "/v1/messages", None, json_body=params, headers={"anthropic-version": V1}), 401,
                    "authentication_error")
    auto = ok(api("POST", "/v1/messages", key, json_body={**params, "model": "auto-pro"},
                  headers={"anthropic-version": V1}))
    assert auto["model"] == QWEN


def test_quota_used_up_refuses_interactive_and_new_batches_but_never_reading(api, svc, sim_control):
    account, key = new_key(svc, daily_quota_usd=1e-9)
    ok(api("POST", "/v1/chat/completions", key, json_body=CHAT))  # under the quota when it started
    before = svc.now()
    reply = api("POST", "/v1/chat/completions", key, json_body=CHAT)
    after = svc.now()
    error(reply, 429, "renews at 00:00 UTC", code="quota_exceeded")
    # the seconds to midnight UTC as of the call (the clock may tick during it)
    assert next_utc_midnight(after) - after <= int(reply.headers["retry-after"]) <= next_utc_midnight(before) - before
    error(api("POST", "/v1/embeddings", key, json_body={"model": GLM, "input": "x"}), 429)
    anthropic_error(api("POST", "/v1/messages", key, json_body={"model": GLM, "max_tokens": 5, "messages": [
        {"role": "user", "content": "x"}]}, headers={"anthropic-version": V1}), 429, "rate_limit_error", "quota")
    error(api.create(key, [req("a")]), 429, code="quota_exceeded")
    assert ok(api("GET", "/v1/batches", key))["data"] == []  # management calls never answer 429 for it
    assert ok(api("GET", "/v1/models", key))["data"]
    tick(svc, next_utc_midnight(svc.now()) - svc.now() + 1)  # a new UTC day: the quota renews
    ok(api("POST", "/v1/chat/completions", key, json_body=CHAT))


def test_interactive_requests_shrink_the_batch_budget_while_they_run(api, svc, sim_control):
    """The load signal comes from real interactive requests: while one runs, the model's budget item counts
    it and the batch budget shrinks (the catalog's yield per request), then recovers."""
    _, key = new_key(svc)
    sim_control.put("/_sim/config", json={"latency_seconds": 1.0})
    model = svc.catalog.get(GLM)
    seen: list[int] = []

    def watch() -> None:
        for _ in range(12):
            seen.append(effective_budget(model, budget(svc), svc.settings.interactive_yield_per_request))
            time.sleep(0.1)

    watcher = threading.Thread(target=watch)
    watcher.start()
    ok(api("POST", "/v1/chat/completions", key, json_body=CHAT))
    watcher.join()
    assert min(seen) == model.batch_budget - 1, seen
    assert effective_budget(model, budget(svc), 1) == model.batch_budget
    assert budget(svc).get("interactive", 0) == 0


def test_with_the_budget_in_shards_interactive_calls_count_on_any_shard_and_the_sum_shrinks_batch_work(
        api, svc, sim_control):
    """`BUDGET_SHARD_SLOTS` 4: the model's 16 slots are 4 items. Each interactive call counts on one shard (at
    random, to spread the writes) and ends on the same one; readers see the sum, so batch work makes way for
    all of them, and every shard is back at 0 once they end."""
    settings(svc, budget_shard_slots=4)
    _, key = new_key(svc)
    sim_control.put("/_sim/config", json={"latency_seconds": 1.0})
    model = svc.catalog.get(GLM)
    assert budget_shards(svc, model) == 4
    seen: list[int] = []

    def watch() -> None:
        for _ in range(12):
            seen.append(read_budget(svc, model)["interactive"])
            time.sleep(0.1)

    async def four_at_once() -> None:  # as four API invocations would (one handler runs one call at a time)
        principal = accounts.authenticate(svc, key)
        await asyncio.gather(*(interactive.serve_openai(svc, principal, "/v1/chat/completions", CHAT)
                               for _ in range(4)))

    watcher = threading.Thread(target=watch)
    watcher.start()
    asyncio.run(four_at_once())
    watcher.join()
    sim_control.put("/_sim/config", json={"latency_seconds": 0.0})
    for _ in range(12):  # more, one at a time: they land on more than one shard
        ok(api("POST", "/v1/chat/completions", key, json_body=CHAT))

    assert max(seen) == 4, seen  # the four calls at once, summed over the shards
    after = read_budget(svc, model)
    assert after["interactive"] == 0 and [shard["interactive"] for shard in after["shards"]] == [0] * 4
    written = [svc.table.get(*model_budget_key(GLM, k)) for k in range(4)]
    assert sum(item is not None and "interactive_at" in item for item in written) >= 2, written


def test_a_crashed_interactive_requests_lease_runs_out_and_gives_the_slot_back(api, svc, sim_control):
    now = svc.now()
    svc.table.transact(InteractiveLease.begin(svc.table, GLM, "crashed", "acct_x", now, now + 180, now * 1000))
    assert budget(svc)["interactive"] == 1  # the process died here: nothing will end it
    sweep_once(svc)
    assert budget(svc)["interactive"] == 1  # not before its lease runs out
    tick(svc, 181)
    sweep_once(svc)
    assert budget(svc)["interactive"] == 0
    assert svc.table.get(f"MODEL#{GLM}", "INTERACTIVE#crashed") is None
    sweep_once(svc)
    assert budget(svc)["interactive"] == 0  # taken off once


def test_an_embedding_batch_and_a_responses_batch_end_to_end(api, svc, sim_control):
    settings(svc, embeddings_responses_batches_enabled=True)
    _, key = new_key(svc)
    embed = api.created(key, [{"custom_id": f"e{i}", "url": "/v1/embeddings",
                               "body": {"model": GLM, "input": f"text {i}"}} for i in range(3)])
    assert embed["endpoint"] == "/v1/embeddings"
    assert finish(svc, embed["id"])["completed"] == 3
    data = ok(api.results(key, embed["id"]))["data"]
    direct = ok(api("POST", "/v1/embeddings", key, json_body={"model": GLM, "input": "text 0"}))
    assert data[0]["response"]["body"]["data"] == direct["data"]  # the same vector either way
    responses = api.created(key, [{"custom_id": "r", "url": "/v1/responses",
                                   "body": {"model": GLM, "input": "Say hi", "store": False}}])
    assert finish(svc, responses["id"])["completed"] == 1
    # A model serves only the endpoints the catalog lists for it.
    error(api.create(key, [{"custom_id": "q", "url": "/v1/embeddings", "body": {"model": QWEN, "input": "x"}}]),
          400, "requests[0] (custom_id 'q')", "does not serve /v1/embeddings")


def test_every_field_a_batched_responses_request_cannot_carry_is_named(api, svc):
    settings(svc, embeddings_responses_batches_enabled=True)
    _, key = new_key(svc)
    base = {"model": GLM, "input": "x"}
    for extra, named in (({"store": True}, "store"), ({"previous_response_id": "resp_1"}, "previous_response_id"),
                         ({"conversation": "conv_1"}, "conversation"), ({"background": True}, "background"),
                         ({"stream": True}, "stream"),
                         ({"tools": [{"type": "web_search"}]}, "tools[0]: the hosted tool 'web_search'"),
                         ({"tools": [{"type": "function", "name": "f", "parameters": {}},
                                     {"type": "file_search"}]}, "tools[1]"),
                         ({"input": [{"role": "user", "content": [{"type": "input_text", "text": "x"},
                                                                  {"type": "input_file", "file_id": "file-1"}]}]},
                          "input[0].content[1]: file inputs")):
        error(api.create(key, [{"custom_id": "ok", "url": "/v1/responses", "body": base},
                               {"custom_id": "bad", "url": "/v1/responses", "body": {**base, **extra}}]),
              400, "requests[1] (custom_id 'bad')", named, param="requests[1]")
    assert ok(api("GET", "/v1/batches", key))["data"] == []


def test_usage_carries_cached_and_reasoning_tokens_where_the_backend_reports_them(api, svc, sim_control):
    _, key = new_key(svc)
    plain = api.created(key, [req("plain")])
    assert "input_tokens_details" not in finish(svc, plain["id"]) and "input_tokens_details" not in ok(
        api("GET", f"/v1/batches/{plain['id']}", key))["usage"]
    detailed = {"model": GLM, "reasoning_effort": "low",
                "messages": [{"role": "system", "content": "You answer in one short line."},
                             {"role": "user", "content": "Name three primes."}]}
    direct = ok(api("POST", "/v1/chat/completions", key, json_body=detailed))["usage"]
    cached, reasoning = direct["prompt_tokens_details"]["cached_tokens"], direct["completion_tokens_details"][
        "reasoning_tokens"]
    assert cached > 0 and reasoning > 0
    batch = api.created(key, [{"custom_id": "d", "body": detailed}, {"custom_id": "e", "body": detailed}])
    finish(svc, batch["id"])
    usage = ok(api("GET", f"/v1/batches/{batch['id']}", key))["usage"]
    assert usage["input_tokens_details"] == {"cached_tokens": 2 * cached}
    assert usage["output_tokens_details"] == {"reasoning_tokens": 2 * reasoning}
    assert usage["total_tokens"] == usage["input_tokens"] + usage["output_tokens"]


def test_an_embedding_batch_from_a_file(api, svc, sim_control):
    settings(svc, embeddings_responses_batches_enabled=True, file_batches_enabled=True)
    _, key = new_key(svc)
    lines = [{"custom_id": f"e{i}", "method": "POST", "url": "/v1/embeddings",
              "body": {"model": GLM, "input": f"text {i}"}} for i in range(3)]
    uploaded = ok(upload(api, key, jsonl(*lines)))
    batch = ok(create_from(api, key, uploaded["id"], endpoint="/v1/embeddings"))
    final = finish(svc, batch["id"])
    assert final["status"] == "completed" and final["completed"] == 3
    output = ok(api("GET", f"/v1/batches/{batch['id']}", key))["output_file_id"]
    rows = [json.loads(x) for x in content(api, key, output)[0].splitlines()]
    assert [r["custom_id"] for r in rows] == ["e0", "e1", "e2"]
    assert all(r["response"]["body"]["data"][0]["embedding"] for r in rows)


def test_a_running_batch_pauses_when_the_quota_is_used_up_and_resumes_when_it_renews(api, svc, sim_control):
    _, key = new_key(svc, daily_quota_usd=1e-4)  # some 20 small requests a day
    batch = api.created(key, [req("a"), req("b")])
    long = {**CHAT, "messages": [{"role": "user", "content": "word " * 2000}]}  # 2,000 input tokens: $0.0002
    ok(api("POST", "/v1/chat/completions", key, json_body=long))  # the day's quota is used up from here
    tick(svc, 2)  # (a new dispatcher takes no batch work in the second after interactive load moved)
    before = sim_requests(sim_control)
    for _ in range(3):
        step_by_record(svc)
    paused = ok(api("GET", f"/v1/batches/{batch['id']}", key))  # reading never answers 429 for the quota
    # Not started: an account with no quota left claims nothing, so its requests wait in their lane.
    assert paused["status"] == "validating" and paused["request_counts"]["completed"] == 0
    assert sim_requests(sim_control) == before  # nothing of it ran
    tick(svc, next_utc_midnight(svc.now()) - svc.now() + 1)  # 00:00 UTC: the quota renews
    final = finish(svc, batch["id"])
    assert final["status"] == "completed" and final["completed"] == 2
    assert sim_requests(sim_control) == before + 2
