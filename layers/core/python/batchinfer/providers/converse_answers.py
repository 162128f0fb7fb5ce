"""Converse answers back to what the caller asked for: a chat completion, an Anthropic message, or (from
ConverseStream's events) the chunks of a streamed chat completion. Pure: stdlib only, no I/O. The requests
are built by `providers.converse`.
"""

from __future__ import annotations

import base64
import hashlib
import json
from collections.abc import Sequence
from typing import Any

# Converse's stopReason to a chat completion's finish_reason and a message's stop_reason.
FINISH_REASONS = {"end_turn": "stop", "stop_sequence": "stop", "max_tokens": "length", "tool_use": "tool_calls",
                  "guardrail_intervened": "content_filter", "content_filtered": "content_filter",
                  "model_context_window_exceeded": "length"}
STOP_REASONS = {"end_turn": "end_turn", "stop_sequence": "stop_sequence", "max_tokens": "max_tokens",
                "tool_use": "tool_use", "guardrail_intervened": "refusal", "content_filtered": "refusal",
                "model_context_window_exceeded": "model_context_window_exceeded"}


# --- answers: Converse -> chat completion / message ---------------------------------------------------------------

def usage_of(answer: dict) -> tuple[int, int, int]:
    """(input tokens, output tokens, cached input tokens): cache reads and writes are input too (priced as
    input, as for the anthropic kind)."""
    usage = answer.get("usage") or {}
    cached = int(usage.get("cacheReadInputTokens") or 0)
    prompt = int(usage.get("inputTokens") or 0) + cached + int(usage.get("cacheWriteInputTokens") or 0)
    return prompt, int(usage.get("outputTokens") or 0), cached


def _content(answer: dict) -> list[dict]:
    message = (answer.get("output") or {}).get("message")
    if not isinstance(message, dict) or not isinstance(message.get("content"), list):
        raise ValueError("output.message.content: the answer holds no message")
    return message["content"]


def to_chat_completion(answer: dict, model: str, request_id: str, created: int) -> dict:
    """A chat completion from a Converse answer. `model`: the name the caller asked for. Raises ValueError on an
    answer that cannot be shown as one (a block other than text or toolUse)."""
    texts, calls = [], []
    for k, block in enumerate(_content(answer)):
        if isinstance(block.get("text"), str):
            texts.append(block["text"])
        elif isinstance(block.get("toolUse"), dict):
            use = block["toolUse"]
            calls.append({"id": use.get("toolUseId"), "type": "function", "function": {
                "name": use.get("name"), "arguments": json.dumps(use.get("input") or {}, ensure_ascii=False)}})
        elif "reasoningContent" not in block:  # reasoning was not asked for; its text is not the answer
            raise ValueError(f"output.message.content[{k}]: a {next(iter(block), '?')!r} block cannot be carried "
                             "into a chat completion")
    prompt, completion, cached = usage_of(answer)
    usage: dict[str, Any] = {"prompt_tokens": prompt, "completion_tokens": completion,
                             "total_tokens": prompt + completion}
    if cached:
        usage["prompt_tokens_details"] = {"cached_tokens": cached}
    message: dict[str, Any] = {"role": "assistant", "content": "".join(texts) if texts or not calls else None,
                               "refusal": None}
    if calls:
        message["tool_calls"] = calls
    finish = FINISH_REASONS.get(answer.get("stopReason"), "stop")
    return {"id": "chatcmpl-" + hashlib.sha256(request_id.encode()).hexdigest()[:24], "object": "chat.completion",
            "created": created, "model": model,
            "choices": [{"index": 0, "message": message, "logprobs": None, "finish_reason": finish}],
            "usage": usage}


def to_message(answer: dict, model: str, request_id: str, stop_sequences: Sequence[str] = ()) -> dict:
    """An Anthropic message from a Converse answer. Converse does not say which stop sequence matched: it is
    named when only one was given."""
    content = []
    for k, block in enumerate(_content(answer)):
        if isinstance(block.get("text"), str):
            if block["text"]:
                content.append({"type": "text", "text": block["text"]})
        elif isinstance(block.get("toolUse"), dict):
            use = block["toolUse"]
            content.append({"type": "tool_use", "id": use.get("toolUseId"), "name": use.get("name"),
                            "input": use.get("input") or {}})
        elif isinstance(block.get("reasoningContent"), dict):  # thinking was asked for (the thinking feature)
            reasoning = block["reasoningContent"]
            if isinstance(reasoning.get("reasoningText"), dict):
                text = reasoning["reasoningText"]
                content.append({"type": "thinking", "thinking": text.get("text") or "",
                                "signature": text.get("signature") or ""})
            elif reasoning.get("redactedContent") is not None:
                data = reasoning["redactedContent"]
                content.append({"type": "redacted_thinking", "data": base64.b64encode(data).decode()
                                if isinstance(data, bytes) else str(data)})
        else:
            raise ValueError(f"output.message.content[{k}]: a {next(iter(block), '?')!r} block cannot be carried "
                             "into a message")
    stop_reason = STOP_REASONS.get(answer.get("stopReason"), "end_turn")
    stop_sequence = stop_sequences[0] if stop_reason == "stop_sequence" and len(stop_sequences) == 1 else None
    prompt, completion, cached = usage_of(answer)
    usage = (answer.get("usage") or {})
    return {"id": "msg_" + hashlib.sha256(request_id.encode()).hexdigest()[:24], "type": "message",
            "role": "assistant", "model": model, "content": content, "stop_reason": stop_reason,
            "stop_sequence": stop_sequence,
            "usage": {"input_tokens": int(usage.get("inputTokens") or 0), "output_tokens": completion,
                      "cache_read_input_tokens": cached,
                      "cache_creation_input_tokens": int(usage.get("cacheWriteInputTokens") or 0)}}


# --- a streamed answer: ConverseStream events -> chat completion chunks ------------------------------------------

class StreamedChat:
    """ConverseStream's events as the chunks of a streamed chat completion, as they come: a role delta at
    messageStart, a text delta per text delta, a tool call opened at its contentBlockStart and its arguments
    as they come, the finish at messageStop and a usage chunk (no choices) from the metadata event. A Messages
    stream is made of these chunks by `messages_to_chat.MessageStream`, as for an `openai` backend."""

    def __init__(self, model: str, request_id: str, created: int) -> None:
        self.base = {"id": "chatcmpl-" + hashlib.sha256(request_id.encode()).hexdigest()[:24],
                     "object": "chat.completion.chunk", "created": created, "model": model}
        self.tools: dict[int, int] = {}  # contentBlockIndex -> tool call index
        self.usage: dict | None = None  # Converse's, from the metadata event

    def _chunk(self, delta: dict, finish: str | None = None) -> dict:
        return {**self.base, "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}]}

    def feed(self, event: dict) -> list[dict]:
        if "messageStart" in event:
            return [self._chunk({"role": "assistant", "content": ""})]
        if "contentBlockStart" in event:
            start = event["contentBlockStart"]
            use = (start.get("start") or {}).get("toolUse")
            if not use:
                return []
            index = self.tools[start.get("contentBlockIndex", 0)] = len(self.tools)
            return [self._chunk({"tool_calls": [{"index": index, "id": use.get("toolUseId"), "type": "function",
                                                 "function": {"name": use.get("name"), "arguments": ""}}]})]
        if "contentBlockDelta" in event:
            block = event["contentBlockDelta"]
            delta = block.get("delta") or {}
            if isinstance(delta.get("text"), str):
                return [self._chunk({"content": delta["text"]})]
            if isinstance(delta.get("toolUse"), dict):
                index = self.tools.get(block.get("contentBlockIndex", 0), 0)
                return [self._chunk({"tool_calls": [{"index": index, "function": {
                    "arguments": delta["toolUse"].get("input") or ""}}]})]
            return []  # reasoning was not asked for; its text is not the answer
        if "messageStop" in event:
            return [self._chunk({}, FINISH_REASONS.get(event["messageStop"].get("stopReason"), "stop"))]
        if "metadata" in event:
            self.usage = event["metadata"].get("usage") or {}
            prompt, completion, cached = usage_of({"usage": self.usage})
            usage: dict[str, Any] = {"prompt_tokens": prompt, "completion_tokens": completion,
                                     "total_tokens": prompt + completion}
            if cached:
                usage["prompt_tokens_details"] = {"cached_tokens": cached}
            return [{**self.base, "choices": [], "usage": usage}]
        return []
