"""`batchctl estimate` prints the queue ahead as the API gives it: a lower bound ("50+"), or "none"; how many of
a model's requests would run on its provider's batch tier; and sends what submit would (execution, priority)."""

from __future__ import annotations

import json

from batchinfer.cli import parser
from batchinfer.cli.estimate import describe_estimate, estimate_body


def estimate(queue_ahead: int, **more) -> dict:
    model = {**more, "model": "glm", "request_count": 3, "input_tokens": 30, "max_output_tokens": 300,
             "cost_usd": {"min": 0.0, "max": 0.001}, "tokenizer": "o200k_base", "queue_ahead": queue_ahead,
             "batch_budget": 16, "batch_cap_now": 16, "tier_limit": 16, "mean_latency_seconds": 0.5,
             "latency_used_seconds": 0.5, "estimated_seconds": 3.1}
    return {"object": "batch.estimate", "request_count": 3, "input_tokens": 30, "max_output_tokens": 300,
            "cost_usd": {"min": 0.0, "max": 0.001}, "tokenizer": "o200k_base", "models": [model],
            "completion_window_seconds": 86400, "estimated_completion_at": 1796285421, "fits_window": True,
            "rejected": []}


def test_the_queue_ahead_is_printed_as_a_lower_bound():
    assert "glm: 3 requests, 50+ queued ahead, 16/16 slots" in describe_estimate(estimate(50))
    assert "glm: 3 requests, none queued ahead" in describe_estimate(estimate(0))


def test_the_requests_a_tier_would_carry_are_named():
    assert "glm: 3 requests (2 on its provider's batch tier), none" in describe_estimate(
        estimate(0, execution="provider_batch", provider_batch_request_count=2))
    assert "glm: 3 requests, none" in describe_estimate(estimate(0, execution="direct", provider_batch_request_count=0))


def test_the_estimate_asks_with_the_execution_priority_and_cap_submit_would_send(tmp_path):
    source = tmp_path / "in.txt"
    source.write_text("one\ntwo\n")
    args = parser().parse_args(["estimate", str(source), "--model", "m", "--execution", "auto", "--priority", "high",
                                "--max-cost", "1.5"])
    body = json.loads(estimate_body(args))
    assert (len(body["requests"]), body["execution"], body["priority"], body["max_cost_usd"]) == (2, "auto", "high",
                                                                                                 1.5)
    plain = json.loads(estimate_body(parser().parse_args(["estimate", str(source), "--model", "m"])))
    assert set(plain) == {"requests"}
