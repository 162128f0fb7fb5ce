"""Retry in place (an extension) with the official SDKs, as a user calls it: the openai client's `post` on
`/batches/{id}/retry` (an inline batch and a file batch), the anthropic client's `post` on
`/v1/messages/batches/{id}/retry`. Each batch holds a request that fails once ([[sim:flaky:1:500]]; the stack
runs with MAX_ATTEMPTS=1) and then answers: the retry runs it again and keeps the successes.

Runs with any SDK major (the anthropic part where the interpreter has anthropic). Needs FREEINFERENCE_BASE_URL
(e.g. http://127.0.0.1:8000/v1) and FREEINFERENCE_API_KEY. Prints one JSON object.
"""

import io
import json
import time
import uuid

import openai
from openai import OpenAI
from openai.types import Batch
from sdk_common import BASE, KEY, MODEL, chat, wait

try:
    import anthropic
    from anthropic.types.messages import MessageBatch
except ImportError:  # the openai-only interpreter
    anthropic = None

TAG = uuid.uuid4().hex  # the simulator remembers flaky bodies: each run's are its own
client = OpenAI(base_url=BASE, api_key=KEY)
out = {"openai": openai.__version__}


def raised(call):
    try:
        call()
    except openai.APIStatusError as exc:
        return [exc.status_code, (exc.body or {}).get("code") if isinstance(exc.body, dict) else None]
    return None


def counts(batch):
    return [batch.request_counts.total, batch.request_counts.completed, batch.request_counts.failed]


# An inline batch: the service's own create, posted as the SDK posts any body.
inline = client.post("/batches", cast_to=Batch, body={"requests": [
    chat("ok", f"Say hello {TAG}"), chat("flaky", f"[[sim:flaky:1:500]] {TAG}")]})
first = wait(client, inline.id)
retried = client.post(f"/batches/{inline.id}/retry", cast_to=Batch, body={"error_codes": ["upstream_error"]},
                      options={"headers": {"Idempotency-Key": f"retry-{TAG}"}})
again = wait(client, inline.id)
replayed = client.post(f"/batches/{inline.id}/retry", cast_to=Batch, body={"error_codes": ["upstream_error"]},
                       options={"headers": {"Idempotency-Key": f"retry-{TAG}"}})
results = client.get(f"/batches/{inline.id}/results", cast_to=object)
out["inline"] = {
    "first": [first.status, *counts(first)],
    "retried": [retried.status, retried.completed_at, (retried.model_extra or {}).get("retry_count"),
                *counts(retried)],
    "again": [again.status, (again.model_extra or {}).get("retry_count"), *counts(again)],
    "replayed": [replayed.status, (replayed.model_extra or {}).get("retry_count")],
    "statuses": [r["status"] for r in results["data"]],
    "nothing_left": raised(lambda: client.post(f"/batches/{inline.id}/retry", cast_to=Batch, body={})),
    "unknown": raised(lambda: client.post("/batches/batch_" + "0" * 32 + "/retry", cast_to=Batch)),
}

# A file batch, created as the SDK creates one; retried with no body.
lines = [chat("a", f"First {TAG}"), chat("flaky", f"[[sim:flaky:1:500]] file {TAG}")]
upload = client.files.create(file=("batch.jsonl", io.BytesIO("".join(json.dumps(x) + "\n" for x in lines).encode())),
                             purpose="batch")
created = client.batches.create(input_file_id=upload.id, endpoint="/v1/chat/completions", completion_window="24h")
first = wait(client, created.id)
retried = client.post(f"/batches/{created.id}/retry", cast_to=Batch)
again = wait(client, created.id)
output = client.files.content(again.output_file_id).text if again.output_file_id else ""
out["file"] = {
    "first": [first.status, *counts(first), bool(first.output_file_id), bool(first.error_file_id)],
    "retried": [retried.status, retried.output_file_id, retried.error_file_id],
    "old_files": [raised(lambda f=f: client.files.retrieve(f)) for f in (first.output_file_id, first.error_file_id)],
    "again": [again.status, *counts(again), again.error_file_id,
              again.output_file_id not in (first.output_file_id, first.error_file_id)],
    "output": sorted(json.loads(x)["custom_id"] for x in output.splitlines()),
}

if anthropic is not None:
    out["anthropic"] = anthropic.__version__
    messages = anthropic.Anthropic(base_url=BASE.removesuffix("/v1") + "/anthropic", api_key=KEY)

    def request(custom_id, content):
        return {"custom_id": custom_id,
                "params": {"model": MODEL, "max_tokens": 64, "messages": [{"role": "user", "content": content}]}}

    def ended(batch_id, timeout=60):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            batch = messages.messages.batches.retrieve(batch_id)
            if batch.processing_status == "ended":
                return batch
            time.sleep(0.2)
        raise AssertionError(f"{batch_id} did not end")

    def kinds(batch):
        c = batch.request_counts
        return [c.processing, c.succeeded, c.errored, c.canceled, c.expired]

    batch = messages.messages.batches.create(requests=[request("ok", f"Hello {TAG}"),
                                                       request("flaky", f"[[sim:flaky:1:500]] msg {TAG}")])
    first = ended(batch.id)
    retried = messages.post(f"/v1/messages/batches/{batch.id}/retry", cast_to=MessageBatch,
                            body={"statuses": ["errored"]})
    again = ended(batch.id)

    def refused(call):
        try:
            call()
        except anthropic.APIStatusError as exc:
            return [exc.status_code, type(exc).__name__]
        return None

    out["message_batch"] = {
        "first": kinds(first),
        "retried": [retried.processing_status, retried.results_url, retried.ended_at,
                    (retried.model_extra or {}).get("retry_count")],
        "again": [again.processing_status, *kinds(again), again.results_url is not None],
        "results": [(r.custom_id, r.result.type) for r in messages.messages.batches.results(batch.id)],
        "nothing_left": refused(lambda: messages.post(f"/v1/messages/batches/{batch.id}/retry",
                                                      cast_to=MessageBatch, body={})),
    }

print(json.dumps(out))
