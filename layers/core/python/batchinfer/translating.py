"""What the two translators of an Anthropic Messages request share: to an OpenAI-compatible chat body
(`messages_to_chat`) and to Amazon Bedrock's Converse (`providers.converse`). The one error both raise, the
one walk over a request's messages and content blocks (each checked the same way, so a fault is named the
same way whichever backend a model has), and what neither ever carries. Pure: stdlib only, no I/O.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

# Block types the service never runs on any backend (server tools, MCP, containers) besides `*_tool_result`.
_REFUSED_BLOCK_TYPES = frozenset({"server_tool_use", "mcp_tool_use", "container_upload"})


class Untranslatable(ValueError):
    """A request its backend cannot carry, raised inside a translation; the message names the parameter."""


def not_a_parameter(backend: str) -> str:
    """What a translation says of a key it does not know."""
    return f"not a parameter this service can carry to {backend}"


def turns(messages: Any, backend: str, non_empty: bool = False) -> Iterator[tuple[int, str, str, Any]]:
    """Each message as (position, path, role, content), in order: a list of objects holding only a role
    ('user' or 'assistant') and content, or Untranslatable naming the first that is not. `backend` is
    named in the refusal of an unknown key; `non_empty`: an empty list is refused too."""
    if not isinstance(messages, list) or (non_empty and not messages):
        raise Untranslatable(f"messages: expected a {'non-empty ' if non_empty else ''}list of messages")
    for i, message in enumerate(messages):
        path = f"messages[{i}]"
        if not isinstance(message, dict):
            raise Untranslatable(f"{path}: expected an object with a role and content")
        for key, value in message.items():
            if key not in ("role", "content") and value is not None:
                raise Untranslatable(f"{path}.{key}: {not_a_parameter(backend)}")
        role = message.get("role")
        if role not in ("user", "assistant"):
            raise Untranslatable(f"{path}.role: role {role!r} cannot be carried (expected 'user' or 'assistant')")
        yield i, path, role, message.get("content")


def content_blocks(content: list, path: str) -> Iterator[tuple[str, dict]]:
    """Each block of a content list with its path (`path[j]`); Untranslatable at the first with no type."""
    for j, block in enumerate(content):
        if not isinstance(block, dict) or not isinstance(block.get("type"), str):
            raise Untranslatable(f"{path}[{j}]: expected a content block with a type")
        yield f"{path}[{j}]", block


def refused_everywhere(params: dict) -> str | None:
    """What in a Messages request the service never runs on any backend (server tools, Files API sources,
    MCP servers, containers), as a message naming the parameter, or None."""
    for i, tool in enumerate(_list(params.get("tools"))):
        kind = tool.get("type") if isinstance(tool, dict) else None
        if kind is not None and kind != "custom":
            return f"tools[{i}]: server tools (type {kind!r}) are not run by this service"
    if params.get("mcp_servers") is not None:
        return "mcp_servers: MCP servers are not run by this service"
    if params.get("container") is not None:
        return "container: code execution containers are not run by this service"
    for path, block in _all_blocks(params):
        kind = block.get("type")
        if kind in _REFUSED_BLOCK_TYPES or (isinstance(kind, str) and kind.endswith("_tool_result")
                                            and kind != "tool_result"):
            return f"{path}: server tool blocks (type {kind!r}) are not run by this service"
        source = block.get("source")
        if isinstance(source, dict) and source.get("type") == "file":
            return f"{path}.source: Files API sources (type 'file') are not supported by this service"
    return None


def _list(value: Any) -> list:
    return value if isinstance(value, list) else []


def _all_blocks(params: dict) -> Iterator[tuple[str, dict]]:
    """Every content block with its path, nested ones (tool_result content, content-sourced documents) too;
    anything malformed is skipped (the translation itself refuses it, naming it)."""
    for k, block in enumerate(_list(params.get("system"))):
        yield from _nested(f"system[{k}]", block)
    for i, message in enumerate(_list(params.get("messages"))):
        content = message.get("content") if isinstance(message, dict) else None
        for j, block in enumerate(_list(content)):
            yield from _nested(f"messages[{i}].content[{j}]", block)


def _nested(path: str, block: Any) -> Iterator[tuple[str, dict]]:
    if not isinstance(block, dict):
        return
    yield path, block
    for k, inner in enumerate(_list(block.get("content"))):
        yield from _nested(f"{path}.content[{k}]", inner)
    source = block.get("source")
    if isinstance(source, dict):
        for k, inner in enumerate(_list(source.get("content"))):
            yield from _nested(f"{path}.source.content[{k}]", inner)
