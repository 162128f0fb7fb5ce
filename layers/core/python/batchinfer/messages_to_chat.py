"""Anthropic Messages requests to OpenAI chat-completions bodies, and chat completions back to Anthropic messages.

Used to run the requests of a Message Batch on an OpenAI-compatible backend (vLLM and the like). Pure: stdlib
only, no I/O.

The rule: nothing is ever silently dropped. A parameter the route cannot carry makes the request fail with a
message naming the parameter first (a path such as `messages[2].content[0].cache_control`), so nobody gets an
answer to a question other than the one they asked. A key whose value is null counts as absent everywhere.

On the way back, a vLLM `reasoning_content` (or `reasoning`) field is not carried into the message: an Anthropic
thinking block needs a signature this service cannot make, and thinking was not asked for (it is refused on the
way in).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Collection, Sequence
from typing import Any

from .translating import Untranslatable, content_blocks, not_a_parameter, refused_everywhere, turns

# What an OpenAI-compatible backend may declare it takes beyond text.
FEATURES = ("images", "top_k", "documents")

_BACKEND = "this model's backend (an OpenAI-compatible server)"
_TO = "an OpenAI-compatible backend"
_NOT_A_PARAMETER = not_a_parameter(_TO)

_KNOWN_TOP_LEVEL = frozenset({
    "model", "messages", "max_tokens", "system", "metadata", "stop_sequences", "temperature", "top_p", "top_k",
    "tools", "tool_choice", "thinking", "service_tier", "speed", "stream", "cache_control", "container",
    "mcp_servers", "output_config", "output_format", "context_management", "inference_geo", "diagnostics",
})
# Top-level parameters with no chat-completions counterpart: any non-null value fails.
_NO_COUNTERPART = {
    "cache_control": "prompt caching",
    "output_config": "output configuration (structured outputs, effort)",
    "output_format": "structured outputs",
    "context_management": "context management",
    "inference_geo": "the choice of an inference region",
    "diagnostics": "diagnostics",
}
# The fields of each block type the translation knows; any other non-null field fails.
_BLOCK_FIELDS = {
    "text": frozenset({"type", "text", "cache_control", "citations"}),
    "image": frozenset({"type", "source", "cache_control"}),
    "document": frozenset({"type", "source", "title", "context", "citations", "cache_control"}),
    "tool_use": frozenset({"type", "id", "name", "input", "cache_control"}),
    "tool_result": frozenset({"type", "tool_use_id", "content", "is_error", "cache_control"}),
}
_TOOL_FIELDS = frozenset({"type", "name", "description", "input_schema", "strict"})
_TOOL_CHOICES = {"auto": "auto", "any": "required", "none": "none"}


# --- request: Messages params -> chat-completions body ----------------------------------------------------------

def untranslatable(params: dict, features: Collection[str]) -> str | None:
    """What in a Messages request an OpenAI-compatible chat backend with these features cannot carry, as a
    message naming the parameter (path like `messages[2].content[0].cache_control`), or None.
    Assumes refused_everywhere(params) is None and params is otherwise a structurally valid Messages request
    (what refused_everywhere would refuse is reported too, so to_chat can never carry it)."""
    try:
        _translate(params, features)
    except Untranslatable as problem:
        return str(problem)
    return None


def to_chat(params: dict, features: Collection[str]) -> dict:
    """The chat-completions body (without "model": the caller sets the backend's name). Only called when
    untranslatable() is None; raises ValueError if called on something it cannot carry."""
    return _translate(params, features)


def _translate(params: dict, features: Collection[str]) -> dict:
    # One walk both checks and builds, so untranslatable() and to_chat() can never disagree.
    unknown = set(features) - set(FEATURES)
    if unknown:  # a typo in a model's declaration must not quietly turn a feature off
        raise ValueError(f"unknown backend features {sorted(unknown)}; known: {list(FEATURES)}")
    if not isinstance(params, dict):
        raise Untranslatable("params: expected a JSON object")
    if (refused := refused_everywhere(params)) is not None:
        raise Untranslatable(refused)
    for key, value in params.items():
        if key not in _KNOWN_TOP_LEVEL and value is not None:
            raise Untranslatable(f"{key}: {_NOT_A_PARAMETER}")
    _check_top_level(params, features)

    body: dict[str, Any] = {"messages": _system(params.get("system")) + _messages(params.get("messages"), features)}
    for name in ("max_tokens", "temperature", "top_p", "top_k"):  # same names, same meaning
        if params.get(name) is not None:
            body[name] = params[name]
    if params.get("stop_sequences"):
        body["stop"] = list(params["stop_sequences"])
    metadata = params.get("metadata") or {}
    if metadata.get("user_id") is not None:
        body["user"] = metadata["user_id"]
    tools = _tools(params.get("tools"))
    if tools:
        body["tools"] = tools
    body.update(_tool_choice(params.get("tool_choice"), bool(tools)))
    return body


def _check_top_level(params: dict, features: Collection[str]) -> None:
    thinking = params.get("thinking")
    if thinking is not None and not (isinstance(thinking, dict) and thinking.get("type") == "disabled"):
        raise Untranslatable(f"thinking: extended thinking cannot be carried to {_BACKEND}")
    for name, what in _NO_COUNTERPART.items():
        if params.get(name) is not None:
            raise Untranslatable(f"{name}: {what} cannot be carried to {_BACKEND}")
    tier = params.get("service_tier")
    if tier not in (None, "auto", "standard_only"):  # the service has one tier, which both of these accept
        raise Untranslatable(f"service_tier: service tier {tier!r} is not offered by this service")
    speed = params.get("speed")
    if speed not in (None, "standard"):
        raise Untranslatable(f"speed: speed {speed!r} is not offered by {_BACKEND}")
    if params.get("top_k") is not None and "top_k" not in features:
        raise Untranslatable("top_k: top_k sampling is not accepted by this model's backend")
    metadata = params.get("metadata")
    if metadata is not None:
        if not isinstance(metadata, dict):
            raise Untranslatable("metadata: expected an object")
        for key, value in metadata.items():
            if key != "user_id" and value is not None:
                raise Untranslatable(f"metadata.{key}: {_NOT_A_PARAMETER}")


def _system(system: Any) -> list[dict]:
    if system is None:
        return []
    if isinstance(system, str):
        text = system
    elif isinstance(system, list):
        texts = []
        for path, block in content_blocks(system, "system"):
            if block["type"] != "text":
                raise Untranslatable(f"{path}: {block['type']!r} blocks cannot be carried in a system prompt")
            texts.append(_text(block, path))
        text = "\n\n".join(texts)
    else:
        raise Untranslatable("system: expected a string or a list of text blocks")
    return [{"role": "system", "content": text}] if text else []  # an empty system prompt carries nothing


def _messages(messages: Any, features: Collection[str]) -> list[dict]:
    out: list[dict] = []
    for i, path, role, content in turns(messages, _TO):
        if role == "user":
            out.extend(_user(content, f"{path}.content", features))
        else:
            if i == len(messages) - 1:
                # Claude continues a final assistant message; a chat server answers after it instead, which
                # would be a different question.
                raise Untranslatable(f"{path}: a final assistant message (prefill) cannot be carried to {_BACKEND}")
            out.append(_assistant(content, f"{path}.content"))
    return out


def _user(content: Any, path: str, features: Collection[str]) -> list[dict]:
    if isinstance(content, str):
        return [{"role": "user", "content": content}]
    if not isinstance(content, list):
        raise Untranslatable(f"{path}: expected a string or a list of content blocks")
    tool_messages, parts = [], []
    for block_path, block in content_blocks(content, path):
        kind = block["type"]
        if kind == "tool_result":
            tool_messages.append(_tool_result(block, block_path))
        elif kind == "text":
            parts.append({"type": "text", "text": _text(block, block_path)})
        elif kind == "image":
            parts.append(_image(block, block_path, features))
        elif kind == "document":
            parts.append(_document(block, block_path, features))
        else:
            raise Untranslatable(_unsupported(kind, block_path, "user"))
    # Chat servers want tool answers right after the assistant turn that called the tools, so they go first
    # (Anthropic requires tool_result blocks to lead the user message anyway).
    if parts or not tool_messages:
        tool_messages.append({"role": "user", "content": parts or ""})
    return tool_messages


def _assistant(content: Any, path: str) -> dict:
    if isinstance(content, str):
        return {"role": "assistant", "content": content}
    if not isinstance(content, list):
        raise Untranslatable(f"{path}: expected a string or a list of content blocks")
    texts, calls = [], []
    for block_path, block in content_blocks(content, path):
        kind = block["type"]
        if kind == "text":
            texts.append(_text(block, block_path))
        elif kind == "tool_use":
            calls.append(_tool_call(block, block_path))
        else:
            raise Untranslatable(_unsupported(kind, block_path, "assistant"))
    # One string: many OpenAI-compatible servers take only string assistant content.
    message: dict[str, Any] = {"role": "assistant", "content": "".join(texts) if texts or not calls else None}
    if calls:
        message["tool_calls"] = calls
    return message


def _unsupported(kind: str, path: str, role: str) -> str:
    if kind in ("thinking", "redacted_thinking"):
        return f"{path}: thinking blocks cannot be carried to {_BACKEND}"
    if kind == "search_result":
        return f"{path}: search result blocks cannot be carried to {_BACKEND}"
    if kind in _BLOCK_FIELDS:  # a known block on the wrong side of the conversation
        other = "assistant" if role == "user" else "user"
        return f"{path}: {kind} blocks can only be carried in {other} messages"
    return f"{path}: {kind!r} blocks cannot be carried to {_BACKEND}"


def _check_fields(block: dict, path: str) -> None:
    if block.get("cache_control") is not None:
        raise Untranslatable(f"{path}.cache_control: prompt caching cannot be carried to {_BACKEND}")
    for key, value in block.items():
        if key not in _BLOCK_FIELDS[block["type"]] and value is not None:
            raise Untranslatable(f"{path}.{key}: not a field of a {block['type']} block this service can carry "
                                  "to an OpenAI-compatible backend")


def _text(block: dict, path: str) -> str:
    _check_fields(block, path)
    if block.get("citations"):  # an empty list cites nothing
        raise Untranslatable(f"{path}.citations: citations cannot be carried to {_BACKEND}")
    if not isinstance(block.get("text"), str):
        raise Untranslatable(f"{path}.text: expected a string")
    return block["text"]


def _image(block: dict, path: str, features: Collection[str]) -> dict:
    if "images" not in features:
        raise Untranslatable(f"{path}: image blocks are not accepted by this model's backend")
    _check_fields(block, path)
    source = block.get("source") if isinstance(block.get("source"), dict) else {}
    if source.get("type") == "base64":
        url = f"data:{source.get('media_type')};base64,{source.get('data')}"
    elif source.get("type") == "url":
        url = source.get("url")
    else:
        raise Untranslatable(f"{path}.source: image source type {source.get('type')!r} cannot be carried "
                              f"to {_BACKEND}")
    return {"type": "image_url", "image_url": {"url": url}}


def _document(block: dict, path: str, features: Collection[str]) -> dict:
    if "documents" not in features:
        raise Untranslatable(f"{path}: document blocks are not accepted by this model's backend")
    _check_fields(block, path)
    if block.get("citations") not in (None, {"enabled": False}):
        raise Untranslatable(f"{path}.citations: citations cannot be carried to {_BACKEND}")
    if block.get("context") is not None:
        raise Untranslatable(f"{path}.context: document context cannot be carried to {_BACKEND}")
    source = block.get("source") if isinstance(block.get("source"), dict) else {}
    if source.get("type") != "base64" or source.get("media_type") != "application/pdf":
        raise Untranslatable(f"{path}.source: only base64 PDF documents can be carried to {_BACKEND} "
                              f"(not source type {source.get('type')!r}, media type {source.get('media_type')!r})")
    return {"type": "file", "file": {"filename": block.get("title") or "document.pdf",
                                     "file_data": f"data:application/pdf;base64,{source.get('data')}"}}


def _tool_call(block: dict, path: str) -> dict:
    _check_fields(block, path)
    if not isinstance(block.get("input"), dict):
        raise Untranslatable(f"{path}.input: expected an object")
    # ensure_ascii=False: the model reads the arguments back; escapes would only cost it tokens.
    arguments = json.dumps(block["input"], ensure_ascii=False)
    return {"id": block.get("id"), "type": "function", "function": {"name": block.get("name"), "arguments": arguments}}


def _tool_result(block: dict, path: str) -> dict:
    _check_fields(block, path)
    if block.get("is_error"):
        raise Untranslatable(f"{path}.is_error: tool errors cannot be carried to {_BACKEND} "
                              "(OpenAI tool messages have no error flag)")
    content = block.get("content")
    if content is None or isinstance(content, str):
        text = content or ""
    elif isinstance(content, list):
        texts = []
        for inner_path, inner in content_blocks(content, f"{path}.content"):
            if inner["type"] == "image":
                raise Untranslatable(f"{inner_path}: image blocks inside a tool_result cannot be carried to "
                                      f"{_BACKEND} (OpenAI tool messages carry text only)")
            if inner["type"] != "text":
                raise Untranslatable(f"{inner_path}: {inner['type']} blocks inside a tool_result cannot be carried "
                                      f"to {_BACKEND} (OpenAI tool messages carry text only)")
            texts.append(_text(inner, inner_path))
        text = "\n\n".join(texts)
    else:
        raise Untranslatable(f"{path}.content: expected a string or a list of content blocks")
    return {"role": "tool", "tool_call_id": block.get("tool_use_id"), "content": text}


def _tools(tools: Any) -> list[dict]:
    if tools is None:
        return []
    if not isinstance(tools, list):
        raise Untranslatable("tools: expected a list of tools")
    out = []
    for i, tool in enumerate(tools):
        path = f"tools[{i}]"
        if not isinstance(tool, dict):
            raise Untranslatable(f"{path}: expected an object")
        if tool.get("cache_control") is not None:
            raise Untranslatable(f"{path}.cache_control: prompt caching cannot be carried to {_BACKEND}")
        for key, value in tool.items():
            if key not in _TOOL_FIELDS and value is not None:
                raise Untranslatable(f"{path}.{key}: not a tool field this service can carry to an "
                                      "OpenAI-compatible backend")
        function: dict[str, Any] = {"name": tool.get("name"), "parameters": tool.get("input_schema")}
        if tool.get("description") is not None:
            function["description"] = tool["description"]
        if tool.get("strict") is not None:
            function["strict"] = tool["strict"]
        out.append({"type": "function", "function": function})
    return out


def _tool_choice(choice: Any, has_tools: bool) -> dict:
    """The body fields a tool_choice becomes."""
    if choice is None:
        return {}
    if not isinstance(choice, dict):
        raise Untranslatable("tool_choice: expected an object")
    kind = choice.get("type")
    allowed = {"type", "disable_parallel_tool_use"} | ({"name"} if kind == "tool" else set())
    for key, value in choice.items():
        if key not in allowed and value is not None:
            raise Untranslatable(f"tool_choice.{key}: {_NOT_A_PARAMETER}")
    if kind == "tool":
        mapped: Any = {"type": "function", "function": {"name": choice.get("name")}}
    elif kind in _TOOL_CHOICES:
        mapped = _TOOL_CHOICES[kind]
    else:
        raise Untranslatable(f"tool_choice.type: {kind!r} cannot be carried to {_BACKEND}")
    if not has_tools:
        if kind in ("auto", "none"):  # without tools there is nothing to choose; chat servers refuse the field
            return {}
        raise Untranslatable(f"tool_choice: type {kind!r} needs tools, and the request has none")
    fields = {"tool_choice": mapped}
    if choice.get("disable_parallel_tool_use"):
        fields["parallel_tool_calls"] = False
    return fields


# --- answer: chat completion -> Messages message ----------------------------------------------------------------

def to_message(chat: dict, model: str, stop_sequences: Sequence[str] = ()) -> dict:
    """An Anthropic `message` from an OpenAI chat completion. `model`: the model name the caller asked for.
    Raises ValueError with a clear message when the answer cannot be translated (no choices, tool call
    arguments that are not JSON, ...).

    content: a text block for the answer's text (when non-empty), a text block for a refusal, then one tool_use
    block per tool call. It is `[]` only when the answer truly holds nothing (as Anthropic's own can be).
    `reasoning_content` / `reasoning` are not carried (see the module docstring)."""
    if not isinstance(chat, dict):
        raise ValueError("the backend's answer is not a JSON object")
    choices = chat.get("choices")
    if not isinstance(choices, list) or len(choices) != 1:
        count = len(choices) if isinstance(choices, list) else "no"
        raise ValueError(f"the backend's answer has {count} choices; exactly one was expected")
    choice = choices[0]
    message = choice.get("message") if isinstance(choice, dict) else None
    if not isinstance(message, dict):
        raise ValueError("choices[0].message: the backend's answer has no message")
    # Stable ids: a retried translation of the same answer gives the same message.
    seed = str(chat["id"]) if chat.get("id") is not None else json.dumps(chat, sort_keys=True, default=str)

    content: list[dict] = []
    if text := _answer_text(message.get("content")):
        content.append({"type": "text", "text": text})
    refusal = message.get("refusal")
    if refusal:
        content.append({"type": "text", "text": str(refusal)})
    calls = message.get("tool_calls") or []
    if not isinstance(calls, list):
        raise ValueError("choices[0].message.tool_calls: expected a list")
    if message.get("function_call") is not None:  # the legacy single-function form
        calls = [*calls, {"type": "function", "function": message["function_call"]}]
    for n, call in enumerate(calls):
        content.append(_tool_use(call, f"choices[0].message.tool_calls[{n}]", f"{seed}:{n}"))

    stop_reason, stop_sequence = _stop(choice, bool(calls), refusal is not None, stop_sequences)
    usage = chat.get("usage") or {}
    return {
        "id": "msg_" + hashlib.sha256(seed.encode()).hexdigest()[:24],
        "type": "message", "role": "assistant", "model": model, "content": content,
        "stop_reason": stop_reason, "stop_sequence": stop_sequence,
        "usage": {"input_tokens": int(usage.get("prompt_tokens") or 0),
                  "output_tokens": int(usage.get("completion_tokens") or 0)},
    }


def _answer_text(content: Any) -> str:
    if content is None or isinstance(content, str):
        return content or ""
    if not isinstance(content, list):
        raise ValueError("choices[0].message.content: expected a string or a list of parts")
    texts = []
    for k, part in enumerate(content):
        if not (isinstance(part, dict) and part.get("type") == "text" and isinstance(part.get("text"), str)):
            kind = part.get("type") if isinstance(part, dict) else type(part).__name__
            raise ValueError(f"choices[0].message.content[{k}]: a {kind!r} part cannot be carried into an "
                             "Anthropic message")
        texts.append(part["text"])
    return "".join(texts)


def _tool_use(call: Any, path: str, seed: str) -> dict:
    if not isinstance(call, dict) or call.get("type", "function") not in ("function", None):
        raise ValueError(f"{path}: only function tool calls can be carried into an Anthropic message")
    function = call.get("function")
    if not isinstance(function, dict) or not isinstance(function.get("name"), str):
        raise ValueError(f"{path}.function: a tool call without a function name")
    arguments = function.get("arguments")
    if isinstance(arguments, str):
        try:
            # Some servers send "" for a call without arguments; that is the empty object, nothing is lost.
            arguments = json.loads(arguments) if arguments.strip() else {}
        except ValueError as error:
            raise ValueError(f"{path}.function.arguments: not JSON ({error})") from None
    elif arguments is None:
        arguments = {}
    if not isinstance(arguments, dict):
        raise ValueError(f"{path}.function.arguments: not a JSON object")
    call_id = call.get("id") or "toolu_" + hashlib.sha256(seed.encode()).hexdigest()[:24]
    return {"type": "tool_use", "id": call_id, "name": function["name"], "input": arguments}


def _stop(choice: dict, has_calls: bool, refused: bool, stop_sequences: Sequence[str]) -> tuple[str, str | None]:
    finish = choice.get("finish_reason")
    if refused or finish == "content_filter":
        return "refusal", None
    if finish == "length":
        return "max_tokens", None
    if has_calls:  # vLLM answers a named tool_choice with finish_reason "stop"; the turn still ends in tool use
        return "tool_use", None
    matched = choice.get("stop_reason")  # vLLM: the stop string that ended the answer (an int for a stop token)
    if finish == "stop" and isinstance(matched, str) and matched in stop_sequences:
        return "stop_sequence", matched
    return "end_turn", None


# --- a streamed answer: chat completion chunks -> Messages stream events ---------------------------------------

class MessageStream:
    """Chat completion chunks to the events of Anthropic's message stream, as they come: `message_start`,
    then per block `content_block_start`, its deltas (`text_delta`, `input_json_delta`) and
    `content_block_stop`, then `message_delta` (stop reason, usage) and `message_stop` from `end()`. The same
    mapping as `to_message` (text, refusal as text, one tool_use block per tool call, the same stop reasons);
    the usage only comes with the last chunk, so `message_start` counts 0 input tokens and `message_delta`
    carries both counts."""

    def __init__(self, model: str, stop_sequences: Sequence[str] = ()) -> None:
        self.model, self.stop_sequences = model, stop_sequences
        self.started = False
        self.seed = ""
        self.index = -1  # of the open block
        self.open: tuple[str, int] | None = None  # ("text", 0) or ("tool", tool call index)
        self.calls = 0
        self.refused = False
        self.choice: dict = {}
        self.usage: dict = {}

    def feed(self, chunk: dict) -> list[tuple[str, dict]]:
        events: list[tuple[str, dict]] = []
        if not self.started:
            self.started = True
            self.seed = str(chunk.get("id") or "")
            events.append(("message_start", {"type": "message_start", "message": {
                "id": "msg_" + hashlib.sha256(self.seed.encode()).hexdigest()[:24], "type": "message",
                "role": "assistant", "model": self.model, "content": [], "stop_reason": None,
                "stop_sequence": None, "usage": {"input_tokens": 0, "output_tokens": 0}}}))
        if isinstance(chunk.get("usage"), dict):
            self.usage = chunk["usage"]
        for choice in chunk.get("choices") or []:
            delta = choice.get("delta") or {}
            for text, refusal in ((delta.get("content"), False), (delta.get("refusal"), True)):
                if isinstance(text, str) and text:
                    self.refused = self.refused or refusal
                    events += self._block(("text", 0), {"type": "text", "text": ""})
                    events.append(self._delta({"type": "text_delta", "text": text}))
            for call in delta.get("tool_calls") or []:
                function = call.get("function") or {}
                key = ("tool", int(call.get("index") or 0))
                if self.open != key:
                    self.calls += 1
                    call_id = call.get("id") or "toolu_" + hashlib.sha256(
                        f"{self.seed}:{key[1]}".encode()).hexdigest()[:24]
                    events += self._block(key, {"type": "tool_use", "id": call_id, "name": function.get("name"),
                                                "input": {}})
                if function.get("arguments"):
                    events.append(self._delta({"type": "input_json_delta", "partial_json": function["arguments"]}))
            if choice.get("finish_reason"):
                self.choice = choice
        return events

    def end(self) -> list[tuple[str, dict]]:
        events = self._close()
        stop_reason, stop_sequence = _stop(self.choice, self.calls > 0, self.refused, self.stop_sequences)
        usage = {"input_tokens": int(self.usage.get("prompt_tokens") or 0),
                 "output_tokens": int(self.usage.get("completion_tokens") or 0)}
        return events + [("message_delta", {"type": "message_delta", "usage": usage,
                                            "delta": {"stop_reason": stop_reason, "stop_sequence": stop_sequence}}),
                         ("message_stop", {"type": "message_stop"})]

    def _block(self, key: tuple[str, int], opening: dict) -> list[tuple[str, dict]]:
        if self.open == key:
            return []
        events = self._close()
        self.open, self.index = key, self.index + 1
        return events + [("content_block_start", {"type": "content_block_start", "index": self.index,
                                                  "content_block": opening})]

    def _delta(self, delta: dict) -> tuple[str, dict]:
        return "content_block_delta", {"type": "content_block_delta", "index": self.index, "delta": delta}

    def _close(self) -> list[tuple[str, dict]]:
        if self.open is None:
            return []
        self.open = None
        return [("content_block_stop", {"type": "content_block_stop", "index": self.index})]
