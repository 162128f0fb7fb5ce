"""Message Batches on models' provider batch tiers with the official `anthropic` SDK, as a user sends them: the
SDK's create, retrieve and results unchanged but for `extra_body={"execution": "provider_batch"}` (an
extension), one batch per model, all running at once. Runs with either SDK major. Needs
FREEINFERENCE_ANTHROPIC_BASE_URL (e.g. http://127.0.0.1:8000/anthropic), FREEINFERENCE_API_KEY and TIER_MODELS
(models with a tier, comma-separated); TIER_TAG, if set, goes into the prompts. Prints one JSON object."""

import json
import os
import time

import anthropic

client = anthropic.Anthropic(base_url=os.environ["FREEINFERENCE_ANTHROPIC_BASE_URL"],
                             api_key=os.environ["FREEINFERENCE_API_KEY"])
MODELS, TAG = os.environ["TIER_MODELS"].split(","), os.environ.get("TIER_TAG", "")


def requests(model):
    return [{"custom_id": f"m-{i}",
             "params": {"model": model, "max_tokens": 64,
                        "messages": [{"role": "user", "content": f"Message tier {i} ({TAG} {model})."}]}}
            for i in range(3)]


def seen(batch):
    """What the ended batch shows, and its results."""
    counts = batch.request_counts
    usage = getattr(batch, "usage", None)  # an extension the SDK keeps as an extra field
    usage = usage if isinstance(usage, dict) or usage is None else usage.model_dump()
    results = []
    for entry in client.messages.batches.results(batch.id):
        row = [entry.custom_id, entry.result.type]
        if entry.result.type == "succeeded":
            message = entry.result.message
            row += ["".join(block.text for block in message.content if block.type == "text"), message.stop_reason,
                    message.usage.input_tokens, message.usage.output_tokens]
        results.append(row)
    return {"status": batch.processing_status, "execution": getattr(batch, "execution", None),
            "counts": [counts.processing, counts.succeeded, counts.errored, counts.canceled, counts.expired],
            "usage": [usage["input_tokens"], usage["output_tokens"]] if usage else None,
            "cost_usd": getattr(batch, "cost_usd", None), "saved_usd": getattr(batch, "saved_usd", None),
            "results": sorted(results)}


out = {"anthropic": anthropic.__version__}
try:
    client.messages.batches.create(requests=requests(MODELS[0]), extra_body={"execution": "cheap"})
except anthropic.APIStatusError as exc:
    out["refused"] = [type(exc).__name__, exc.status_code, exc.message]
batches = {model: client.messages.batches.create(requests=requests(model), extra_body={"execution": "provider_batch"})
           for model in MODELS}
out["created_execution"] = {model: getattr(batch, "execution", None) for model, batch in batches.items()}
deadline = time.monotonic() + 120
while any(b.processing_status != "ended" for b in batches.values()) and time.monotonic() < deadline:
    time.sleep(0.5)
    batches = {model: client.messages.batches.retrieve(batch.id) for model, batch in batches.items()}
out["batches"] = {model: seen(batch) for model, batch in batches.items()}
print(json.dumps(out))
