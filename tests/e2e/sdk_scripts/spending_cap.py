"""A batch's spending cap (`max_cost_usd`, an extension) through the official SDKs, as a user passes it:
`extra_body={"max_cost_usd": ...}` on an OpenAI file batch and on an Anthropic Message Batch, a refused cap,
and what each SDK's batch object then shows (the extension fields, read from the object's extra fields).

Runs with any SDK major. Needs FREEINFERENCE_BASE_URL (e.g. http://127.0.0.1:8000/v1), FREEINFERENCE_API_KEY
and CAP_USD (the cap of both batches); FREEINFERENCE_ANTHROPIC_BASE_URL too where anthropic is installed.
Prints one JSON object.
"""

import io
import json
import os
import time

import openai

MODEL = "glm-5.3-flash"
N = 30
cap = float(os.environ["CAP_USD"])
key = os.environ["FREEINFERENCE_API_KEY"]
seen = {"openai": openai.__version__}


def extra(obj, name):
    """An extension field of an SDK object (kept in the model's extra fields by both SDKs' majors)."""
    value = getattr(obj, name, None)
    return value.model_dump() if hasattr(value, "model_dump") else value


client = openai.OpenAI(base_url=os.environ["FREEINFERENCE_BASE_URL"], api_key=key)
lines = "".join(json.dumps({"custom_id": f"q-{i:02d}", "method": "POST", "url": "/v1/chat/completions",
                            "body": {"model": MODEL, "max_tokens": 5,
                                     "messages": [{"role": "user", "content": f"Question {i:02d}?"}]}}) + "\n"
                for i in range(N))
upload = client.files.create(file=("cap.jsonl", io.BytesIO(lines.encode())), purpose="batch")
try:
    client.batches.create(input_file_id=upload.id, endpoint="/v1/chat/completions", completion_window="24h",
                          extra_body={"max_cost_usd": -1})
    seen["refused"] = None
except openai.BadRequestError as exc:
    seen["refused"] = [exc.status_code, (exc.body or {}).get("param") if isinstance(exc.body, dict) else None]
batch = client.batches.create(input_file_id=upload.id, endpoint="/v1/chat/completions", completion_window="24h",
                              extra_body={"max_cost_usd": cap})
seen["created_cap"] = extra(batch, "max_cost_usd")
deadline = time.monotonic() + 90
while batch.status not in ("completed", "failed", "expired", "cancelled") and time.monotonic() < deadline:
    time.sleep(0.3)
    batch = client.batches.retrieve(batch.id)
seen["batch"] = {"status": batch.status, "cap": extra(batch, "max_cost_usd"), "cost_usd": extra(batch, "cost_usd"),
                 "error": extra(batch, "error"), "completed": batch.request_counts.completed,
                 "failed": batch.request_counts.failed, "total": batch.request_counts.total}
errors = client.files.content(batch.error_file_id).text if batch.error_file_id else ""
seen["error_lines"] = sorted({json.loads(line)["error"]["code"] if json.loads(line).get("error") else "none"
                              for line in errors.splitlines() if line.strip()})

if os.environ.get("FREEINFERENCE_ANTHROPIC_BASE_URL"):
    import anthropic

    seen["anthropic"] = anthropic.__version__
    messages = anthropic.Anthropic(base_url=os.environ["FREEINFERENCE_ANTHROPIC_BASE_URL"], api_key=key)
    requests = [{"custom_id": f"m-{i:02d}", "params": {"model": MODEL, "max_tokens": 5, "messages": [
        {"role": "user", "content": f"Question {i:02d}?"}]}} for i in range(N)]
    try:
        messages.messages.batches.create(requests=requests, extra_body={"max_cost_usd": "lots"})
        seen["message_refused"] = None
    except anthropic.BadRequestError as exc:
        seen["message_refused"] = [exc.status_code, "max_cost_usd" in str(exc)]
    mb = messages.messages.batches.create(requests=requests, extra_body={"max_cost_usd": cap})
    deadline = time.monotonic() + 90
    while mb.processing_status != "ended" and time.monotonic() < deadline:
        time.sleep(0.3)
        mb = messages.messages.batches.retrieve(mb.id)
    seen["message_batch"] = {"status": mb.processing_status, "counts": mb.request_counts.model_dump(),
                             "cap": extra(mb, "max_cost_usd"), "cost_usd": extra(mb, "cost_usd"),
                             "error": extra(mb, "error")}
    seen["message_results"] = sorted({r.result.type for r in messages.messages.batches.results(mb.id)})
print(json.dumps(seen))
