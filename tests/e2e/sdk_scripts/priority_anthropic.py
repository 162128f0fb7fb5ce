"""A Message Batch's priority (an extension beyond the Anthropic API) with the official `anthropic` SDK, as a user
sends it: `extra_body={"priority": ...}` on `client.messages.batches.create`, and `client.post(...)` for the route
the SDK does not know, `POST /v1/messages/batches/{batch_id}/priority`. Runs with either SDK major.

Needs FREEINFERENCE_ANTHROPIC_BASE_URL (e.g. http://127.0.0.1:8000/anthropic) and FREEINFERENCE_API_KEY, and a
backend slow enough that a 40-request batch is still running when its priority is changed. Prints one JSON
object.
"""

import json
import os
import time

import anthropic
from anthropic.types.messages import MessageBatch

client = anthropic.Anthropic(base_url=os.environ["FREEINFERENCE_ANTHROPIC_BASE_URL"],
                             api_key=os.environ["FREEINFERENCE_API_KEY"])


def raised(call):
    try:
        call()
    except anthropic.APIStatusError as exc:
        return [type(exc).__name__, exc.status_code, exc.message]
    return None


requests = [{"custom_id": f"p-{i}", "params": {"model": "glm-5.3-flash", "max_tokens": 32,
                                                "messages": [{"role": "user", "content": f"Priority {i}."}]}}
            for i in range(40)]
out = {"anthropic": anthropic.__version__}
out["refused"] = raised(lambda: client.messages.batches.create(requests=requests, extra_body={"priority": 3}))
batch = client.messages.batches.create(requests=requests, extra_body={"priority": "high"})
out["created"] = getattr(batch, "priority", None)
out["retrieved"] = getattr(client.messages.batches.retrieve(batch.id), "priority", None)
changed = client.post(f"/v1/messages/batches/{batch.id}/priority", body={"priority": "low"}, cast_to=MessageBatch)
out["changed"] = [type(changed).__name__, changed.id == batch.id, getattr(changed, "priority", None),
                  changed.processing_status]
client.messages.batches.cancel(batch.id)
deadline = time.monotonic() + 60
while client.messages.batches.retrieve(batch.id).processing_status != "ended":
    assert time.monotonic() < deadline, "the batch did not end"
    time.sleep(0.2)
out["after_end"] = raised(lambda: client.with_options(max_retries=0).post(
    f"/v1/messages/batches/{batch.id}/priority", body={"priority": "high"}, cast_to=MessageBatch))
print(json.dumps(out))
