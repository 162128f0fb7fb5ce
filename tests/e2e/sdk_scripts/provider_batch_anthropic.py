"""A Message Batch on a model's provider batch tier with the official `anthropic` SDK, as a user sends it: the
SDK's create, retrieve and results unchanged but for `extra_body={"execution": "provider_batch"}` (an
extension). Runs with either SDK major. Needs FREEINFERENCE_ANTHROPIC_BASE_URL (e.g.
http://127.0.0.1:8000/anthropic), FREEINFERENCE_API_KEY and TIER_MODEL (a model with a tier); TIER_TAG, if
set, goes into its prompts. Prints one JSON object."""

import json
import os
import time

import anthropic

client = anthropic.Anthropic(base_url=os.environ["FREEINFERENCE_ANTHROPIC_BASE_URL"],
                             api_key=os.environ["FREEINFERENCE_API_KEY"])
MODEL, TAG = os.environ["TIER_MODEL"], os.environ.get("TIER_TAG", "")
requests = [{"custom_id": f"m-{i}",
             "params": {"model": MODEL, "max_tokens": 64,
                        "messages": [{"role": "user", "content": f"Message tier {i} ({TAG})."}]}} for i in range(3)]
out = {"anthropic": anthropic.__version__}
try:
    client.messages.batches.create(requests=requests, extra_body={"execution": "cheap"})
except anthropic.APIStatusError as exc:
    out["refused"] = [type(exc).__name__, exc.status_code, exc.message]
batch = client.messages.batches.create(requests=requests, extra_body={"execution": "provider_batch"})
out["created_execution"] = getattr(batch, "execution", None)
deadline = time.monotonic() + 120
while batch.processing_status != "ended" and time.monotonic() < deadline:
    time.sleep(0.5)
    batch = client.messages.batches.retrieve(batch.id)
counts = batch.request_counts
out["status"] = batch.processing_status
out["counts"] = [counts.processing, counts.succeeded, counts.errored, counts.canceled, counts.expired]
usage = getattr(batch, "usage", None)  # an extension the SDK keeps as an extra field
usage = usage if isinstance(usage, dict) or usage is None else usage.model_dump()
out["usage"] = [usage["input_tokens"], usage["output_tokens"]] if usage else None
out["cost_usd"], out["saved_usd"] = getattr(batch, "cost_usd", None), getattr(batch, "saved_usd", None)
results = []
for entry in client.messages.batches.results(batch.id):
    row = [entry.custom_id, entry.result.type]
    if entry.result.type == "succeeded":
        message = entry.result.message
        row += ["".join(block.text for block in message.content if block.type == "text"), message.stop_reason,
                message.usage.input_tokens, message.usage.output_tokens]
    results.append(row)
out["results"] = sorted(results)
print(json.dumps(out))
