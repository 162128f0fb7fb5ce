"""`batchctl estimate` prints the queue ahead as the API gives it: a lower bound ("50+"), or "none"."""

from __future__ import annotations

from batchinfer.cli.estimate import describe_estimate


def estimate(queue_ahead: int) -> dict:
    model = {"model": "glm", "request_count": 3, "input_tokens": 30, "max_output_tokens": 300,
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
