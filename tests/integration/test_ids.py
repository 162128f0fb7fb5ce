"""Ids and cursors a client makes up, through the real API handler (Mangum, API Gateway events): every route
that takes one answers an id that cannot be ours exactly as it answers any unknown id, whatever its length.
DynamoDB refuses a key over 2,048 bytes (partition) or 1,024 bytes (sort) with a ValidationException even on
a read; the tests' moto does too (local.moto_patches), so an id that reached storage would show here as a 500."""

from __future__ import annotations

import pytest

from batchinfer.errors import QUOTED_CHARS, clipped
from tests.helpers import new_key, ok, settings
from tests.integration.test_message_batches import V1
from tests.integration.test_uploads import BOUNDARY, part_body

LONG = "a" * 3000
ANTHROPIC = {"anthropic-version": V1}
MULTIPART = {"content-type": f"multipart/form-data; boundary={BOUNDARY}"}

# (method, path, query, JSON body, the prefix of the kind of id it takes, status for an unknown one).
# `{id}` is where the id goes; `{batch}` is a batch of the caller's.
OPENAI_ROUTES = [
    ("GET", "/v1/batches/{id}", None, None, "batch_", 404),
    ("GET", "/v1/batches/{id}/results", None, None, "batch_", 404),
    ("GET", "/v1/batches/{id}/output.jsonl", None, None, "batch_", 404),
    ("POST", "/v1/batches/{id}/cancel", None, None, "batch_", 404),
    ("DELETE", "/v1/batches/{id}", None, None, "batch_", 404),
    ("GET", "/v1/batches", {"after": "{id}"}, None, "batch_", 400),
    ("GET", "/v1/batches/{batch}/results", {"after": "{id}"}, None, "batch_req_", 400),
    ("GET", "/v1/files/{id}", None, None, "file-", 404),
    ("GET", "/v1/files/{id}/content", None, None, "file-", 404),
    ("DELETE", "/v1/files/{id}", None, None, "file-", 404),
    ("GET", "/v1/files", {"after": "{id}"}, None, "file-", 400),
    ("POST", "/v1/batches", None, {"input_file_id": "{id}", "endpoint": "/v1/chat/completions",
                                   "completion_window": "24h"}, "file-", 400),
    ("POST", "/v1/uploads/{id}/parts", None, part_body(b"x"), "upload_", 404),
    ("POST", "/v1/uploads/{id}/complete", None, {"part_ids": []}, "upload_", 404),
    ("POST", "/v1/uploads/{id}/cancel", None, None, "upload_", 404),
    ("GET", "/v1/batch_webhook/events", {"after": "{id}"}, None, "evt_", 400),
]
ANTHROPIC_ROUTES = [
    (method, prefix + path, query, None, "msgbatch_", status)
    for prefix in ("", "/anthropic")
    for method, path, query, status in [
        ("GET", "/v1/messages/batches/{id}", None, 404),
        ("GET", "/v1/messages/batches/{id}/results", None, 404),
        ("POST", "/v1/messages/batches/{id}/cancel", None, 404),
        ("DELETE", "/v1/messages/batches/{id}", None, 404),
        ("GET", "/v1/messages/batches", {"after_id": "{id}"}, 400),
        ("GET", "/v1/messages/batches", {"before_id": "{id}"}, 400),
    ]
]
ROUTES = OPENAI_ROUTES + ANTHROPIC_ROUTES


def route_name(route: tuple) -> str:
    method, path, query, _, _, _ = route
    return f"{method} {path}" + "".join(f" {name}=" for name in query or {})


@pytest.fixture
def caller(api, svc):
    settings(svc, file_batches_enabled=True, message_batches_enabled=True, batch_webhooks_enabled=True)
    _, key = new_key(svc)
    batch = ok(api.create(key, [{"custom_id": "a", "body": {"model": "glm-5.3-flash",
                                                            "messages": [{"role": "user", "content": "x"}]}}]))
    return key, batch["id"]


def call(api, caller, route: tuple, made_up: str):
    method, path, query, body, _, _ = route
    key, batch_id = caller
    path = path.replace("{batch}", batch_id).replace("{id}", made_up)
    query = {name: value.replace("{id}", made_up) for name, value in query.items()} if query else None
    headers = dict(ANTHROPIC) if "/messages/" in path else {}
    kwargs: dict = {}
    if isinstance(body, bytes):
        kwargs["body"], headers = body, {**headers, **MULTIPART}
    elif body is not None:
        kwargs["json_body"] = {name: value.replace("{id}", made_up) if isinstance(value, str) else value
                               for name, value in body.items()}
    return api(method, path, key, query=query, headers=headers, **kwargs)


def shape(reply, made_up: str) -> tuple:
    """What a client sees of a refusal, with the id it sent taken out of the message (as a message quotes it:
    whole when short, its start and '...' when long; never the whole of a long one)."""
    body = reply.json()
    error = body["error"]
    assert len(made_up) <= QUOTED_CHARS or made_up not in reply.text, reply.text[:300]
    return reply.status, set(body), error.get("type"), error.get("code"), error.get("param"), \
        error["message"].replace(clipped(made_up), "<id>")


@pytest.mark.parametrize("route", ROUTES, ids=route_name)
def test_an_id_too_long_to_be_a_key_is_answered_as_any_unknown_id(api, caller, route):
    prefix, status = route[4], route[5]
    unknown = prefix + "0" * 24 if prefix != "batch_req_" else "nope"
    too_long = prefix + LONG
    expected = call(api, caller, route, unknown)
    assert expected.status == status, expected.text
    reply = call(api, caller, route, too_long)
    assert reply.status < 500, (reply.status, reply.text[:300])
    assert shape(reply, too_long) == shape(expected, unknown)


@pytest.mark.parametrize("route", [r for r in ROUTES if r[4] != "batch_req_"], ids=route_name)
def test_an_id_of_many_bytes_in_few_characters_is_answered_as_unknown(api, caller, route):
    made_up = route[4] + "\u00e9" * 1100  # 2,200 bytes in UTF-8
    reply = call(api, caller, route, made_up)
    assert reply.status == route[5], (reply.status, reply.text[:300])
