"""Results as they finish and filtered results (extensions) with the official SDKs, as a user calls them: the
openai client's `get` on `/batches/{id}/results` with query params (order=finished, after, wait; status;
custom_id), the anthropic client's `get` on `/v1/messages/batches/{id}/results?order=finished`, and the
anthropic SDK's own results reader, unchanged, once the batch has ended.

Runs with any SDK major (the anthropic part where the interpreter has anthropic). Needs FREEINFERENCE_BASE_URL
(e.g. http://127.0.0.1:8000/v1) and FREEINFERENCE_API_KEY. Prints one JSON object.
"""

import json
import time

import openai
from openai import OpenAI
from openai.types import Batch
from sdk_common import BASE, KEY, MODEL, chat

try:
    import anthropic
except ImportError:  # the openai-only interpreter
    anthropic = None

client = OpenAI(base_url=BASE, api_key=KEY)
out = {"openai": openai.__version__}


def follow(get, limit=2, timeout=60):
    """Every result from the start, page by page with long polling, until the batch has ended."""
    seen, cursor, pages = [], None, 0
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        params = {"order": "finished", "limit": limit, "wait": 5, **({"after": cursor} if cursor else {})}
        page = get(params)
        pages += 1
        seen += page["data"]
        cursor = page["last_id"]
        if not page["has_more"] and page["batch_status"] in ("completed", "failed", "expired", "cancelled", "ended"):
            return seen, pages
    raise AssertionError("the batch did not end")


def raised(call):
    try:
        call()
    except openai.APIStatusError as exc:
        return [exc.status_code, (exc.body or {}).get("param") if isinstance(exc.body, dict) else None]
    return None


batch = client.post("/batches", cast_to=Batch, body={"requests": [
    chat(f"r{i}", f"hello {i}") for i in range(5)] + [chat("bad", "no [[sim:400]]")]})
path = f"/batches/{batch.id}/results"
seen, pages = follow(lambda params: client.get(path, cast_to=object, options={"params": params}))
failed = client.get(path, cast_to=object, options={"params": {"status": "failed", "limit": 1}})
one = client.get(path, cast_to=object, options={"params": {"custom_id": "r3"}})
out["openai_feed"] = {
    "custom_ids": sorted(r["custom_id"] for r in seen),
    "pages": pages,
    "failed": [[r["custom_id"] for r in failed["data"]], failed["has_more"]],
    "one": [[r["custom_id"], r["status"]] for r in one["data"]],
    "bad_status": raised(lambda: client.get(path, cast_to=object, options={"params": {"status": "done"}})),
    "bad_wait": raised(lambda: client.get(path, cast_to=object, options={"params": {"order": "finished",
                                                                                    "wait": 30}})),
}

if anthropic is not None:
    messages = anthropic.Anthropic(base_url=BASE.removesuffix("/v1") + "/anthropic", api_key=KEY)
    created = messages.messages.batches.create(requests=[
        {"custom_id": f"m{i}", "params": {"model": MODEL, "max_tokens": 16,
                                          "messages": [{"role": "user", "content": f"hi {i}"}]}} for i in range(3)])
    mpath = f"/v1/messages/batches/{created.id}/results"
    lines, _ = follow(lambda params: messages.get(mpath, cast_to=object, options={"params": params}))
    out["message_feed"] = {
        "lines": sorted([line["custom_id"], line["result"]["type"]] for line in lines),
        "sdk_results": [[e.custom_id, e.result.type] for e in messages.messages.batches.results(created.id)],
    }

print(json.dumps(out))
