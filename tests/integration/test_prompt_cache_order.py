"""A batch whose requests share system prompts runs in waves of prefixes, its results stay in submission order,
and the backend's prompt cache is found (its cached tokens come back in the usage)."""

from __future__ import annotations

import json

from batchinfer.layout import index_object, lane_object
from batchinfer.operations.openai import batches
from batchinfer.records import Request
from batchinfer.service.accounts import authenticate
from tests.helpers import drive, new_key

SYSTEMS = [" ".join(f"{name}{i}" for i in range(60)) for name in ("alpha", "beta", "gamma")]


def grouped_requests(model: str = "glm-5.3-flash") -> list[dict]:
    return [{"custom_id": f"s{s}-q{q}", "method": "POST", "url": "/v1/chat/completions",
             "body": {"model": model, "max_tokens": 4,
                      "messages": [{"role": "system", "content": system},
                                   {"role": "user", "content": f"question {q}"}]}}
            for s, system in enumerate(SYSTEMS) for q in range(4)]


def test_a_grouped_file_runs_in_waves_and_answers_in_submission_order(svc, sim_control):
    sim_control.put("/_sim/config", json={"prompt_cache": "shared"})
    _, key = new_key(svc)
    who = authenticate(svc, key)
    obj, _ = batches.create_batch(svc, who, json.dumps({"requests": grouped_requests()}).encode(), None)
    stored = svc.table.get(f"BATCH#{obj['id']}", "BATCH") or {}
    entries = json.loads(svc.blobs.get(index_object(obj["id"], 0)))
    keys = [entry[5] for entry in entries]
    assert len(set(keys)) == 3 and None not in keys  # one key per system prompt
    lane = json.loads(svc.blobs.get(lane_object(obj["id"], "glm-5.3-flash")))
    assert [keys[i] for i in lane[:3]] == [keys[0], keys[4], keys[8]]  # the first wave: a primer of each
    assert sorted(lane) == list(range(12))
    assert stored.get("lane_ordered") is True
    # The bodies are stored in the lane's order: a group of consecutive lane positions is one ranged read.
    assert [entries[i][2] for i in lane] == sorted(entries[i][2] for i in lane)

    final = drive(svc, obj["id"])
    assert final["status"] == "completed", final
    page = batches.results_page(svc, who, obj["id"], 100, None)
    assert [r["custom_id"] for r in page["data"]] == [r["custom_id"] for r in grouped_requests()]
    cached = [r["response"]["body"]["usage"]["prompt_tokens_details"]["cached_tokens"] for r in page["data"]]
    assert sum(c > 0 for c in cached) >= 6  # most requests found their system prompt cached
    item = Request.get(svc.table, obj["id"], 5)
    assert item is not None and item["prefix"] == keys[5]  # kept in the request item (a retry is ordered by it)


def test_a_model_without_a_cache_keeps_submission_order(svc, sim_control):
    _, key = new_key(svc)
    who = authenticate(svc, key)
    obj, _ = batches.create_batch(svc, who, json.dumps({"requests": grouped_requests("claude-bedrock")}).encode(),
                                  None)
    assert svc.blobs.get(lane_object(obj["id"], "claude-bedrock")) is None  # its one lane is 0..n-1
    stored = svc.table.get(f"BATCH#{obj['id']}", "BATCH") or {}
    assert "lane_ordered" not in stored
