"""/openapi.json against the app that serves it: Schemathesis generates requests for every operation from
the document (schema-valid ones and, where the document constrains something, schema-violating ones) and
checks each answer: no 5xx, a documented status code, a documented content type, and a body that matches
the declared schema. The app runs in-process (ASGI) on moto and the simulated backend, with batches of
every kind already stored (completed with a failed request, queued, cancelled, another account's), so the
generated requests meet real objects and not only 404s.

The run is bounded and reproducible: a few cases per operation, derandomized, well under a minute.
"""

from __future__ import annotations

import json
import os
import time
from collections import Counter
from dataclasses import dataclass, field

import pytest
import schemathesis
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from schemathesis import GenerationMode
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from batchinfer.api.app import create_app
from batchinfer.operations.anthropic import message_batches
from batchinfer.operations.openai import batches
from batchinfer.service.accounts import authenticate
from tests.helpers import chat_request, drive, new_key

CHECKS = [not_a_server_error, status_code_conformance, content_type_conformance, response_schema_conformance]
# Cases per operation (operations with nothing to vary stop after their few distinct ones); raise it for a
# deeper look: OPENAPI_FUZZ_EXAMPLES=200 runs some 3,900 cases in about 110 s.
MAX_EXAMPLES = int(os.environ.get("OPENAPI_FUZZ_EXAMPLES", "20"))
MAX_BODY_BYTES = 4096  # lowered for the run, so that generated bodies also meet the 413
SETTINGS = settings(
    max_examples=MAX_EXAMPLES, deadline=None, derandomize=True, database=None, phases=[Phase.generate, Phase.shrink],
    # A case is an HTTP call on moto, slower than Hypothesis expects; negative cases of an operation with little
    # to negate (a path's free string) are mostly filtered out; bodies of up to three requests are large.
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much, HealthCheck.data_too_large],
)
# How a case is authenticated: mostly with the account's key (either header an SDK sends), sometimes with
# none or an unknown one (a 401, which every operation documents).
AUTH = st.sampled_from(["bearer", "bearer", "bearer", "x-api-key", "none", "unknown"])


@dataclass
class World:
    """What is stored before the run: the caller's key and batches, and ids to aim requests at."""

    key: str
    batch_ids: list[str]  # OpenAI-shaped batches and Message Batches (each reads as not found on the other API)
    foreign_batch_id: str
    message_batch_ids: list[str]
    message_batches_to_delete: dict[str, list[str]]  # base URL -> ended Message Batches its delete may take
    seen: Counter = field(default_factory=Counter)  # (operation, status) -> cases

    def headers(self, auth: str) -> dict[str, str]:
        return {"bearer": {"authorization": f"Bearer {self.key}"}, "x-api-key": {"x-api-key": self.key},
                "none": {}, "unknown": {"authorization": "Bearer hyi-not-a-key"}}[auth]


def seed(svc) -> World:
    # Room for every batch the run creates: the unfinished-batch limit has its own tests.
    svc.settings = svc.settings.model_copy(update={"max_body_bytes": MAX_BODY_BYTES, "message_batches_enabled": True,
                                                   "max_unfinished_batches": 1000})
    _, key = new_key(svc)
    who = authenticate(svc, key)

    def create(requests: list[dict], **payload) -> str:
        obj, _ = batches.create_batch(svc, who, json.dumps({"requests": requests, **payload}).encode(), None)
        return obj["id"]

    finished = create([chat_request("ok-1", "one"), chat_request("bad", "[[sim:400]] two"),
                       chat_request("ok-2", "three")], metadata={"purpose": "openapi"})
    assert drive(svc, finished, clock_step=2)["status"] == "completed"
    cancelled = create([chat_request("c-1", "cancel me")])
    batches.cancel_batch(svc, who, cancelled)
    _, other_key = new_key(svc)
    other = authenticate(svc, other_key)
    foreign, _ = batches.create_batch(svc, other, json.dumps({"requests": [chat_request("f", "x")]}).encode(), None)

    def create_messages(entries: list[dict]) -> str:
        item, _ = message_batches.create(svc, who, json.dumps({"requests": entries}).encode(), None, "2026-10-21")
        return item["id"]

    ended = create_messages([message_entry("ok", "one"), message_entry("bad", "two", model="nope")])
    assert drive(svc, ended, clock_step=2)["status"] == "completed"
    # Created after the last batch was driven to its end, so that they are still unfinished.
    queued = create([chat_request(f"q-{i}", f"queued {i}") for i in range(3)])
    running = create_messages([message_entry(f"m-{i}", f"queued {i}") for i in range(3)])
    # Cancelled before it ran: ended with a canceled request, which a retry in place runs again.
    canceled = create_messages([message_entry("c", "cancel me")])
    message_batches.cancel(svc, who, canceled)
    message_ids = [ended, running, canceled]
    # Every request errored at intake: ended at once. Each base URL's delete gets its own (the first to run
    # would delete every one of them).
    to_delete = {prefix: [create_messages([message_entry("x", "ended at once", model="nope")]) for _ in range(2)]
                 for prefix in ("", "/anthropic")}
    return World(key=key, batch_ids=[finished, queued, cancelled, *message_ids], foreign_batch_id=foreign["id"],
                 message_batch_ids=message_ids, message_batches_to_delete=to_delete)


def message_entry(custom_id: str, content: str, model: str = "glm-5.3-flash") -> dict:
    return {"custom_id": custom_id, "params": {"model": model, "max_tokens": 16,
                                               "messages": [{"role": "user", "content": content}]}}


# Schemathesis draws strings that UTF-8 can encode; JSON can also spell half a surrogate pair ("\ud800"), as
# a client that cut an emoji in two sends, so the hostile bodies have strings holding one.
TEXT = st.text(st.characters(codec="utf-8"), min_size=1, max_size=12)
SURROGATE = st.characters(min_codepoint=0xD800, max_codepoint=0xDFFF)
HOSTILE_TEXT = TEXT | st.builds(lambda a, s, b: a + s + b, st.text(max_size=3), SURROGATE, st.text(max_size=3))
MODEL = st.just("glm-5.3-flash")


def create_bodies(text: st.SearchStrategy[str], model: st.SearchStrategy[str] = MODEL) -> st.SearchStrategy[dict]:
    """Bodies the service accepts but for what `text` and `model` may hold (generated bodies name no model of
    the catalog, so they stop at the first check of the first request)."""
    def body(requests: list[tuple[str, str]], metadata: dict | None, model: str) -> dict:
        return {"requests": [chat_request(c, t, model=model) for c, t in requests],
                **({"metadata": metadata} if metadata is not None else {})}

    requests = st.lists(st.tuples(text, text), min_size=1, max_size=3, unique_by=lambda r: r[0])
    return st.builds(body, requests, st.none() | st.dictionaries(text, text, max_size=2), model)


# Result ids with digits Python's int() reads, or not: superscripts, other scripts, past its 4,300 digits.
RESULT_IDS = st.one_of(
    st.text(st.characters(categories=["Nd", "No"]), min_size=1, max_size=3),
    st.sampled_from(["9" * 4301, "1" * 30]),
).map(lambda digits: "batch_req_" + digits)


def case_groups(operation, world: World) -> dict[str, tuple[st.SearchStrategy, st.SearchStrategy[str]]]:
    """The cases to run for an operation, each group with its own budget of examples, and how they sign in:
    Schemathesis' own (positive and negative, mixed as its fuzzing phase mixes them), then, with the key,
    ones aimed at the stored batches and ones carrying the strings Schemathesis does not draw."""
    keyed = st.sampled_from(["bearer", "x-api-key"])
    groups = {"generated": (st.one_of([operation.as_strategy(generation_mode=m) for m in GenerationMode]), AUTH)}
    path = {p.name for p in operation.path_parameters}
    query = {p.name for p in operation.query}
    stored: list[st.SearchStrategy] = []
    if "batch_id" in path:
        ids = st.sampled_from([*world.batch_ids, world.foreign_batch_id])
        if operation.method.upper() == "DELETE" and "/messages/" in operation.path:
            prefix = "/anthropic" if operation.path.startswith("/anthropic") else ""
            ids = st.sampled_from([*world.batch_ids, *world.message_batches_to_delete[prefix]])
        stored.append(ids.flatmap(lambda batch_id: operation.as_strategy(path_parameters={"batch_id": batch_id})))
    if "after" in query:
        if "batch_id" in path:  # results: pages of the finished batch, and result ids int() cannot read
            on = {"path_parameters": {"batch_id": world.batch_ids[0]}}
            stored.append(operation.as_strategy(query={"after": "batch_req_1"}, **on))
            groups["hostile"] = (RESULT_IDS.flatmap(lambda after: operation.as_strategy(query={"after": after}, **on)),
                                 keyed)
        else:
            stored.append(st.sampled_from(world.batch_ids[:2]).flatmap(
                lambda after: operation.as_strategy(query={"after": after})))
    if {"after_id", "before_id"} & query:
        name = sorted({"after_id", "before_id"} & query)
        stored.append(st.tuples(st.sampled_from(name), st.sampled_from(world.message_batch_ids)).flatmap(
            lambda pair: operation.as_strategy(query={pair[0]: pair[1], "limit": 1})))
    if operation.method.upper() == "POST" and operation.path.endswith("/v1/messages/batches"):
        entries = st.lists(st.tuples(st.from_regex(r"[A-Za-z0-9_-]{1,8}", fullmatch=True), TEXT), min_size=1,
                           max_size=3, unique_by=lambda r: r[0])
        stored.append(entries.flatmap(lambda es: operation.as_strategy(
            body={"requests": [message_entry(c, t) for c, t in es]})))
    if operation.method.upper() == "POST" and operation.path == "/v1/batches":
        stored.append(create_bodies(TEXT).flatmap(lambda body: operation.as_strategy(body=body)))
        hostile = create_bodies(HOSTILE_TEXT, MODEL | HOSTILE_TEXT)
        groups["hostile"] = (hostile.flatmap(lambda body: operation.as_strategy(body=body)), keyed)
    if stored:
        groups["stored"] = (st.one_of(stored), keyed)
    return groups


@pytest.fixture(scope="module")
def openapi_schema():
    return schemathesis.openapi.from_asgi("/openapi.json", create_app())


def operations(schema) -> list:
    found = [result.ok() for result in schema.get_all_operations()]
    # Deletes last, so the operations before them meet the stored batches; cancels just before them, so the
    # operations before them (pause, resume) meet unfinished ones.
    return sorted(found, key=lambda op: (op.method.upper() == "DELETE", op.path.endswith("/cancel")))


def run_operation(operation, world: World) -> dict[str, str]:
    failures = {}
    for group, (cases, auths) in case_groups(operation, world).items():
        @SETTINGS
        @given(case=cases, auth=auths)
        def check(case, auth: str) -> None:
            try:
                response = case.call_and_validate(headers=world.headers(auth), checks=CHECKS)
            except schemathesis.errors.FailureGroup:
                raise
            except Exception as error:  # in-process, Starlette re-raises what it answered with a 500
                raise AssertionError(f"500: the app raised {type(error).__name__}: {error}\n"
                                     f"{case.as_curl_command(headers={'authorization': '[key]'})}") from None
            world.seen[(operation.label, response.status_code)] += 1

        try:
            check()
        except (Exception, schemathesis.errors.FailureGroup) as error:  # collect (shrunk), go on
            parts = error.exceptions if isinstance(error, BaseExceptionGroup) else (error,)
            failures[f"{operation.label} ({group} cases)"] = "\n".join(f"{type(e).__name__}: {e}" for e in parts)
    return failures


def test_every_operation_answers_as_its_document_says(svc, openapi_schema):
    world = seed(svc)
    started = time.monotonic()
    failures: dict[str, str] = {}
    ops = operations(openapi_schema)
    for operation in ops:
        failures.update(run_operation(operation, world))
    elapsed = time.monotonic() - started
    cases = sum(world.seen.values())
    summary = "\n".join(f"  {label} -> {status}: {n}" for (label, status), n in sorted(world.seen.items()))
    print(f"\nschemathesis {schemathesis.__version__}: {len(ops)} operations, {cases} cases in {elapsed:.1f} s\n"
          + summary)
    assert not failures, "\n\n".join(f"{label}\n{text}" for label, text in failures.items())
    # The run reached what it is for: every operation, real objects in the answers the schemas describe, and
    # refusals of a missing or unknown key.
    assert len(ops) == 55, [op.label for op in ops]
    statuses: dict[str, set[int]] = {}
    for label, status in world.seen:
        statuses.setdefault(label, set()).add(status)
    for label in ("GET /v1/models", "POST /v1/batches", "GET /v1/batches", "GET /v1/batches/{batch_id}",
                  "GET /v1/batches/{batch_id}/results", "GET /v1/batches/{batch_id}/output.jsonl",
                  "POST /v1/batches/{batch_id}/cancel", "POST /v1/batches/{batch_id}/pause",
                  "POST /v1/batches/{batch_id}/resume", "DELETE /v1/batches/{batch_id}",
                  "POST /v1/batches/{batch_id}/retry"):
        assert 200 in statuses[label], (label, statuses[label])
    for prefix in ("", "/anthropic"):
        for label in ("POST {}/v1/messages/batches", "GET {}/v1/messages/batches",
                      "GET {}/v1/messages/batches/{{batch_id}}", "GET {}/v1/messages/batches/{{batch_id}}/results",
                      "POST {}/v1/messages/batches/{{batch_id}}/cancel",
                      "POST {}/v1/messages/batches/{{batch_id}}/pause",
                      "POST {}/v1/messages/batches/{{batch_id}}/resume", "DELETE {}/v1/messages/batches/{{batch_id}}",
                      "POST {}/v1/messages/batches/{{batch_id}}/retry"):
            label = label.format(prefix)
            assert 200 in statuses[label], (label, statuses[label])
    assert all(401 in statuses[op.label] for op in ops if op.path != "/health"), statuses


# --- The document itself ------------------------------------------------------------------------------

OPENAI_PREFIXES = ("/v1/batches", "/v1/files", "/v1/uploads", "/v1/batch_webhook", "/v1/chat/completions",
                   "/v1/embeddings", "/v1/responses", "/v1/models")
ANTHROPIC_PREFIXES = ("/v1/messages", "/anthropic/")


def test_document_declares_the_create_body_and_each_apis_error_envelope():
    document = TestClient(create_app()).get("/openapi.json").json()

    def deref(node: dict) -> dict:
        while "$ref" in node:
            target = document
            for part in node["$ref"].removeprefix("#/").split("/"):
                target = target[part]
            node = target
        return node

    body = document["paths"]["/v1/batches"]["post"]["requestBody"]
    assert body["required"] is True
    create = deref(body["content"]["application/json"]["schema"])
    # Either an inline batch (requests) or a batch from a file (input_file_id, endpoint, completion_window).
    assert {"requests", "input_file_id", "endpoint", "completion_window", "metadata"} <= set(create["properties"])
    # The spending cap, an extension of both create bodies and both batch objects.
    cap = next(option for option in create["properties"]["max_cost_usd"]["anyOf"] if option.get("type") == "number")
    assert cap["exclusiveMinimum"] == 0 and "max_cost_reached" in create["properties"]["max_cost_usd"]["description"]
    schemas = document["components"]["schemas"]
    assert "max_cost_usd" in schemas["CreateMessageBatch"]["properties"]
    assert "max_cost_usd" in schemas["BatchObject"]["properties"]
    assert {"max_cost_usd", "cost_usd", "error"} <= set(schemas["MessageBatch"]["properties"])
    requests = next(deref(option) for option in create["properties"]["requests"]["anyOf"]
                    if deref(option).get("type") == "array")
    assert deref(requests["items"])["required"] == ["custom_id", "body"]
    headers = [p["name"] for p in document["paths"]["/v1/batches"]["post"]["parameters"] if p["in"] == "header"]
    assert headers == ["Idempotency-Key"]
    # The priority extension: on create, on the batch objects, and its own route with a body of one field.
    priorities = ["high", "normal", "low"]
    assert create["properties"]["priority"]["enum"] == priorities
    for shape in ("BatchObject", "CreateMessageBatch", "MessageBatch"):
        assert document["components"]["schemas"][shape]["properties"]["priority"]["enum"] == priorities, shape
    for path in ("/v1/batches/{batch_id}/priority", "/v1/messages/batches/{batch_id}/priority",
                 "/anthropic/v1/messages/batches/{batch_id}/priority"):
        change = document["paths"][path]["post"]
        assert deref(change["requestBody"]["content"]["application/json"]["schema"])["required"] == ["priority"]
        assert "409" in change["responses"], path

    # Retry in place (an extension): an optional body naming what it takes, the Idempotency-Key, the batch back.
    for path, model, statuses in (("/v1/batches/{batch_id}/retry", "RetryBatch", ["failed", "expired", "cancelled"]),
                                  ("/anthropic/v1/messages/batches/{batch_id}/retry", "RetryMessageBatch",
                                   ["errored", "expired", "canceled"])):
        operation = document["paths"][path]["post"]
        assert operation["requestBody"].get("required", False) is False
        schema = operation["requestBody"]["content"]["application/json"]["schema"]
        retry_body = deref(next(o for o in schema.get("anyOf", [schema]) if "$ref" in o))  # or no body at all
        assert retry_body["title"] == model and set(retry_body["properties"]) == {"custom_ids", "error_codes",
                                                                                  "max_cost_usd", "statuses"}
        shown = next(o for o in retry_body["properties"]["statuses"]["anyOf"] if o.get("type") == "array")
        assert deref(shown["items"])["enum"] == statuses
        assert "Idempotency-Key" in [p["name"] for p in operation["parameters"] if p["in"] == "header"]
        assert "409" in operation["responses"] and "200" in operation["responses"]

    checked = 0
    for path, operations_of_path in document["paths"].items():
        if path == "/health":
            continue
        envelope = ("AnthropicError" if path.startswith(ANTHROPIC_PREFIXES)
                    else "OpenAIError" if path.startswith(OPENAI_PREFIXES) else None)
        assert envelope, f"{path} belongs to no API"
        for method, operation in operations_of_path.items():
            for status in ("400", "401"):
                answer = operation["responses"].get(status)
                assert answer, f"{method.upper()} {path} does not document {status}"
                schema = answer["content"]["application/json"]["schema"]
                assert schema == {"$ref": f"#/components/schemas/{envelope}"}, (method, path, status, schema)
            assert "422" not in operation["responses"]
            checked += 1
    assert checked >= 20


def test_what_schemathesis_cannot_send_is_refused_too(svc):
    """Bytes Schemathesis never puts on the wire (it sends UTF-8 JSON and sets Content-Length itself): the raw
    UTF-8 of a surrogate, a lone one in a UTF-16 body, a Content-Length int() cannot read."""
    _, key = new_key(svc)
    client = TestClient(create_app(), raise_server_exceptions=False)
    auth = {"authorization": f"Bearer {key}"}
    body = json.dumps({"requests": [chat_request("a", "X")]}).encode()
    for raw in (body.replace(b"X", b"\xed\xa0\x80"),
                body.decode().replace("X", "\ud800").encode("utf-16", "surrogatepass")):
        answer = client.post("/v1/batches", content=raw, headers=auth)
        assert answer.status_code == 400 and "unpaired surrogate" in answer.json()["error"]["message"], answer.text
    for declared, status in ((b"\xb2", 200), (b"9" * 5000, 413), (b"0" * 30 + str(len(body)).encode(), 200)):
        answer = client.post("/v1/batches", content=body, headers={**auth, "content-length": declared})
        assert answer.status_code == status, (declared[:40], answer.text)
