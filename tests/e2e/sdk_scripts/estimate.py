"""Estimates before running (an extension) through the official SDKs, as a user calls a route the SDK has no
method for: `client.post("/batches/estimate", ...)` (openai) and `client.post("/v1/messages/batches/estimate",
...)` (anthropic); a refusal of each in its SDK's error class; and `admission: reject_if_late` on create
(`extra_body`), refused once, not retried by the SDK, and admitted for a batch that fits.

Runs with any SDK major. Needs FREEINFERENCE_BASE_URL, FREEINFERENCE_API_KEY, SLOW_MODEL and LATE_REQUESTS (a
file batch of that many requests on that model cannot end within 24 h); FREEINFERENCE_ANTHROPIC_BASE_URL too
where anthropic is installed. Prints one JSON object.
"""

import json
import os

import httpx
import openai
from sdk_common import MODEL, chat

key = os.environ["FREEINFERENCE_API_KEY"]
seen = {"openai": openai.__version__}
sent = []  # every HTTP request the openai client sent: a refusal it retried would show twice


client = openai.OpenAI(base_url=os.environ["FREEINFERENCE_BASE_URL"], api_key=key,
                       http_client=httpx.Client(event_hooks={"request": [lambda r: sent.append(r.url.path)]}))
answer = client.post("/batches/estimate", cast_to=object,
                     body={"requests": [chat("a", "tiktoken is great!", max_tokens=10),
                                        chat("b", "hello world", max_tokens=20)]})
seen["estimate"] = [answer["object"], answer["request_count"], answer["input_tokens"], answer["max_output_tokens"],
                    answer["tokenizer"], answer["fits_window"], [m["model"] for m in answer["models"]]]
try:
    client.post("/batches/estimate", cast_to=object, body={"requests": [chat("a", "hi", model="nope")]})
    seen["estimate_refused"] = None
except openai.BadRequestError as exc:
    seen["estimate_refused"] = [exc.status_code, exc.body.get("param") if isinstance(exc.body, dict) else None]

def upload(name, lines):
    data = "".join(json.dumps(line) + "\n" for line in lines).encode()
    return client.files.create(file=(name, data), purpose="batch").id


# On a model whose calls were measured slow: this many requests cannot end within a file batch's 24 hours.
late = upload("late.jsonl", [chat(f"q{i}", "hi", model=os.environ["SLOW_MODEL"], max_tokens=5)
                             for i in range(int(os.environ["LATE_REQUESTS"]))])
sent.clear()
try:
    client.batches.create(input_file_id=late, endpoint="/v1/chat/completions", completion_window="24h",
                          extra_body={"admission": "reject_if_late"})
    seen["late"] = None
except openai.RateLimitError as exc:
    body = exc.body if isinstance(exc.body, dict) else {}
    seen["late"] = [exc.status_code, body.get("code"), exc.response.headers.get("x-should-retry"),
                    int(exc.response.headers["retry-after"]) >= 1, len(sent)]
soon = upload("soon.jsonl", [chat("a", "hi", max_tokens=5), chat("b", "hi", max_tokens=5)])
batch = client.batches.create(input_file_id=soon, endpoint="/v1/chat/completions", completion_window="24h",
                              extra_body={"admission": "reject_if_late"})
seen["admitted"] = [batch.object, batch.status in ("validating", "in_progress", "completed")]

if os.environ.get("FREEINFERENCE_ANTHROPIC_BASE_URL"):
    import anthropic

    seen["anthropic"] = anthropic.__version__
    messages = anthropic.Anthropic(base_url=os.environ["FREEINFERENCE_ANTHROPIC_BASE_URL"], api_key=key)
    requests = [{"custom_id": "good", "params": {"model": MODEL, "max_tokens": 10, "messages": [
        {"role": "user", "content": "hello world"}]}}, {"custom_id": "bad", "params": {"model": MODEL}}]
    answer = messages.post("/v1/messages/batches/estimate", cast_to=object, body={"requests": requests})
    seen["message_estimate"] = [answer["object"], answer["request_count"], answer["max_output_tokens"],
                                [r["custom_id"] for r in answer["rejected"]]]
    try:
        messages.post("/v1/messages/batches/estimate", cast_to=object, body={"requests": []})
        seen["message_refused"] = None
    except anthropic.BadRequestError as exc:
        seen["message_refused"] = [exc.status_code, "requests" in str(exc)]
    seen["message_batches"] = len(messages.messages.batches.list().data)
print(json.dumps(seen))
