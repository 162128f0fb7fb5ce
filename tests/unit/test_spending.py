"""The spending cap's arithmetic (`batchinfer.spending`): the cap's value, a request's worst case, and what a
settle gives back."""

from __future__ import annotations

import json
import math

import pytest

from batchinfer.catalog import Model, Price
from batchinfer.errors import InvalidRequest
from batchinfer.spending import fits, output_bound, parse_cap, settled_delta, worst_usd

MODEL = Model(id="m", price=Price(input_per_mtok=1.0, output_per_mtok=2.0), max_output_tokens=1000)
UNBOUNDED = Model(id="u", price=Price(input_per_mtok=1.0, output_per_mtok=2.0))


@pytest.mark.parametrize("value", [0, -0.5, True, "1", math.inf, math.nan, [1]])
def test_a_cap_is_a_positive_finite_number(value):
    with pytest.raises(InvalidRequest) as refused:
        parse_cap(value)
    assert refused.value.param == "max_cost_usd"


def test_a_cap_may_be_left_out_or_given_as_an_int_or_a_float():
    assert parse_cap(None) is None and parse_cap(2) == 2.0 and parse_cap(0.01) == 0.01


def test_the_output_bound_is_the_requests_own_limit_else_the_catalogs():
    chat = "/v1/chat/completions"
    assert output_bound(MODEL, chat, {"max_tokens": 50}) == 50
    assert output_bound(MODEL, chat, {"max_completion_tokens": 40, "max_tokens": 50}) == 40
    assert output_bound(MODEL, chat, {"max_tokens": 5000}) == 1000  # the backend never answers longer
    assert output_bound(MODEL, chat, {}) == 1000
    assert output_bound(UNBOUNDED, chat, {}) is None
    assert output_bound(UNBOUNDED, "/v1/responses", {"max_output_tokens": 7}) == 7
    assert output_bound(UNBOUNDED, "/v1/messages", {"max_tokens": 9}) == 9
    assert output_bound(UNBOUNDED, "/v1/embeddings", {"input": "x"}) == 0


def test_input_that_is_not_text_has_no_worst_case():
    image = {"max_tokens": 5, "messages": [{"role": "user", "content": [
        {"type": "text", "text": "what is this"}, {"type": "image_url", "image_url": {"url": "https://x/y.png"}}]}]}
    assert output_bound(MODEL, "/v1/chat/completions", image) is None
    assert output_bound(MODEL, "/v1/responses", {"input": [{"role": "user", "content": [
        {"type": "input_image", "image_url": "https://x/y.png"}]}]}) is None


@pytest.mark.parametrize("text", ["hello", "héllo wörld", "日本語のテキスト", "emoji 🎉🎉", "a\nb\tc \"q\""])
def test_a_lines_bytes_bound_its_text_and_its_chat_template(text):
    """The bytes of a stored line (JSON, non-ASCII escaped) are at least the UTF-8 bytes of its text (what a
    byte-level tokenizer's tokens each cover at least one of) plus a chat template's tokens per message."""
    messages = [{"role": "system", "content": "be brief"}, {"role": "user", "content": text}]
    line = json.dumps({"custom_id": "c", "body": {"model": "m", "messages": messages}}, separators=(",", ":"))
    template_tokens = 6 * len(messages) + 3  # role and end markers per message, the generation prompt
    assert len(line) + 1 >= sum(len(m["content"].encode()) for m in messages) + template_tokens


def test_a_settle_gives_back_what_was_not_spent_and_keeps_an_unknown_worst_case():
    worst = worst_usd(MODEL, 100, 10)
    assert worst == pytest.approx((100 * 1.0 + 10 * 2.0) / 1e6)
    assert settled_delta(worst, ran=True, cost_usd=worst / 4, cost_known=True) == pytest.approx(-0.75 * worst)
    assert settled_delta(worst, ran=True, cost_usd=0.0, cost_known=False) == 0.0
    assert settled_delta(worst, ran=False, cost_usd=0.0, cost_known=True) == -worst
    assert fits(0.5, 1.0, 0.4) and not fits(0.5, 1.0, 0.5) and not fits(0.7, 1.0, 0.4)
