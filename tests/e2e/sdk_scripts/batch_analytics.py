"""A batch's analytics (an extension) read with the official SDKs, as a user reads them: the `analytics` field
the SDKs keep as an extra of their Batch and MessageBatch models (`batch.analytics`, `batch.model_extra`). A
file batch with a request the backend rejects and one that fails once ([[sim:flaky:1:500]]; the stack runs with
MAX_ATTEMPTS=1), then retried in place: its analytics keep adding up. A Message Batch with a rejected request.

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
except ImportError:  # the openai-only interpreter
    anthropic = None

TAG = uuid.uuid4().hex  # the simulator remembers flaky bodies: each run's are its own
client = OpenAI(base_url=BASE, api_key=KEY)
out = {"openai": openai.__version__}


def analytics(batch):
    """The extension as both ways of reading an extra give it (they must agree)."""
    extra = (batch.model_extra or {}).get("analytics")
    assert getattr(batch, "analytics", None) == extra, (getattr(batch, "analytics", None), extra)
    return extra


lines = [chat("ok", f"Hello {TAG}"), chat("flaky", f"[[sim:flaky:1:500]] {TAG}"), chat("bad", f"[[sim:400]] {TAG}")]
upload = client.files.create(file=("batch.jsonl", io.BytesIO("".join(json.dumps(x) + "\n" for x in lines).encode())),
                             purpose="batch")
created = client.batches.create(input_file_id=upload.id, endpoint="/v1/chat/completions", completion_window="24h")
first = wait(client, created.id)
client.post(f"/batches/{created.id}/retry", cast_to=Batch, body={"error_codes": ["upstream_error"]})
again = wait(client, created.id)
out["file"] = {"created": analytics(created), "first": analytics(first), "again": analytics(again),
               "in_progress_at": first.in_progress_at, "completed_at": again.completed_at}

if anthropic is not None:
    out["anthropic"] = anthropic.__version__
    messages = anthropic.Anthropic(base_url=BASE.removesuffix("/v1") + "/anthropic", api_key=KEY)

    def request(custom_id, content):
        return {"custom_id": custom_id,
                "params": {"model": MODEL, "max_tokens": 64, "messages": [{"role": "user", "content": content}]}}

    batch = messages.messages.batches.create(requests=[request("ok", f"Hello {TAG}"),
                                                       request("bad", f"[[sim:400]] msg {TAG}")])
    deadline = time.monotonic() + 60
    while (batch := messages.messages.batches.retrieve(batch.id)).processing_status != "ended":
        assert time.monotonic() < deadline, f"{batch.id} did not end"
        time.sleep(0.2)
    out["message_batch"] = {"ended": analytics(batch), "ended_at": batch.ended_at.isoformat()}

print(json.dumps(out))
