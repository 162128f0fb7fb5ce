"""A request's prefix key: a short hash of the part of its prompt a backend's prompt cache would share with
other requests (the system prompt, the tools, the leading messages), computed once at intake and kept in its
index entry (then in its group's positions and its request item), so the scheduler can order a batch's work
by prefix without reading a body again (`scheduling.prefix_order`).

What counts as shared:
- chat completions: `tools` and every message before the last one (the system prompt, few-shot turns, a
  document sent before the question);
- Messages (`/v1/messages`): `system`, `tools` and the messages up to the block carrying the last
  `cache_control` breakpoint (Anthropic caches exactly that far); without a breakpoint, as for chat;
- Responses: `instructions`, `tools` and the input items before the last.
At most `PREFIX_BOUND` characters of that part count: two prompts that agree so far share what a cache
would keep of them first. A request with nothing before its last message (and no system prompt or tools)
has no key: nothing of it is shared, and it is scheduled as it comes.
"""

from __future__ import annotations

import base64
import hashlib
import json
from typing import Any

from ...catalog import CHAT_ENDPOINT, MESSAGES_ENDPOINT

PREFIX_BOUND = 32_768  # characters of the canonical shared part that count (a long prompt's first ~8k tokens)
KEY_BYTES = 8  # 11 characters of base64: collisions only matter to the order, never to a result


def prefix_key(endpoint: str, body: dict[str, Any]) -> str | None:
    """The prefix key of a request of `endpoint` with this body, or None when nothing of it is shared."""
    shared = _shared_part(endpoint, body)
    if not shared:
        return None
    text = json.dumps(shared, sort_keys=True, ensure_ascii=False, separators=(",", ":"))[:PREFIX_BOUND]
    digest = hashlib.sha256(text.encode("utf-8", "surrogatepass")).digest()[:KEY_BYTES]
    return base64.urlsafe_b64encode(digest).rstrip(b"=").decode()


def shared_part(endpoint: str, body: dict[str, Any]) -> dict[str, Any]:
    """The request without its last message (or input item): what a cache serves of it once its prefix is
    written, to count the tokens of (an estimate's cached input)."""
    for name in ("messages", "input"):
        if isinstance(body.get(name), list) and body[name]:
            return {**body, name: body[name][:-1]}
    return body


def _shared_part(endpoint: str, body: dict[str, Any]) -> list[Any]:
    tools = body.get("tools")
    if endpoint == MESSAGES_ENDPOINT:
        messages = body.get("messages") if isinstance(body.get("messages"), list) else []
        leading = _up_to_breakpoint(body.get("system"), tools, messages)
        if leading is not None:
            return leading
        return _nonempty([body.get("system"), tools], messages[:-1])
    if endpoint == CHAT_ENDPOINT:
        messages = body.get("messages") if isinstance(body.get("messages"), list) else []
        return _nonempty([tools], messages[:-1])
    if endpoint == "/v1/responses":
        items = body.get("input") if isinstance(body.get("input"), list) else []
        return _nonempty([body.get("instructions"), tools], items[:-1])
    return []  # embeddings and anything else: no prompt cache to share


def _nonempty(heads: list[Any], leading: list[Any]) -> list[Any]:
    if not leading and not any(heads):
        return []
    return [*heads, *leading]


def _up_to_breakpoint(system: Any, tools: Any, messages: list[Any]) -> list[Any] | None:
    """What a Messages request caches: everything up to and including its last `cache_control` block, in
    Anthropic's order (tools, system, messages); None without a breakpoint."""
    parts: list[Any] = [tools, system]
    last = -1
    if _marked(tools) or _marked(system):
        last = 1
    for message in messages:
        parts.append(message)
        if isinstance(message, dict) and _marked(message.get("content")):
            last = len(parts) - 1
    if last < 0:
        return None
    return parts[:last + 1]


def _marked(value: Any) -> bool:
    """Whether a list of blocks (tools, system blocks, a message's content) carries a cache_control."""
    return isinstance(value, list) and any(isinstance(b, dict) and b.get("cache_control") for b in value)
