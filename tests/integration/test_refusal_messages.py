"""What a refusal says of what the client sent: a 404 quotes at most a bounded prefix of a made-up id or model
name, and NaN or Infinity in a body (Python's json reads them, JSON has neither) is a 400 naming the parameter,
on every route that takes a request for a backend. Through the real API handler (Mangum, API Gateway events)."""

from __future__ import annotations

from batchinfer.errors import QUOTED_CHARS
from tests.helpers import anthropic_error, error, finish, new_key, ok, settings, sim_requests
from tests.integration.test_files import create_from, jsonl, upload
from tests.integration.test_message_batches import V1, Messages

AS_JSON = {"content-type": "application/json"}
ANTHROPIC = {**AS_JSON, "anthropic-version": V1}
LONG = 20_000  # characters of a made-up id or name
MESSAGES = '[{"role":"user","content":"hi"}]'


def bounded(message: str, made_up: str) -> None:
    """The message quotes the start of what was sent, cut with '...', and not the rest."""
    assert made_up[:QUOTED_CHARS] + "..." in message, message
    assert made_up[:QUOTED_CHARS + 1] not in message and len(message) < 300, message


def test_a_404_quotes_only_the_start_of_a_made_up_id(api, svc):
    settings(svc, file_batches_enabled=True, message_batches_enabled=True)
    _, key = new_key(svc)
    batch_id = "batch_" + "0" * LONG
    for method, path in (("GET", ""), ("GET", "/results"), ("POST", "/cancel"), ("DELETE", "")):
        bounded(error(api(method, f"/v1/batches/{batch_id}{path}", key), 404, code="batch_not_found")["message"],
                batch_id)
    file_id = "file-" + "f" * LONG
    bounded(error(api("GET", f"/v1/files/{file_id}", key), 404, code="file_not_found")["message"], file_id)
    upload_id = "upload_" + "u" * LONG
    bounded(error(api("POST", f"/v1/uploads/{upload_id}/cancel", key), 404, code="upload_not_found")["message"],
            upload_id)
    message_batch_id = "msgbatch_" + "m" * LONG
    refused = anthropic_error(Messages(api, key, version=V1)("GET", f"/{message_batch_id}"), 404, "not_found_error")
    bounded(refused["message"], message_batch_id)
    # An id of the usual length is still quoted whole.
    error(api("GET", "/v1/batches/batch_nonexistent", key), 404, message="No batch found with id 'batch_nonexistent'.")


def test_a_made_up_model_name_is_quoted_only_in_part(api, svc, sim_control):
    _, key = new_key(svc)
    name = "m" * LONG
    chat = {"model": name, "messages": [{"role": "user", "content": "hi"}]}
    bounded(error(api("POST", "/v1/chat/completions", key, json_body=chat), 404, code="model_not_found")["message"],
            name)
    bounded(error(api("GET", f"/v1/models/{name}", key), 404, code="model_not_found")["message"], name)
    refused = anthropic_error(api("POST", "/v1/messages", key, headers={"anthropic-version": V1},
                                  json_body={**chat, "max_tokens": 8}), 404, "not_found_error")
    bounded(refused["message"], name)
    bounded(error(api.create(key, [{"custom_id": "a", "body": chat}]), 400)["message"], name)
    assert sim_requests(sim_control) == 0


def test_nan_or_infinity_in_an_interactive_call_is_a_400_naming_the_parameter(api, svc, sim_control):
    _, key = new_key(svc)
    base = '"model":"glm-5.3-flash","messages":' + MESSAGES
    for body, param in ((f'{{{base},"temperature":NaN}}', "temperature"),
                        (f'{{{base},"logit_bias":{{"50256":-Infinity}}}}', "logit_bias.50256"),
                        (f'{{{base},"extra":[1,2,Infinity]}}', "extra[2]")):
        err = error(api("POST", "/v1/chat/completions", key, body=body, headers=AS_JSON), 400, param=param)
        assert err["message"].startswith(f"{param}: ") and "not valid JSON" in err["message"], err
    embeddings = '{"model":"glm-5.3-flash","input":"a","dimensions":NaN}'
    error(api("POST", "/v1/embeddings", key, body=embeddings, headers=AS_JSON), 400, "dimensions: ", param="dimensions")
    message = '{"model":"glm-5.3-flash","max_tokens":8,"temperature":Infinity,"messages":' + MESSAGES + "}"
    anthropic_error(api("POST", "/v1/messages", key, body=message, headers=ANTHROPIC), 400, "invalid_request_error",
                    "temperature: ", "not valid JSON")
    assert sim_requests(sim_control) == 0


def test_nan_in_a_batch_request_is_refused_naming_the_request_and_parameter(api, svc, sim_control):
    settings(svc, file_batches_enabled=True, message_batches_enabled=True)
    _, key = new_key(svc)
    body = ('{"requests":[{"custom_id":"a","body":{"model":"glm-5.3-flash","messages":' + MESSAGES
            + ',"top_p":NaN}}]}')
    err = error(api("POST", "/v1/batches", key, body=body, headers=AS_JSON), 400, param="requests[0]")
    assert err["message"].startswith("requests[0] (custom_id 'a'): body.top_p: "), err
    # A Message Batch request: errored on its own, naming the parameter; the other one runs.
    entries = ('{"requests":[{"custom_id":"nan","params":{"model":"glm-5.3-flash","max_tokens":8,"top_k":NaN,'
               '"messages":' + MESSAGES + '}},{"custom_id":"fine","params":{"model":"glm-5.3-flash","max_tokens":8,'
               '"messages":' + MESSAGES + "}}]}")
    messages = Messages(api, key, version=V1)
    created = ok(messages("POST", body=entries, headers={"content-type": "application/json"}))
    finish(svc, created["id"])
    results = {line["custom_id"]: line["result"] for line in messages.results(created["id"])}
    assert results["nan"]["type"] == "errored" and results["fine"]["type"] == "succeeded", results
    assert results["nan"]["error"]["error"]["message"].startswith("top_k: "), results["nan"]
    # A file's line: the batch fails naming the line and the parameter, and nothing runs.
    line = ('{"custom_id":"f","method":"POST","url":"/v1/chat/completions","body":{"model":"glm-5.3-flash",'
            '"messages":' + MESSAGES + ',"temperature":-Infinity}}')
    created = ok(create_from(api, key, ok(upload(api, key, jsonl(line)))["id"]))
    finish(svc, created["id"])
    [problem] = ok(api("GET", f"/v1/batches/{created['id']}", key))["errors"]["data"]
    assert problem["line"] == 1 and problem["message"].startswith("body.temperature: "), problem
    assert sim_requests(sim_control) == 1  # only the Message Batch's valid request ran
