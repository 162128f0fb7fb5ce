"""The batch object's `model` as the official OpenAI SDK reads it: a file batch's one model once its lines are
validated, and null for an inline batch that mixes models (created over plain HTTP: the SDK creates only file
batches). openai 1.x does not model the field; it keeps it as an extra field, read here the same way.

Needs FREEINFERENCE_BASE_URL and FREEINFERENCE_API_KEY. Prints one JSON object.
"""

import json
import os
import time

import httpx
import openai
from openai import OpenAI

base, key = os.environ["FREEINFERENCE_BASE_URL"], os.environ["FREEINFERENCE_API_KEY"]
client = OpenAI(base_url=base, api_key=key)

line = {"custom_id": "m-0", "method": "POST", "url": "/v1/chat/completions",
        "body": {"model": "glm-flash", "messages": [{"role": "user", "content": "Which model?"}]}}
upload = client.files.create(file=("model.jsonl", json.dumps(line).encode() + b"\n"), purpose="batch")
batch = client.batches.create(input_file_id=upload.id, endpoint="/v1/chat/completions", completion_window="24h")
created_model = batch.model if "model" in type(batch).model_fields else getattr(batch, "model", "absent")
deadline = time.monotonic() + 60
while batch.status not in ("completed", "failed", "expired", "cancelled") and time.monotonic() < deadline:
    time.sleep(0.2)
    batch = client.batches.retrieve(batch.id)

mixed = httpx.post(f"{base}/batches", headers={"Authorization": f"Bearer {key}"}, timeout=30, json={"requests": [
    {"custom_id": "a", "body": {"model": "glm-5.3-flash", "messages": [{"role": "user", "content": "a"}]}},
    {"custom_id": "b", "body": {"model": "qwen3.6-35b", "messages": [{"role": "user", "content": "b"}]}}]}).json()
mixed_batch = client.batches.retrieve(mixed["id"])
print(json.dumps({
    "openai": openai.__version__,
    "modelled": "model" in type(batch).model_fields,
    "created": created_model,
    "file": [batch.status, getattr(batch, "model", "absent")],
    "mixed": getattr(mixed_batch, "model", "absent"),
}))
