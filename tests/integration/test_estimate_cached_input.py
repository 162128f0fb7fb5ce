"""An estimate counts the input a prompt cache would serve: the shared part of every request after its prefix's
first, on a model with a cache; none on a model whose backend has none."""

from __future__ import annotations

from batchinfer.service.creating.tokenizer import count_body
from tests.helpers import new_key, ok

ESTIMATE = "/v1/batches/estimate"
SYSTEM = " ".join(f"rule{i}" for i in range(50))


def request(i: int, model: str, system: str = SYSTEM) -> dict:
    return {"custom_id": f"r{i}", "method": "POST", "url": "/v1/chat/completions",
            "body": {"model": model, "max_tokens": 4, "messages": [{"role": "system", "content": system},
                                                                   {"role": "user", "content": f"question {i}"}]}}


def test_the_estimate_counts_cached_input_where_the_model_has_a_cache(api, svc):
    _, key = new_key(svc)
    shared = count_body({"messages": [{"role": "system", "content": SYSTEM}]}, "/v1/chat/completions")
    requests = [request(i, "glm-5.3-flash") for i in range(5)] + [request(9, "glm-5.3-flash", "other rules")]
    answer = ok(api("POST", ESTIMATE, key, json_body={"requests": requests}))
    assert answer["cached_input_tokens"] == 4 * shared  # the 4 after the first of the same system prompt
    assert answer["models"][0]["cached_input_tokens"] == 4 * shared
    assert 0 < answer["cached_input_tokens"] < answer["input_tokens"]

    bedrock = ok(api("POST", ESTIMATE, key, json_body={"requests": [request(i, "claude-bedrock") for i in range(5)]}))
    assert bedrock["cached_input_tokens"] == 0  # its backend is sent no cache points
