"""A batch's cost as each batch API shows it: one rounding, whatever the API (and a day's spending too)."""

from __future__ import annotations

from batchinfer.operations.anthropic.message_batches import message_batch_object
from batchinfer.operations.openai.batches import batch_object
from batchinfer.service.running.batch_usage import shown_usd


def _item(cost: float) -> dict:
    return {"id": "batch_x", "endpoint": "/v1/chat/completions", "status": "in_progress", "created_at": 0,
            "expires_at": 86400, "total": 2, "lanes": {}, "cost_usd": cost, "input_tokens": 3, "output_tokens": 4}


def test_every_batch_api_shows_the_same_rounded_cost() -> None:
    cost = 0.1 + 0.2  # 0.30000000000000004 as a binary float
    assert shown_usd(cost) == 0.3
    openai = batch_object(_item(cost))
    anthropic = message_batch_object(_item(cost), "http://127.0.0.1")
    assert openai["cost_usd"] == anthropic["cost_usd"] == 0.3
    assert openai["usage"] == anthropic["usage"] == {"input_tokens": 3, "output_tokens": 4, "total_tokens": 7}
    assert shown_usd(None) == 0.0 and shown_usd("1.23456789012345") == 1.2345678901
