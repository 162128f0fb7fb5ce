"""Token counts estimated from text, for a streamed answer whose backend reported no usage (llama-cpp-python's
server sends no usage chunk, even when asked): the request's text and the streamed text, at the model's
`estimate_chars_per_token` (the catalog's; 4 by default, about what English text averages on the common
tokenizers). An estimate, and marked as one wherever it is charged (`Attempt.usage_estimated`): no tokenizer
is shipped, since the models' own are not available offline and a stand-in would be an estimate too.
"""

from __future__ import annotations

import math

# Fields whose strings are not text the model reads or writes: roles, kinds, ids, and media (an image's
# base64 would count as thousands of "tokens").
_NOT_TEXT = frozenset({"role", "type", "id", "tool_call_id", "tool_use_id", "index", "image_url", "input_audio",
                       "file", "source", "cache_control", "signature", "object", "model", "finish_reason",
                       "stop_reason", "logprobs"})


def text_chars(value: object) -> int:
    """The characters of text in a request's messages (or tools, or a streamed delta): every string but
    those of `_NOT_TEXT` fields."""
    if isinstance(value, str):
        return len(value)
    if isinstance(value, dict):
        return sum(text_chars(v) for k, v in value.items() if k not in _NOT_TEXT)
    if isinstance(value, list):
        return sum(text_chars(v) for v in value)
    return 0


def request_chars(body: dict) -> int:
    """The text a chat completion or Messages request sends: its messages, system prompt and tools."""
    return sum(text_chars(body.get(name)) for name in ("messages", "system", "tools"))


def tokens(chars: int, chars_per_token: float) -> int:
    return math.ceil(chars / chars_per_token) if chars > 0 else 0
