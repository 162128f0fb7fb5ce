"""Pause and resume (an extension of the service) through the official SDKs' own `client.post(...)`, as a user
calls a route the SDK has no method for: an inline batch with the `openai` SDK, a Message Batch with the
`anthropic` SDK (FREEINFERENCE_SDK says which). Pause, watch nothing start, pause again, resume, wait for the
end; then a pause of the ended batch (409) and of an unknown one (404), as the SDK raises them.

Needs FREEINFERENCE_BASE_URL (the service's /v1 URL) and FREEINFERENCE_API_KEY. Prints one JSON object.
"""

import json
import os
import time

SDK = os.environ["FREEINFERENCE_SDK"]
BASE = os.environ["FREEINFERENCE_BASE_URL"]
KEY = os.environ["FREEINFERENCE_API_KEY"]
N = 120
ENDED = {"completed", "failed", "expired", "cancelled", "ended"}

if SDK == "openai":
    import openai as sdk
    from openai import OpenAI
    from openai.types import Batch

    client = OpenAI(base_url=BASE, api_key=KEY, max_retries=0)
    prefix = "/batches"
    kind = Batch
    requests = [{"custom_id": f"p-{i}", "body": {"model": "glm-5.3-flash",
                                                 "messages": [{"role": "user", "content": f"pause {i}"}]}}
                for i in range(N)]
    created = client.post("/batches", body={"requests": requests}, cast_to=Batch)

    def state(batch):
        return batch.status, batch.request_counts.completed
else:
    import anthropic as sdk
    from anthropic.types.messages import MessageBatch

    client = sdk.Anthropic(base_url=BASE.removesuffix("/v1") + "/anthropic", api_key=KEY, max_retries=0)
    prefix = "/v1/messages/batches"
    kind = MessageBatch
    created = client.messages.batches.create(requests=[
        {"custom_id": f"p-{i}", "params": {"model": "glm-5.3-flash", "max_tokens": 16,
                                           "messages": [{"role": "user", "content": f"pause {i}"}]}}
        for i in range(N)])

    def state(batch):
        return batch.processing_status, batch.request_counts.succeeded


def call(batch_id, what):
    return client.post(f"{prefix}/{batch_id}/{what}", cast_to=kind)


def retrieve(batch_id):
    return client.batches.retrieve(batch_id) if SDK == "openai" else client.messages.batches.retrieve(batch_id)


if SDK == "openai":  # paused mid-way: once some requests are done (a Message Batch counts none until it ends)
    deadline = time.monotonic() + 20
    while state(retrieve(created.id))[1] == 0 and time.monotonic() < deadline:
        time.sleep(0.05)
paused = call(created.id, "pause")
time.sleep(1.5)  # what was running when it paused finishes
seen = retrieve(created.id)
time.sleep(1.5)
still = retrieve(created.id)
again = call(created.id, "pause")
resumed = call(created.id, "resume")
deadline = time.monotonic() + 60
final = retrieve(created.id)
while state(final)[0] not in ENDED and time.monotonic() < deadline:
    time.sleep(0.2)
    final = retrieve(created.id)
refusals = {}
for name, batch_id in (("ended", created.id), ("unknown", created.id[:-4] + "0000")):
    try:
        call(batch_id, "pause")
        refusals[name] = None
    except sdk.APIStatusError as refused:
        refusals[name] = [refused.status_code, type(refused).__name__]
print(json.dumps({
    "version": sdk.__version__,
    "paused": [state(paused)[0], getattr(paused, "paused_at", None)],
    # (status, completed) 1.5 s and 3 s after the pause (a Message Batch counts nothing until it has ended)
    "while_paused": [state(seen), state(still), getattr(still, "paused_at", None)],
    "again": getattr(again, "paused_at", None),
    "resumed": [state(resumed)[0], getattr(resumed, "paused_at", None)],
    "final": [state(final)[0], state(final)[1], getattr(final, "paused_at", None)],
    "refusals": refusals,
}))
