"""A batch's priority (an extension beyond the OpenAI API) with the official `openai` SDK, as a user sends it:
`extra_body={"priority": ...}` on `client.batches.create`, and `client.post(...)` for the route the SDK does not
know, `POST /v1/batches/{batch_id}/priority`. Runs with every SDK major the tests pin.

Needs FREEINFERENCE_BASE_URL (e.g. http://127.0.0.1:8000/v1) and FREEINFERENCE_API_KEY, and a backend slow
enough that a 40-request batch is still running when its priority is changed. Prints one JSON object.
"""

import json
import os
import time

import openai
from openai import OpenAI
from openai.types import Batch

client = OpenAI(base_url=os.environ["FREEINFERENCE_BASE_URL"], api_key=os.environ["FREEINFERENCE_API_KEY"])


def raised(call):
    try:
        call()
    except openai.APIStatusError as exc:
        return [type(exc).__name__, exc.status_code, exc.message]
    return None


def priority_of(batch):
    return getattr(batch, "priority", None)


lines = [{"custom_id": f"p-{i}", "method": "POST", "url": "/v1/chat/completions",
          "body": {"model": "glm-5.3-flash", "messages": [{"role": "user", "content": f"Priority {i}."}]}}
         for i in range(40)]
upload = client.files.create(file=("priority.jsonl", "".join(json.dumps(line) + "\n" for line in lines).encode()),
                             purpose="batch")
out = {"openai": openai.__version__}
out["refused"] = raised(lambda: client.batches.create(
    input_file_id=upload.id, endpoint="/v1/chat/completions", completion_window="24h",
    extra_body={"priority": "urgent"}))
batch = client.batches.create(input_file_id=upload.id, endpoint="/v1/chat/completions", completion_window="24h",
                              extra_body={"priority": "high"})
out["created"] = priority_of(batch)
out["retrieved"] = priority_of(client.batches.retrieve(batch.id))
changed = client.post(f"/batches/{batch.id}/priority", body={"priority": "low"}, cast_to=Batch)
out["changed"] = [type(changed).__name__, changed.id == batch.id, priority_of(changed), changed.status]
out["change_refused"] = raised(lambda: client.post(f"/batches/{batch.id}/priority", body={"priority": "soon"},
                                                   cast_to=Batch))
client.batches.cancel(batch.id)
deadline = time.monotonic() + 60
while client.batches.retrieve(batch.id).status not in ("completed", "failed", "expired", "cancelled"):
    assert time.monotonic() < deadline, "the batch did not end"
    time.sleep(0.2)
out["after_end"] = raised(lambda: client.with_options(max_retries=0).post(
    f"/batches/{batch.id}/priority", body={"priority": "high"}, cast_to=Batch))
out["ended_priority"] = priority_of(client.batches.retrieve(batch.id))
print(json.dumps(out))
