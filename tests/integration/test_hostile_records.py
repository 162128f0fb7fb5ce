"""Whatever a client sends, what the service stores from it stays small: every value copied from input into
a record is clipped, every list of them bounded (the rest summarized), and a number DynamoDB cannot hold is
a 400 naming its field, on every API that takes it. Through the real API handler, sweeper and moto (which
refuses an item over 400 KB and such numbers as DynamoDB does, local.moto_patches)."""

from __future__ import annotations

import json
import re

import pytest
from hypothesis import HealthCheck, example, given
from hypothesis import settings as hypothesis_settings
from hypothesis import strategies as st
from moto.dynamodb.models.dynamo_type import DynamoType

from batchinfer.errors import QUOTED_CHARS
from batchinfer.layout import batch_key
from batchinfer.service.background.sweep import sweep_once
from batchinfer.service.creating.validation import MAX_PROBLEM_CHARS, MAX_PROBLEMS_BYTES, MAX_REPORTED_PROBLEMS
from local.moto_patches import item_size
from tests.helpers import anthropic_error, error, finish, new_key, ok, req, settings
from tests.integration.test_files import create_from, jsonl, line, upload

RECORD_BOUND = 64 * 1024  # what any record input can make is held to, far under DynamoDB's 400 KB
ANTHROPIC = {"anthropic-version": "2023-06-01"}
MESSAGE_BATCH_PATHS = ("/v1/messages/batches", "/anthropic/v1/messages/batches")


def largest_record(svc) -> tuple[int, str]:
    """The largest item of the table, as DynamoDB counts its size, and its key."""
    largest, where, start = 0, "", None
    while True:
        page = svc.table.client.scan(TableName=svc.table.name, **({"ExclusiveStartKey": start} if start else {}))
        for raw in page["Items"]:
            size = item_size({name: DynamoType(value) for name, value in raw.items()})
            if size > largest:
                largest, where = size, f"{raw['pk']['S']} {raw['sk']['S']}"
        start = page.get("LastEvaluatedKey")
        if not start:
            return largest, where


def assert_records_bounded(svc) -> None:
    size, where = largest_record(svc)
    assert size <= RECORD_BOUND, f"{where} holds {size} bytes"


def assert_problems_bounded(problems: list[dict]) -> None:
    assert 1 <= len(problems) <= MAX_REPORTED_PROBLEMS
    assert len(json.dumps(problems)) <= MAX_PROBLEMS_BYTES
    for problem in problems:
        assert len(problem["message"]) <= MAX_PROBLEM_CHARS + 3, problem["message"][:200]


# --- The poisoned file ----------------------------------------------------------------------------------

def poisoned_file() -> bytes:
    """Lines with huge values where only short ones are valid, and more bad lines than a batch lists."""
    bad_keys = {f"{i:03d}" + "k" * 297: "v" for i in range(400)}
    return jsonl({**line("method"), "method": "X" * 600_000},
                 {**line("url"), "url": "/" + "u" * 300_000},
                 {**line("keys"), **bad_keys},
                 line("x" * 300, model="m" * 200_000),
                 *[{**line(f"dup-{i}"), "custom_id": "same"} for i in range(150)])


def test_a_poisoned_file_fails_its_batch_with_its_problems_clipped_and_summarized(api, svc, sim_control):
    settings(svc, file_batches_enabled=True)
    _, key = new_key(svc)
    file = ok(upload(api, key, poisoned_file()))
    created = ok(create_from(api, key, file["id"]))
    failed = finish(svc, created["id"])
    assert failed["status"] == "failed"
    shown = ok(api("GET", f"/v1/batches/{created['id']}", key))
    problems = shown["errors"]["data"]
    assert_problems_bounded(problems)
    first = {p["line"]: p for p in problems[:4]}
    assert first[1]["code"] == "invalid_method" and first[1]["message"] == (
        f"method must be POST, not '{'X' * QUOTED_CHARS}...'")
    assert first[2]["code"] == "url_mismatch"
    assert first[2]["message"].startswith(f"url '/{'u' * (QUOTED_CHARS - 1)}...'")
    assert first[3]["code"] == "invalid_request"
    assert first[3]["message"].endswith("and 395 more.") and first[3]["message"].count("'") == 10
    assert first[4]["code"] == "model_not_found" and len(first[4]["message"]) < 120
    # 154 lines, the first of the duplicates valid: 153 problems, 99 listed and the rest counted.
    assert problems[-1] == {"code": "more_errors", "message": "...and 54 more problems.", "param": None,
                            "line": None}
    assert all(p["code"] == "duplicate_custom_id" for p in problems[4:-1])
    assert_records_bounded(svc)


def test_a_file_batch_whose_problems_would_not_fit_its_item_still_fails(api, svc, monkeypatch):
    """Were the problems ever too large for the batch item (storage's ItemTooLarge), the batch ends failed
    with a summary instead of staying `validating`, holding a slot and its input re-read at every sweep."""
    from batchinfer.service import lifecycle

    settings(svc, file_batches_enabled=True)
    _, key = new_key(svc)
    file = ok(upload(api, key, jsonl(line("a"), line("a"))))
    created = ok(create_from(api, key, file["id"]))
    monkeypatch.setattr(lifecycle, "bounded_problems", lambda problems: [
        {"code": "invalid_request", "message": "m" * 100_000, "param": None, "line": n} for n in range(5)])
    sweep_once(svc)
    batch = svc.table.get(*batch_key(created["id"]))
    assert batch["status"] == "failed" and not batch.get("awaiting_validation")
    assert [p["code"] for p in batch["errors"]["data"]] == ["invalid_file"]
    assert ok(api("GET", "/v1/batches", key))["data"][0]["status"] == "failed"


# --- Hostile input, any size: a property --------------------------------------------------------------

def sized(alphabet: str = "xé\"\\k") -> st.SearchStrategy[str]:
    """Text of any size up to 700 KB (one character repeated: the size is what matters, not the text)."""
    return st.builds(lambda c, n: c * n, st.sampled_from(alphabet), st.integers(0, 700_000))


VALUES = st.one_of(sized(), st.integers(), st.floats(allow_nan=False, allow_infinity=False), st.booleans(),
                   st.none(), st.lists(st.text(max_size=20), max_size=5))
KEYS = st.builds(lambda c, n, i: f"{i}{c * n}", st.sampled_from("kK_é"), st.integers(0, 2_000), st.integers(0, 99))
FIELDS = ("custom_id", "method", "url", "body")


@st.composite
def hostile_line(draw) -> dict:
    """A line: some of the four fields (each hostile or valid), and any number of other keys."""
    entry = line(f"c-{draw(st.integers(0, 5))}")
    for name in FIELDS:
        choice = draw(st.sampled_from(["keep", "drop", "hostile"]))
        if choice == "drop":
            entry.pop(name)
        elif choice == "hostile":
            entry[name] = draw(VALUES)
    if draw(st.booleans()) and isinstance(entry.get("body"), dict):
        entry["body"] = {**entry["body"], "model": draw(sized()), draw(KEYS): draw(VALUES)}
    extra = draw(st.integers(0, 400))
    if extra:
        entry.update({f"{i:03d}{draw(KEYS)}": "v" for i in range(extra)})
    return entry


def file_of(lines: list[dict], copies: int, limit: int = 3_900_000) -> bytes:
    """The lines, repeated, up to what one direct upload takes (a line cut there is one more that is not JSON)."""
    encoded = [json.dumps(entry).encode() + b"\n" for entry in lines]
    data = bytearray()
    for _ in range(copies):
        for one in encoded:
            if len(data) >= limit:
                return bytes(data[:limit])
            data += one
    return bytes(data[:limit])


PROPERTY = hypothesis_settings(max_examples=12, deadline=None, derandomize=True,
                               suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow,
                                                      HealthCheck.data_too_large, HealthCheck.large_base_example])


POISON = [{**line("method"), "method": "X" * 600_000}, {**line("url"), "url": "/" + "u" * 300_000},
          {**line("keys"), **{f"{i:03d}" + "k" * 297: "v" for i in range(400)}}]


@PROPERTY
@given(lines=st.lists(hostile_line(), min_size=1, max_size=6), copies=st.integers(1, 300))
@example(lines=POISON, copies=3)
@example(lines=[{**line("u"), "url": "u" * 300_000, "method": "M" * 300_000, "k" * 300_000: 1}], copies=12)
def test_no_file_of_any_values_makes_a_record_larger_than_the_bound(api, svc, lines, copies):
    settings(svc, file_batches_enabled=True)
    _, key = new_key(svc)  # an account each: uploads and unfinished batches are counted per account
    data = file_of(lines, copies)
    file = upload(api, key, data)
    assert file.status in (200, 413), file.text
    if file.status == 200:
        created = ok(create_from(api, key, file.json()["id"]))
        sweep_once(svc)
        batch = svc.table.get(*batch_key(created["id"]))
        assert not batch.get("awaiting_validation"), batch["status"]
        if batch["status"] == "failed":
            assert_problems_bounded(batch["errors"]["data"])
    assert_records_bounded(svc)


@PROPERTY
@given(requests=st.lists(hostile_line(), min_size=1, max_size=4), metadata=st.dictionaries(KEYS, VALUES, max_size=20))
@example(requests=POISON, metadata={})
def test_no_inline_batch_of_any_values_makes_a_record_larger_than_the_bound(api, svc, requests, metadata):
    _, key = new_key(svc)
    reply = api.create(key, requests, metadata=metadata)
    assert reply.status in (200, 400, 413), reply.text
    if reply.status == 400:
        assert len(reply.json()["error"]["message"]) <= 2_000, reply.json()["error"]["message"][:300]
    assert_records_bounded(svc)


def test_a_message_batch_request_that_cannot_run_keeps_a_clipped_reason(api, svc):
    settings(svc, message_batches_enabled=True)
    _, key = new_key(svc)
    params = {"model": "glm-5.3-flash", "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}]}
    batch = ok(api("POST", "/v1/messages/batches", key, headers=ANTHROPIC, json_body={"requests": [
        {"custom_id": "unknown-key", "params": {**params, "k" * 500_000: 1}},
        {"custom_id": "metadata", "params": {**params, "metadata": {"m" * 300_000: "x"}}},
        {"custom_id": "model", "params": {**params, "model": "g" * 300_000}},
        {"custom_id": "fine", "params": params}]}))
    finish(svc, batch["id"])
    reply = api("GET", f"/v1/messages/batches/{batch['id']}/results", key, headers=ANTHROPIC)
    results = {r["custom_id"]: r["result"] for r in map(json.loads, reply.body.split(b"\n")[:-1])}
    assert results["fine"]["type"] == "succeeded"
    for custom_id in ("unknown-key", "metadata", "model"):
        message = results[custom_id]["error"]["error"]["message"]
        assert results[custom_id]["type"] == "errored" and len(message) <= 200, (custom_id, message[:300])
    assert results["unknown-key"]["error"]["error"]["message"].startswith("k" * QUOTED_CHARS + "...: not a parameter")
    assert_records_bounded(svc)


# --- Numbers DynamoDB cannot hold --------------------------------------------------------------------

OUT_OF_RANGE = [5e-324, 1e-131, 1e126, 1e200, 10 ** 400]
CAP_RANGE = "from 1e-130 to under 1e+126"


def raw_body(payload: dict, cap: object) -> str:
    """A JSON body with `max_cost_usd` spelt as given (10**400 is valid JSON, though no double holds it)."""
    return json.dumps({**payload, "max_cost_usd": "CAP"}).replace('"CAP"', repr(cap) if isinstance(cap, int)
                                                                  else json.dumps(cap))


@pytest.mark.parametrize("cap", OUT_OF_RANGE)
def test_a_cap_dynamodb_cannot_hold_is_a_400_naming_it_on_every_create(api, svc, cap):
    settings(svc, message_batches_enabled=True, file_batches_enabled=True)
    _, key = new_key(svc)
    json_headers = {"content-type": "application/json"}
    inline = api("POST", "/v1/batches", key, headers=json_headers,
                 body=raw_body({"requests": [req("a", max_tokens=5)]}, cap))
    assert error(inline, 400, CAP_RANGE, param="max_cost_usd")
    file = ok(upload(api, key, jsonl(line("a", max_tokens=5))))
    from_file = api("POST", "/v1/batches", key, headers=json_headers, body=raw_body(
        {"input_file_id": file["id"], "endpoint": "/v1/chat/completions", "completion_window": "24h"}, cap))
    assert error(from_file, 400, CAP_RANGE, param="max_cost_usd")
    params = {"model": "glm-5.3-flash", "max_tokens": 5, "messages": [{"role": "user", "content": "hi"}]}
    for path in MESSAGE_BATCH_PATHS:
        reply = api("POST", path, key, headers={**ANTHROPIC, **json_headers},
                    body=raw_body({"requests": [{"custom_id": "a", "params": params}]}, cap))
        anthropic_error(reply, 400, "invalid_request_error", "max_cost_usd", CAP_RANGE)
    assert ok(api("GET", "/v1/batches", key))["data"] == []
    assert_records_bounded(svc)


@pytest.mark.parametrize("cap", OUT_OF_RANGE)
def test_a_cap_dynamodb_cannot_hold_is_a_400_naming_it_on_every_retry(api, svc, cap):
    settings(svc, message_batches_enabled=True, max_attempts=1)
    _, key = new_key(svc)
    json_headers = {"content-type": "application/json"}
    batch = api.created(key, [req("a", "[[sim:400]]", max_tokens=5)], max_cost_usd=1.0)
    finish(svc, batch["id"])
    # A number past a double's range is not a number to the retry body's schema: a 400 naming it all the same.
    said = (CAP_RANGE,) if isinstance(cap, float) else ()
    reply = api("POST", f"/v1/batches/{batch['id']}/retry", key, headers=json_headers, body=raw_body({}, cap))
    assert error(reply, 400, *said, param="max_cost_usd")
    params = {"model": "glm-5.3-flash", "max_tokens": 5, "messages": [{"role": "user", "content": "[[sim:400]]"}]}
    message_batch = ok(api("POST", "/v1/messages/batches", key, headers=ANTHROPIC, json_body={
        "requests": [{"custom_id": "a", "params": params}], "max_cost_usd": 1.0}))
    finish(svc, message_batch["id"])
    for path in MESSAGE_BATCH_PATHS:
        reply = api("POST", f"{path}/{message_batch['id']}/retry", key, headers={**ANTHROPIC, **json_headers},
                    body=raw_body({}, cap))
        anthropic_error(reply, 400, "invalid_request_error", "max_cost_usd", *said)


@pytest.mark.parametrize("cap", [1e-130, 9.99e125, 10 ** 125])
def test_caps_at_the_edges_of_the_range_are_stored_and_the_batch_ends(api, svc, cap):
    _, key = new_key(svc)
    batch = api.created(key, [req("a", max_tokens=5)], max_cost_usd=cap)
    ended = finish(svc, batch["id"])
    shown = ok(api("GET", f"/v1/batches/{batch['id']}", key))
    assert float(shown["max_cost_usd"]) == float(cap)
    # A cap under what one request can cost stops the batch before it; a large one lets it run.
    assert ended["status"] == ("cancelled" if cap < 1e-6 else "completed"), ended["status"]


def test_messages_echo_the_value_they_refuse_clipped(api, svc):
    _, key = new_key(svc)
    reply = api.create(key, [req("a"), {**req("b"), "method": "G" * 100_000}])
    message = error(reply, 400, "method must be POST")["message"]
    assert len(message) < 200 and re.search(r"'G{64}\.\.\.'", message), message


@pytest.mark.parametrize("size", [10 ** 200, 10 ** 40, 2 ** 63])
def test_an_upload_of_a_size_no_file_may_have_is_refused_not_stored(api, svc, size):
    settings(svc, file_batches_enabled=True)
    _, key = new_key(svc)
    body = json.dumps({"filename": "in.jsonl", "purpose": "batch", "mime_type": "text/jsonl", "bytes": "SIZE"})
    reply = api("POST", "/v1/uploads", key, headers={"content-type": "application/json"},
                body=body.replace('"SIZE"', str(size)))
    assert error(reply, 413, param="bytes")


def test_an_estimate_of_a_poisoned_file_names_its_first_problem_briefly_and_counts_them_all(api, svc):
    settings(svc, file_batches_enabled=True)
    _, key = new_key(svc)
    file = ok(upload(api, key, poisoned_file()))
    body = {"input_file_id": file["id"], "endpoint": "/v1/chat/completions", "completion_window": "24h"}
    said = error(api("POST", "/v1/batches/estimate", key, json_body=body), 400, "(153 problems in all)",
                 "line 1: method must be POST", param="input_file_id")
    assert len(said["message"]) < 300, said["message"][:400]
