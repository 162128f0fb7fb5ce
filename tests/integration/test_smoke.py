from batchinfer.operations.openai import batches
from batchinfer.service.accounts import authenticate
from tests.helpers import chat_request, drive, new_key


def test_inline_batch_runs_to_completion(svc):
    account, key = new_key(svc)
    who = authenticate(svc, key)
    import json
    raw = json.dumps({"requests": [chat_request("q-1", "Hello"), chat_request("q-2", "World", model="qwen3.6-35b")],
                      "metadata": {"project": "x"}}).encode()
    obj, created = batches.create_batch(svc, who, raw, None)
    assert created and obj["status"] == "validating"
    final = drive(svc, obj["id"])
    assert final["status"] == "completed", final
    page = batches.results_page(svc, who, obj["id"], 100, None)
    assert [r["status"] for r in page["data"]] == ["completed", "completed"]
    assert page["data"][0]["response"]["body"]["choices"][0]["message"]["content"]
