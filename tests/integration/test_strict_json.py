"""A JSON body read the one way: an object that names a key twice is refused with a 400 naming the key and
where it is (I-JSON, RFC 7493), on every route that reads JSON, in each API's own envelope, rather than
read with the last one winning (a proxy in front may read the first). Through the real API handler (Mangum,
API Gateway events)."""

from __future__ import annotations

import pytest

from tests.helpers import anthropic_error, error, finish, new_key, no_batches, ok, s3_keys, settings, sim_requests
from tests.integration.test_files import create_from, jsonl, upload
from tests.integration.test_message_batches import V1

AS_JSON = {"content-type": "application/json"}
ANTHROPIC = {**AS_JSON, "anthropic-version": V1}
MESSAGES = '[{"role":"user","content":"hi"}]'
RFC = "A JSON body must name each key once (I-JSON, RFC 7493)"


def chat_line(custom_id: str, model: str = '"model":"glm-5.3-flash"') -> str:
    return f'{{"custom_id":"{custom_id}","body":{{{model},"messages":{MESSAGES}}}}}'


@pytest.mark.parametrize(("body", "message", "param"), [
    # The model a proxy would read is not the one that would run.
    ('{"requests":[' + chat_line("a") + "," + chat_line("b", '"model":"no-such-model","model":"qwen3.6-35b"') + "]}",
     "requests[1] (custom_id 'b'): body.model: the key 'model' is given more than once in one object. ",
     "requests[1].body.model"),
    # Two custom_ids in one request: neither is quoted as its name.
    ('{"requests":[{"custom_id":"a","custom_id":"b","body":{"model":"glm-5.3-flash","messages":' + MESSAGES + "}}]}",
     "requests[0]: custom_id: the key 'custom_id' is given more than once in one object. ", "requests[0].custom_id"),
    ('{"requests":[' + chat_line("a") + '],"requests":[' + chat_line("b") + "]}",
     "requests: the key 'requests' is given more than once in one object. ", "requests"),
    # Deep in a message, and a key past the length a message quotes.
    ('{"requests":[{"custom_id":"c","body":{"model":"glm-5.3-flash","messages":[{"role":"user","role":"system",'
     '"content":"hi"}]}}]}',
     "requests[0] (custom_id 'c'): body.messages[0].role: the key 'role' is given more than once in one object. ",
     "requests[0].body.messages[0].role"),
])
def test_an_inline_create_that_names_a_key_twice_is_refused_naming_it(api, svc, sim_control, body, message, param):
    _, key = new_key(svc)
    err = error(api("POST", "/v1/batches", key, body=body, headers=AS_JSON), 400, code="duplicate_key", param=param)
    assert err["message"].startswith(message) and RFC in err["message"], err
    assert no_batches(api, key) and s3_keys(svc) == [] and sim_requests(sim_control) == 0


def test_a_long_duplicated_key_is_quoted_only_in_part(api, svc):
    _, key = new_key(svc)
    long = "k" * 5000
    body = f'{{"requests":[{chat_line("a")}],"metadata":{{"{long}":"1","{long}":"2"}}}}'
    err = error(api("POST", "/v1/batches", key, body=body, headers=AS_JSON), 400, code="duplicate_key")
    assert f"the key '{'k' * 64}...' is given" in err["message"] and len(err["message"]) < 500, err
    assert err["param"] == f"metadata.{'k' * 119}...", err


def test_the_same_keys_once_each_still_create_the_batch(api, svc):
    """The check refuses only a key named twice in one object: the same key in two objects is fine."""
    _, key = new_key(svc)
    body = '{"requests":[' + chat_line("a") + "," + chat_line("b", '"model":"qwen3.6-35b"') + "]}"
    assert ok(api("POST", "/v1/batches", key, body=body, headers=AS_JSON))["request_counts"]["total"] == 2


def test_a_message_batch_create_is_refused_in_anthropics_envelope(api, svc, sim_control):
    settings(svc, message_batches_enabled=True)
    _, key = new_key(svc)
    params = '{"model":"no-such-model","max_tokens":8,"model":"glm-5.3-flash","messages":' + MESSAGES + "}"
    body = '{"requests":[{"custom_id":"m-0","params":' + params + "}]}"
    for prefix in ("", "/anthropic"):
        err = anthropic_error(api("POST", f"{prefix}/v1/messages/batches", key, body=body, headers=ANTHROPIC), 400,
                              "invalid_request_error", "requests[0] (custom_id 'm-0'): params.model: the key 'model'",
                              RFC)
        assert err["message"].startswith("requests[0] (custom_id 'm-0'): params.model: "), err
    assert ok(api("GET", "/v1/messages/batches", key, headers=ANTHROPIC))["data"] == []
    assert sim_requests(sim_control) == 0


def test_interactive_calls_are_refused_in_their_apis_envelopes(api, svc, sim_control):
    _, key = new_key(svc)
    chat = '{"model":"no-such-model","model":"glm-5.3-flash","messages":' + MESSAGES + "}"
    error(api("POST", "/v1/chat/completions", key, body=chat, headers=AS_JSON), 400,
          "model: the key 'model' is given more than once", RFC, code="duplicate_key", param="model")
    embeddings = '{"model":"glm-5.3-flash","input":"a","input":"b"}'
    error(api("POST", "/v1/embeddings", key, body=embeddings, headers=AS_JSON), 400,
          "input: the key 'input' is given more than once", code="duplicate_key", param="input")
    message = '{"model":"glm-5.3-flash","max_tokens":8,"max_tokens":4096,"messages":' + MESSAGES + "}"
    for prefix in ("", "/anthropic"):
        anthropic_error(api("POST", f"{prefix}/v1/messages", key, body=message, headers=ANTHROPIC), 400,
                        "invalid_request_error", "max_tokens: the key 'max_tokens' is given more than once", RFC)
    assert sim_requests(sim_control) == 0
    # The same bodies with each key once are served.
    ok(api("POST", "/v1/chat/completions", key, body=chat.replace('"model":"no-such-model",', ""), headers=AS_JSON))


def test_a_small_body_read_into_a_model_is_refused_too(api, svc):
    """Routes whose body FastAPI reads into a pydantic model (the webhook's) are read the same way."""
    settings(svc, batch_webhooks_enabled=True)
    _, key = new_key(svc)
    body = '{"url":"https://hooks.example.com/a","url":"https://hooks.example.com/b"}'
    error(api("PUT", "/v1/batch_webhook", key, body=body, headers=AS_JSON), 400,
          "url: the key 'url' is given more than once", code="duplicate_key", param="url")
    error(api("GET", "/v1/batch_webhook", key), 404)  # nothing was set
    # Not JSON at all is still FastAPI's refusal, in the same envelope.
    error(api("PUT", "/v1/batch_webhook", key, body='{"url":', headers=AS_JSON), 400)


def test_an_upload_create_is_refused(api, svc):
    settings(svc, file_batches_enabled=True)
    _, key = new_key(svc)
    body = '{"purpose":"batch","filename":"a.jsonl","bytes":10,"bytes":20,"mime_type":"text/jsonl"}'
    error(api("POST", "/v1/uploads", key, body=body, headers=AS_JSON), 400,
          "bytes: the key 'bytes' is given more than once", code="duplicate_key", param="bytes")


def test_a_file_line_that_names_a_key_twice_fails_the_batch_naming_its_line(api, svc, sim_control):
    settings(svc, file_batches_enabled=True)
    _, key = new_key(svc)
    twice = ('{"custom_id":"b","method":"POST","url":"/v1/chat/completions","body":{"model":"no-such-model",'
             '"model":"glm-5.3-flash","messages":' + MESSAGES + "}}")
    fine = '{"custom_id":"a","method":"POST","url":"/v1/chat/completions","body":{"model":"glm-5.3-flash","messages":' \
           + MESSAGES + "}}"
    uploaded = ok(upload(api, key, jsonl(fine, twice)))
    created = ok(create_from(api, key, uploaded["id"]))
    finish(svc, created["id"])
    batch = ok(api("GET", f"/v1/batches/{created['id']}", key))
    assert batch["status"] == "failed", batch
    [problem] = batch["errors"]["data"]
    assert problem["line"] == 2 and problem["code"] == "duplicate_key", problem
    assert problem["message"].startswith("Line 2: body.model: the key 'model' is given more than once"), problem
    assert sim_requests(sim_control) == 0
