"""Estimates before running (an extension): `POST /v1/batches/estimate` and `POST /v1/messages/batches/estimate`
(also under /anthropic) through the real API handler. Each checks its body exactly as create does (the same
refusals in the same envelope), stores nothing, spends nothing, needs batch access; its figures follow from
the body, the catalog, the queue and the measured latency; and a create with `admission: reject_if_late` is
refused with the estimate's figures when the batch would end past its window."""

from __future__ import annotations

import math

import pytest

from batchinfer.layout import account_key, batch_key
from batchinfer.records import Budget, Lane
from batchinfer.service.accounts import spent_today
from batchinfer.service.creating.forecast import END_SECONDS, IDLE_START_SECONDS, coarse_count, read_queue
from batchinfer.service.creating.tokenizer import count_text, encoding
from tests.helpers import chat_request, error, finish, new_key, ok, services_in_use, settings
from tests.integration.test_files import jsonl, line, upload
from tests.integration.test_message_batches import V1, V2, Messages, entry

GLM = "glm-5.3-flash"
ESTIMATE = "/v1/batches/estimate"


@pytest.fixture
def svc(svc, sim):
    """The suite's services on the same moto, with Message Batches and file batches on."""
    with services_in_use(svc, sim.url, "estimate", message_batches_enabled=True, file_batches_enabled=True) as services:
        yield services


def stored(svc) -> tuple[int, int]:
    """Every item of the table and every object of the bucket: what an estimate must leave as it found."""
    items = svc.table.client.scan(TableName=svc.table.name, Select="COUNT")["Count"]
    objects = svc.blobs.s3.list_objects_v2(Bucket=svc.blobs.bucket).get("KeyCount", 0)
    return items, objects


def test_o200k_base_loads_offline_and_counts_as_documented():
    # OpenAI's cookbook ("How to count tokens with tiktoken"): o200k_base encodes this as 6 tokens.
    assert encoding().encode("tiktoken is great!") == [83, 8251, 2488, 382, 2212, 0]
    assert encoding("cl100k_base").encode("tiktoken is great!") == [83, 1609, 5963, 374, 2294, 0]
    assert count_text("hello world") == 2


OPENAI_FAULTS = [
    {"requests": []},
    {"requests": [chat_request("a", "hi"), chat_request("a", "again")]},
    {"requests": [chat_request("a", "hi", model="no-such-model")]},
    {"requests": [chat_request("a", "hi", stream=True)]},
    {"requests": [chat_request("a", "hi")], "metadata": {"k": 5}},
    {"requests": [chat_request("a", "hi")], "max_cost_usd": -1},
    {"requests": [{**chat_request("a", "hi"), "body": {"model": GLM, "max_tokens": 5, "messages": [  # no worst case
        {"role": "user", "content": [{"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}]}]}}],
     "max_cost_usd": 1.0},
    {"requests": [chat_request("a", "hi")], "priority": "urgent"},
    {"requests": [chat_request("a", "hi")], "admission": "sometimes"},
    {"input_file_id": "file-nope", "endpoint": "/v1/chat/completions", "completion_window": "24h"},
    {"input_file_id": "file-nope", "endpoint": "/v1/chat/completions", "completion_window": "1h"},
    [chat_request("a", "hi")],
]


def test_each_refusal_is_the_one_create_gives_and_nothing_is_stored(api, svc):
    _, key = new_key(svc)
    assert ok(api("GET", "/v1/batches", key))["data"] == []  # the account's rate bucket: every call writes it
    before = stored(svc)
    for body in OPENAI_FAULTS:
        refused = api("POST", "/v1/batches", key, json_body=body)
        estimated = api("POST", ESTIMATE, key, json_body=body)
        assert refused.status == 400, (body, refused.text)
        assert (estimated.status, estimated.json()) == (refused.status, refused.json()), body
    for raw in (b"{not json", b'{"requests": [], "requests": []}'):
        refused = api("POST", "/v1/batches", key, body=raw, headers={"content-type": "application/json"})
        estimated = api("POST", ESTIMATE, key, body=raw, headers={"content-type": "application/json"})
        assert (estimated.status, estimated.json()) == (refused.status, refused.json())
        error(estimated, 400)
    settings(svc, max_body_bytes=500)
    big = {"requests": [chat_request("a", "x" * 1000)]}
    refused = api("POST", "/v1/batches", key, json_body=big)
    assert (api("POST", ESTIMATE, key, json_body=big).json(), refused.status) == (refused.json(), 413)
    settings(svc, max_body_bytes=32 * 2**20)
    for body in ({"requests": [chat_request("a", "hi")]}, {"requests": [chat_request("b", "yo", max_tokens=5)]},
                 {"requests": [chat_request("c", "hi", max_tokens=5)], "max_cost_usd": 1.0,
                  "admission": "reject_if_late"}):
        assert ok(api("POST", ESTIMATE, key, json_body=body))["object"] == "batch.estimate"
    assert stored(svc) == before
    assert ok(api("GET", "/v1/batches", key))["data"] == []


def test_a_400_names_the_request_at_fault(api, svc):
    _, key = new_key(svc)
    body = {"requests": [chat_request("ok", "hi"), chat_request("bad", "hi", model="nope")]}
    err = error(api("POST", ESTIMATE, key, json_body=body), 400, param="requests[1]")
    assert "requests[1] (custom_id 'bad')" in err["message"]


def test_access_is_needed_and_no_quota_is_counted(api, svc):
    _, closed = new_key(svc, batch_access=False)
    body = {"requests": [chat_request("a", "hi")]}
    refused = api("POST", "/v1/batches", closed, json_body=body)
    assert refused.status == 403
    assert (api("POST", ESTIMATE, closed, json_body=body).json()) == refused.json()
    error(api("POST", ESTIMATE, None, json_body=body), 401)
    account, key = new_key(svc, daily_quota_usd=0.000001)
    for _ in range(3):
        ok(api("POST", ESTIMATE, key, json_body=body))
    assert spent_today(svc, account["id"]) == 0.0
    after = svc.table.get(*account_key(account["id"])) or {}
    assert after.get("unfinished_batches", 0) == 0 and after.get("unfinished_requests", 0) == 0


def test_the_figures_of_a_known_batch(api, svc):
    # Another account's batch waits on the model with 64 requests; calls take 2 s (as a pump noted).
    other_account, other = new_key(svc)
    queued = ok(api("POST", "/v1/batches", other,
                    json_body={"requests": [chat_request(f"o{i}", "x") for i in range(64)]}))
    Budget.note_latency(svc.table, GLM, 2.0, svc.now())
    _, key = new_key(svc)  # pro: 16 in flight, as the model's budget
    requests = [chat_request(f"q{i}", "tiktoken is great!", max_tokens=100) for i in range(32)]
    requests.append(chat_request("long", "hello world"))  # no max_tokens: the catalog's output limit
    answer = ok(api("POST", ESTIMATE, key, json_body={"requests": requests}))
    per_request = 3 + 3 + 1  # the reply's priming, the message's overhead, "user" (OpenAI's counting rule)
    input_tokens = 32 * (per_request + 6) + (per_request + 2)
    max_output = 32 * 100 + 32768
    model = svc.catalog.get(GLM)
    assert answer["request_count"] == 33 and answer["input_tokens"] == input_tokens
    assert answer["max_output_tokens"] == max_output and answer["tokenizer"] == "o200k_base"
    assert answer["cost_usd"] == {"min": pytest.approx(model.cost_usd(input_tokens, 0)),
                                  "max": pytest.approx(model.cost_usd(input_tokens, max_output))}
    [figures] = answer["models"]
    assert figures["queue_ahead"] == 50 and figures["batch_budget"] == 16 and figures["batch_cap_now"] == 16
    assert figures["mean_latency_seconds"] == 2.0 and figures["tier_limit"] == 16
    # Two accounts share 16 slots: 8 each, 4 requests a second; 33 requests take 8.25 s, plus half a call, plus
    # the batch's end (the model is busy: no start of a pump to wait for).
    assert figures["estimated_seconds"] == pytest.approx(33 / 4 + 1.0 + END_SECONDS, abs=0.1)
    assert answer["estimated_completion_at"] - answer["created_at"] == math.ceil(figures["estimated_seconds"])
    assert answer["fits_window"] is True and answer["rejected"] == []
    assert svc.table.get(*batch_key(queued["id"]))["total"] == 64  # the other batch is as it was
    assert len(Lane.in_turn(svc.table, GLM, None, 10)[0]) == 1
    del other_account


def test_a_file_batch_is_estimated_from_its_lines(api, svc):
    _, key = new_key(svc)
    file_id = ok(upload(api, key, jsonl(*(line(f"l{i}", "hello world", max_tokens=10) for i in range(5)))))["id"]
    body = {"input_file_id": file_id, "endpoint": "/v1/chat/completions", "completion_window": "24h"}
    answer = ok(api("POST", ESTIMATE, key, json_body=body))
    assert answer["request_count"] == 5 and answer["input_tokens"] == 5 * 9 and answer["max_output_tokens"] == 50
    assert answer["completion_window_seconds"] == 24 * 3600
    bad = ok(upload(api, key, jsonl(line("a"), line("a"))))["id"]
    err = error(api("POST", ESTIMATE, key, json_body={**body, "input_file_id": bad}), 400, "line 2",
                param="input_file_id")
    assert err["code"] == "duplicate_custom_id"


def test_a_message_batch_lists_its_requests_that_would_error_and_refuses_its_shape(api, svc):
    _, key = new_key(svc)
    for version, prefix in ((V2, "/anthropic"), (V1, "")):
        messages = Messages(api, key, version, prefix)
        answer = ok(messages("POST", "/estimate", json_body={"requests": [
            entry("good", "hello world", max_tokens=10), {"custom_id": "bad", "params": {"model": GLM}}]}))
        assert answer["request_count"] == 2 and answer["max_output_tokens"] == 10
        assert [r["custom_id"] for r in answer["rejected"]] == ["bad"]
        assert "max_tokens" in answer["rejected"][0]["error"]["message"]
        for body in ({"requests": []}, {"requests": [entry("a")], "extra": 1},
                     {"requests": [entry("a"), entry("a")]}):
            refused = messages.create(body["requests"]) if set(body) == {"requests"} else messages("POST",
                                                                                                json_body=body)
            estimated = messages("POST", "/estimate", json_body=body)
            assert refused.status == 400 and (estimated.status, estimated.json()) == (400, refused.json())
        headerless = api("POST", f"{prefix}/v1/messages/batches/estimate", key, json_body={"requests": [entry("a")]})
        assert headerless.status == 400 and headerless.json()["error"]["message"].startswith("anthropic-version")
    assert ok(Messages(api, key)("GET"))["data"] == []


def test_reject_if_late_refuses_a_late_batch_and_admits_one_in_time(api, svc):
    _, key = new_key(svc)
    Budget.note_latency(svc.table, GLM, 2.0, svc.now())
    requests = [chat_request(f"q{i}", "hi", max_tokens=5) for i in range(64)]  # 64 / 16 slots x 2 s: ~11 s
    settings(svc, batch_completion_window_seconds=5)
    refused = api("POST", "/v1/batches", key, json_body={"requests": requests, "admission": "reject_if_late"})
    err = error(refused, 429, "would not finish within its completion window of 5 s", "reject_if_late",
                code="batch_would_be_late")
    assert "no requests ahead, 16 slots, 2.0 s a call" in err["message"]
    assert int(refused.headers["retry-after"]) >= 1 and refused.headers["x-should-retry"] == "false"
    assert ok(api("GET", "/v1/batches", key))["data"] == []
    estimate = ok(api("POST", ESTIMATE, key, json_body={"requests": requests}))
    assert estimate["fits_window"] is False
    # On an idle model: 4 waves of 16 calls of 2 s, half a call, a pump's start and the batch's end.
    assert estimate["models"][0]["estimated_seconds"] == pytest.approx(8 + 1 + IDLE_START_SECONDS + END_SECONDS)
    settings(svc, batch_completion_window_seconds=60)
    created = ok(api("POST", "/v1/batches", key, json_body={"requests": requests, "admission": "reject_if_late"}))
    assert finish(svc, created["id"], timeout=60)["status"] == "completed"


def test_the_queue_ahead_counts_every_batch_waiting_past_one_read_of_a_hundred(api, svc):
    settings(svc, max_unfinished_batches=200)
    _, other = new_key(svc)
    for i in range(105):  # more lanes than one BatchGetItem reads
        ok(api("POST", "/v1/batches", other,
               json_body={"requests": [chat_request(f"o{i}", "x"), chat_request("p", "y")]}))
    _, key = new_key(svc)
    answer = ok(api("POST", ESTIMATE, key, json_body={"requests": [chat_request("a", "hi")]}))
    assert read_queue(svc, svc.catalog.get(GLM)).ahead == 210  # what the estimate's arithmetic uses
    assert answer["models"][0]["queue_ahead"] == 200  # what the caller sees of other accounts' backlog


@pytest.mark.parametrize(("count", "shown"), [(0, 0), (1, 1), (2, 2), (4, 2), (5, 5), (9, 5), (10, 10), (19, 10),
                                              (20, 20), (64, 50), (99, 50), (100, 100), (210, 200), (4_999, 2_000),
                                              (5_000, 5_000), (123_456, 100_000), (-3, 0)])
def test_the_queue_ahead_shown_is_a_lower_bound_on_a_1_2_5_scale(count, shown):
    assert coarse_count(count) == shown


def test_one_more_request_of_another_account_does_not_show_in_the_queue_ahead(api, svc):
    """Another account's backlog moves the figure only when it crosses a step of the scale."""
    _, other = new_key(svc)
    _, key = new_key(svc)
    seen = []
    for size in (52, 1, 1, 1):
        ok(api("POST", "/v1/batches", other, json_body={"requests": [chat_request(f"o{i}", "x") for i in range(size)]}))
        answer = ok(api("POST", ESTIMATE, key, json_body={"requests": [chat_request("a", "hi")]}))
        seen.append(answer["models"][0]["queue_ahead"])
    assert seen == [50, 50, 50, 50]
