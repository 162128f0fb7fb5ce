"""The simulated backend's answers: what it reads from a request body (a `Prompt`) and the answer it builds,
in each API's shapes (OpenAI chat, responses and embeddings; Anthropic messages; Bedrock Converse and
InvokeModel, and Converse's event-stream frames). Pure arithmetic on the request: the same body always gives
the same answer. The HTTP server, its faults and its counters are in `local.simulated_backend`, whose
docstring lists the markers read here.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import re
import struct
import time
import uuid
from dataclasses import dataclass
from functools import cached_property
from typing import Any

MAX_BIG_BYTES = 64 * 1024 * 1024
EMBEDDING_DIM = 8
_WORDS = ("amber", "basalt", "cedar", "delta", "ember", "fjord", "granite", "harbor",
          "indigo", "juniper", "kestrel", "lagoon", "meadow", "nimbus", "orchid", "quartz")
MARK_400 = "[[sim:400]]"
MARK_FAIL = "[[sim:fail-always]]"
MARK_CONTEXT = "[[sim:context-overflow]]"
SIM_CONTEXT_SIZE = 4096
_ANY_MARK_RE = re.compile(r"\[\[sim:[^\]]*\]\]")
_BIG_RE = re.compile(r"\[\[sim:big:(\d+)\]\]")
FLAKY_RE = re.compile(r"\[\[sim:flaky:(\d+):(429|500|timeout)\]\]")
TAG_RE = re.compile(rb"\[\[sim:tag:([A-Za-z0-9_-]{1,64})\]\]")
_TOOL_RE = re.compile(r"\[\[sim:tool:([A-Za-z0-9_-]{1,64})\]\]")  # the tool names both APIs accept


class SimError(Exception):
    def __init__(self, status: int, message: str, param: str | None = None,
                 code: str | None = None, headers: dict[str, str] | None = None, body: dict | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.param, self.code, self.headers = status, message, param, code, headers
        self.body = body  # the whole error body, when it is not the API's usual envelope


@dataclass
class Prompt:  # what an endpoint extracted from a request body
    model: str
    texts: list[str]
    last_user: str
    max_tokens: int | None = None
    n_messages: int = 0
    cached_tokens: int | None = None  # what the prompt cache held of it (None: no cache modelled)

    @cached_property
    def digest(self) -> bytes:
        return hashlib.sha256(json.dumps([self.model, self.texts], ensure_ascii=False).encode()).digest()

    @property
    def prompt_tokens(self) -> int:
        return sum(len(t.split()) for t in self.texts) + 3 * self.n_messages


def generate_answer(prompt: Prompt) -> tuple[str, int, bool]:
    """Deterministic (text, completion_tokens, truncated) for a prompt; honours [[sim:big:N]], max_tokens."""
    extra = " ".join(_WORDS[b % len(_WORDS)] for b in prompt.digest[:4])
    echo = " ".join(_ANY_MARK_RE.sub("", prompt.last_user)[:60].split())  # markers are never echoed back
    text = f"Simulated answer from {prompt.model} to: {echo} {extra}"
    big = _BIG_RE.search("\n".join(prompt.texts))
    if big:
        size = min(int(big.group(1)), MAX_BIG_BYTES)
        filler = " " + extra
        raw = (text + filler * (size // len(filler) + 1)).encode()
        text = raw[:size].decode(errors="ignore").rstrip()
    words = text.split()
    if truncated := prompt.max_tokens is not None and len(words) > prompt.max_tokens:
        words = words[: prompt.max_tokens]
        text = " ".join(words)
    return text, len(words), truncated


def _text_of(content: Any, param: str) -> str:
    if content is None or isinstance(content, str):
        return content or ""
    if isinstance(content, list):  # content parts; non-text parts (images, tool_use, ...) are ignored
        texts = []
        for k, p in enumerate(content):
            if isinstance(p, str):
                texts.append(p)
            elif isinstance(p, dict) and isinstance(p.get("text"), str):
                texts.append(p["text"])
            elif isinstance(p, dict) and p.get("type") == "tool_result":  # Anthropic: the tool's answer is text
                texts.append(_text_of(p.get("content"), f"{param}[{k}].content"))
        return " ".join(texts)
    raise SimError(400, f"Invalid type for '{param}': expected a string or an array of parts", param=param)


def _parse_messages(messages: Any, param: str, require_role: bool = True) -> tuple[list[str], str]:
    if not isinstance(messages, list) or not messages:
        raise SimError(400, f"'{param}' must be a non-empty array", param=param)
    texts, last_user = [], ""
    for i, msg in enumerate(messages):
        if not isinstance(msg, dict) or (require_role and not isinstance(msg.get("role"), str)):
            raise SimError(400, f"Invalid message at '{param}[{i}]': an object with a 'role' is required",
                           param=f"{param}[{i}]")
        texts.append(_text_of(msg.get("content"), f"{param}[{i}].content"))
        if msg.get("role") == "user":
            last_user = texts[-1]
    return texts, last_user


def _base(body: Any, streams: bool = False) -> str:
    if not isinstance(body, dict):
        raise SimError(400, "The request body must be a JSON object")
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise SimError(400, "You must provide a model parameter", param="model")
    if body.get("stream") and not streams:
        raise SimError(400, "stream=true is not supported on this endpoint by the simulated backend", param="stream")
    _check_types(body)
    return model


# As strict on types as an OpenAI-compatible server (vLLM answers 400 to "temperature": "hot"), so a test
# meets what production would. Written apart from the service's own checks, on purpose: a double that
# shared them would agree with their mistakes.
_NUMBERS = ("temperature", "top_p", "presence_penalty", "frequency_penalty", "top_k")
_INTEGERS = ("n", "seed", "top_logprobs", "dimensions")
_BOOLEANS = ("logprobs", "parallel_tool_calls", "store", "echo", "stream")


def _check_types(body: dict[str, Any]) -> None:
    for name in _NUMBERS:
        value = body.get(name)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int | float)):
            raise SimError(400, f"'{name}' must be a number, not {type(value).__name__}", param=name)
    for name in _INTEGERS:
        value = body.get(name)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
            raise SimError(400, f"'{name}' must be an integer, not {type(value).__name__}", param=name)
    for name in _BOOLEANS:
        value = body.get(name)
        if value is not None and not isinstance(value, bool):
            raise SimError(400, f"'{name}' must be a boolean, not {type(value).__name__}", param=name)
    stop = body.get("stop")
    if stop is not None and not (isinstance(stop, str) or (isinstance(stop, list)
                                                           and all(isinstance(x, str) for x in stop))):
        raise SimError(400, "'stop' must be a string or a list of strings", param="stop")


def _max_tokens(body: dict[str, Any], *names: str) -> int | None:
    name = next((n for n in names if body.get(n) is not None), None)
    if name is not None and (isinstance(body[name], bool) or not isinstance(body[name], int) or body[name] < 1):
        raise SimError(400, f"'{name}' must be a positive integer", param=name)
    return body[name] if name else None


def parse_chat(body: Any, max_names: tuple[str, ...] = ("max_completion_tokens", "max_tokens")) -> Prompt:
    model = _base(body, streams=True)
    texts, last_user = _parse_messages(body.get("messages"), "messages")
    if body.get("system"):  # Anthropic Messages: top-level system prompt
        texts = [_text_of(body["system"], "system"), *texts]
    return Prompt(model, texts, last_user, _max_tokens(body, *max_names), len(texts))


def parse_responses(body: Any) -> Prompt:
    model = _base(body)
    inp = body.get("input")
    inp = [{"role": "user", "content": inp}] if isinstance(inp, str) and inp else inp
    texts, last_user = _parse_messages(inp, "input", require_role=False)
    if isinstance(body.get("instructions"), str):
        texts = [body["instructions"], *texts]
    return Prompt(model, texts, last_user, _max_tokens(body, "max_output_tokens"), len(texts))


def parse_embeddings(body: Any) -> Prompt:
    model = _base(body)
    items = [body["input"]] if isinstance(body.get("input"), str) else body.get("input")
    if not isinstance(items, list) or not items or not all(isinstance(i, str) for i in items):
        raise SimError(400, "'input' must be a string or a non-empty array of strings", param="input")
    return Prompt(model, items, items[-1])


# --- Amazon Bedrock runtime --------------------------------------------------------------------------------------

# Bedrock's error classes and their HTTP status, as botocore's service model for bedrock-runtime has them.
BEDROCK_ERRORS = {"ValidationException": 400, "ServiceQuotaExceededException": 400, "AccessDeniedException": 403,
                  "ResourceNotFoundException": 404, "ModelTimeoutException": 408, "ModelErrorException": 424,
                  "ThrottlingException": 429, "ModelNotReadyException": 429, "InternalServerException": 500,
                  "ServiceUnavailableException": 503}
BEDROCK_BY_STATUS = {400: "ValidationException", 429: "ThrottlingException", 500: "InternalServerException",
                      504: "ModelTimeoutException", 499: "ModelTimeoutException"}
BEDROCK_RE = re.compile(r"\[\[sim:bedrock:([A-Za-z]{1,64})\]\]")


def bedrock_invalid(message: str) -> SimError:
    return SimError(400, message, code="ValidationException")


def _converse_texts(blocks: Any, param: str) -> str:
    if not isinstance(blocks, list) or not blocks:
        raise bedrock_invalid(f"The value at {param} must be a non-empty list of content blocks.")
    texts = []
    for k, block in enumerate(blocks):
        if not isinstance(block, dict) or len(block) != 1:
            raise bedrock_invalid(f"The content block at {param}.{k} must set exactly one member.")
        if "text" in block:
            if not isinstance(block["text"], str) or not block["text"].strip():
                raise bedrock_invalid(f"The text field in the ContentBlock object at {param}.{k} is blank. Add "
                                       "text to the text field, and try again.")
            texts.append(block["text"])
        elif "toolResult" in block:  # the tool's answer is text, as for the other routes
            for inner in block["toolResult"].get("content") or []:
                texts.append(inner["text"] if "text" in inner else json.dumps(inner.get("json")))
    return " ".join(texts)


def parse_converse(body: Any) -> Prompt:
    """A Converse request, checked as Bedrock checks it (roles alternate from a user turn, no blank text, tool
    blocks only with a toolConfig), so a translation that real Bedrock would refuse fails here too."""
    model = body["modelId"]
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise bedrock_invalid("The messages field must be a non-empty list.")
    texts: list[str] = []
    last_user, previous, tool_blocks = "", None, False
    for i, message in enumerate(messages):
        role = message.get("role") if isinstance(message, dict) else None
        if role not in ("user", "assistant") or (previous is None and role != "user") or role == previous:
            raise bedrock_invalid("A conversation must start with a user message and alternate between user and "
                                   "assistant roles. Try again with a conversation that alternates.")
        previous = role
        tool_blocks = tool_blocks or any("toolUse" in b or "toolResult" in b for b in message.get("content") or []
                                         if isinstance(b, dict))
        texts.append(_converse_texts(message.get("content"), f"messages.{i}.member.content"))
        if role == "user":
            last_user = texts[-1]
    if tool_blocks and not (body.get("toolConfig") or {}).get("tools"):
        raise bedrock_invalid("The toolConfig field must be defined when using toolUse and toolResult content "
                               "blocks.")
    system = [b.get("text", "") for b in body.get("system") or [] if isinstance(b, dict)]
    if system:
        texts = [" ".join(system), *texts]
    config = body.get("inferenceConfig") or {}
    max_tokens = config.get("maxTokens")
    if max_tokens is not None and (isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1):
        raise bedrock_invalid("The maxTokens field must be a positive integer.")
    return Prompt(model, texts, last_user, max_tokens, len(texts))


def build_converse(p: Prompt, body: dict[str, Any]) -> dict[str, Any]:
    text, n_out, cut = generate_answer(p)
    content: list[dict[str, Any]] = [{"text": text}]
    stop = "max_tokens" if cut else "end_turn"
    if call := tool_call_of(p):
        call_id, name, tool_input = call
        content = [{"toolUse": {"toolUseId": f"tooluse_{call_id}", "name": name, "input": tool_input}}]
        stop, n_out = "tool_use", len(json.dumps(tool_input).split())
    if (body.get("additionalModelRequestFields") or {}).get("thinking"):  # as Claude thinks on Bedrock
        thought = f"Thinking about: {' '.join(_ANY_MARK_RE.sub('', p.last_user).split()[:8])}"
        signed = {"text": thought, "signature": f"sig_{p.digest.hex()[:32]}"}
        content = [{"reasoningContent": {"reasoningText": signed}}, *content]
        n_out += len(thought.split())
    return {"output": {"message": {"role": "assistant", "content": content}}, "stopReason": stop,
            "usage": {"inputTokens": p.prompt_tokens, "outputTokens": n_out, "totalTokens": p.prompt_tokens + n_out},
            "metrics": {"latencyMs": 1}}


def parse_invoke(body: Any) -> Prompt:
    """A Titan text or Cohere embed body."""
    model = body["modelId"]
    if isinstance(body.get("inputText"), str) and body["inputText"]:
        return Prompt(model, [body["inputText"]], body["inputText"])
    texts = body.get("texts")
    if isinstance(texts, list) and texts and all(isinstance(t, str) and t for t in texts):
        if body.get("input_type") not in ("search_document", "search_query", "classification", "clustering"):
            raise bedrock_invalid("Malformed input request: #: required key [input_type] not found, please "
                                   "reformat your input and try again.")
        return Prompt(model, texts, texts[-1])
    raise bedrock_invalid("Malformed input request: expected inputText (Titan) or texts (Cohere), please reformat "
                           "your input and try again.")


def build_invoke(p: Prompt, body: dict[str, Any]) -> dict[str, Any]:
    vectors = [embedding_vector(p.model, text) for text in p.texts]
    if "inputText" in body:
        return {"embedding": vectors[0], "inputTextTokenCount": p.prompt_tokens}
    if body.get("embedding_types"):
        return {"id": str(uuid.UUID(bytes=p.digest[:16])), "embeddings": {"float": vectors}, "texts": p.texts,
                "response_type": "embeddings_by_type"}
    return {"id": str(uuid.UUID(bytes=p.digest[:16])), "embeddings": vectors, "texts": p.texts,
            "response_type": "embeddings_floats"}


def event_frame(event_type: str, payload: dict[str, Any]) -> bytes:
    """One `application/vnd.amazon.eventstream` message: prelude (total and headers length, CRC32), string
    headers, the JSON payload, the message's CRC32."""
    headers = b""
    for name, value in ((":event-type", event_type), (":content-type", "application/json"),
                        (":message-type", "event")):
        headers += bytes([len(name)]) + name.encode() + b"\x07" + struct.pack(">H", len(value)) + value.encode()
    body = json.dumps(payload).encode()
    prelude = struct.pack(">II", 12 + len(headers) + len(body) + 4, len(headers))
    message = prelude + struct.pack(">I", binascii.crc32(prelude)) + headers + body
    return message + struct.pack(">I", binascii.crc32(message))


def converse_events(answer: dict[str, Any], cut: bool = False) -> list[bytes]:
    """A Converse answer as ConverseStream sends it; `cut`: only up to its first delta."""
    frames = [event_frame("messageStart", {"role": "assistant"})]
    for index, block in enumerate(answer["output"]["message"]["content"]):
        if "toolUse" in block:
            use = block["toolUse"]
            frames.append(event_frame("contentBlockStart", {"contentBlockIndex": index, "start": {
                "toolUse": {"toolUseId": use["toolUseId"], "name": use["name"]}}}))
            deltas = [{"toolUse": {"input": json.dumps(use["input"])}}]
        elif "reasoningContent" in block:
            text = block["reasoningContent"]["reasoningText"]
            deltas = [{"reasoningContent": {"text": text["text"]}},
                      {"reasoningContent": {"signature": text["signature"]}}]
        else:
            deltas = [{"text": word} for word in _words(block["text"])]
        for delta in deltas:
            frames.append(event_frame("contentBlockDelta", {"contentBlockIndex": index, "delta": delta}))
            if cut:
                return frames
        frames.append(event_frame("contentBlockStop", {"contentBlockIndex": index}))
    frames.append(event_frame("messageStop", {"stopReason": answer["stopReason"]}))
    frames.append(event_frame("metadata", {"usage": answer["usage"], "metrics": answer["metrics"]}))
    return frames


def tool_call_of(p: Prompt) -> tuple[str, str, dict[str, str]] | None:
    """(16 hex id, tool name, input) when the prompt's last message holds [[sim:tool:NAME]], else None.
    Only the last message counts, so once the tool's answer is sent back the double answers in text."""
    match = _TOOL_RE.search(p.texts[-1]) if p.texts else None
    if match is None:
        return None
    text, _, _ = generate_answer(p)
    return p.digest.hex()[:16], match.group(1), {"query": text.split()[0]}


def build_chat(p: Prompt, body: dict[str, Any]) -> dict[str, Any]:
    text, n_out, cut = generate_answer(p)
    message: dict[str, Any] = {"role": "assistant", "content": text, "refusal": None}
    finish = "length" if cut else "stop"
    if call := tool_call_of(p):
        call_id, name, tool_input = call
        arguments = json.dumps(tool_input)
        message = {"role": "assistant", "content": None, "refusal": None, "tool_calls": [
            {"id": f"call_{call_id}", "type": "function", "function": {"name": name, "arguments": arguments}}]}
        finish, n_out = "tool_calls", len(arguments.split())
    return {"id": f"chatcmpl-{p.digest.hex()[:16]}", "object": "chat.completion", "created": int(time.time()),
            "model": p.model, "system_fingerprint": "fp_simulated",
            "choices": [{"index": 0, "message": message, "logprobs": None, "finish_reason": finish}],
            "usage": _chat_usage(p, body, n_out)}


def _chat_usage(p: Prompt, body: dict[str, Any], n_out: int) -> dict[str, Any]:
    """Usage as vLLM or OpenAI report it; like them, token details for some requests only: a system prompt is
    served from the prompt cache (its tokens are `cached_tokens`), and `reasoning_effort` spends half the
    answer's tokens reasoning."""
    usage: dict[str, Any] = {"prompt_tokens": p.prompt_tokens, "completion_tokens": n_out,
                             "total_tokens": p.prompt_tokens + n_out}
    system = [m for m in body.get("messages") or [] if isinstance(m, dict) and m.get("role") in ("system", "developer")]
    if p.cached_tokens is not None:  # the modelled prompt cache's count (local.simulated_cache)
        usage["prompt_tokens_details"] = {"cached_tokens": p.cached_tokens}
    elif system:
        cached = sum(len(_text_of(m.get("content"), "messages").split()) + 3 for m in system)
        usage["prompt_tokens_details"] = {"cached_tokens": cached}
    if body.get("reasoning_effort"):
        usage["completion_tokens_details"] = {"reasoning_tokens": n_out // 2}
    return usage


def build_responses(p: Prompt, body: dict[str, Any]) -> dict[str, Any]:
    text, n_out, cut = generate_answer(p)
    item = {"type": "message", "id": f"msg_{p.digest.hex()[:16]}", "status": "completed", "role": "assistant",
            "content": [{"type": "output_text", "text": text, "annotations": []}]}
    return {"id": f"resp_{p.digest.hex()[:16]}", "object": "response", "created_at": int(time.time()), "model": p.model,
            "status": "incomplete" if cut else "completed", "error": None,
            "incomplete_details": {"reason": "max_output_tokens"} if cut else None, "output": [item],
            "parallel_tool_calls": True, "tool_choice": "auto", "tools": [],
            "usage": {"input_tokens": p.prompt_tokens, "output_tokens": n_out, "total_tokens": p.prompt_tokens + n_out}}


def build_anthropic(p: Prompt, body: dict[str, Any]) -> dict[str, Any]:
    text, n_out, cut = generate_answer(p)
    content: list[dict[str, Any]] = [{"type": "text", "text": text}]
    stop = "max_tokens" if cut else "end_turn"
    if call := tool_call_of(p):
        call_id, name, tool_input = call
        content = [{"type": "tool_use", "id": f"toolu_{call_id}", "name": name, "input": tool_input}]
        stop, n_out = "tool_use", len(json.dumps(tool_input).split())
    return {"id": f"msg_{p.digest.hex()[:16]}", "type": "message", "role": "assistant", "model": p.model,
            "content": content, "stop_reason": stop,
            "stop_sequence": None, "usage": _anthropic_usage(p, n_out)}


def _anthropic_usage(p: Prompt, n_out: int) -> dict[str, Any]:
    """As Anthropic counts: `input_tokens` are those after the last cache read (with a modelled cache)."""
    if p.cached_tokens is None:
        return {"input_tokens": p.prompt_tokens, "output_tokens": n_out}
    return {"input_tokens": p.prompt_tokens - p.cached_tokens, "cache_read_input_tokens": p.cached_tokens,
            "cache_creation_input_tokens": 0, "output_tokens": n_out}


def _words(text: str) -> list[str]:
    """The text in deltas of one word each (the space before a word goes with it), joining back to the text."""
    return re.findall(r"\s*\S+", text) or [text]


def chat_chunks(answer: dict[str, Any], body: dict[str, Any], usage: bool = True) -> Any:
    """A chat completion as OpenAI streams it: a role delta, content (or tool call) deltas, the finish, then
    the usage chunk when asked for (`usage: null` on the others); `usage` false: never (llama-cpp-python)."""
    with_usage = usage and bool((body.get("stream_options") or {}).get("include_usage"))
    base = {k: answer[k] for k in ("id", "created", "model", "system_fingerprint")} | {
        "object": "chat.completion.chunk"}
    choice, message = answer["choices"][0], answer["choices"][0]["message"]

    def chunk(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
        return {**base, "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}],
                **({"usage": None} if with_usage else {})}

    yield chunk({"role": "assistant", "content": "" if message["content"] is not None else None})
    for i, call in enumerate(message.get("tool_calls") or []):
        yield chunk({"tool_calls": [{"index": i, "id": call["id"], "type": "function",
                                     "function": {"name": call["function"]["name"], "arguments": ""}}]})
        yield chunk({"tool_calls": [{"index": i, "function": {"arguments": call["function"]["arguments"]}}]})
    for word in _words(message["content"]) if message["content"] else ():
        yield chunk({"content": word})
    yield chunk({}, choice["finish_reason"])
    if with_usage:
        yield {**base, "choices": [], "usage": answer["usage"]}


def message_events(answer: dict[str, Any], usage: bool = True) -> Any:
    """A message as Anthropic streams it: message_start, a ping, each block's start, deltas and stop, then
    message_delta (stop reason, output tokens) and message_stop; `usage` false: no token counts at all."""
    start = {**answer, "content": [], "stop_reason": None, "stop_sequence": None,
             "usage": {"input_tokens": answer["usage"]["input_tokens"], "output_tokens": 1}}
    if not usage:
        del start["usage"]
    yield "message_start", {"type": "message_start", "message": start}
    yield "ping", {"type": "ping"}
    for index, block in enumerate(answer["content"]):
        if block["type"] == "tool_use":
            opening, deltas = {**block, "input": {}}, [{"type": "input_json_delta",
                                                         "partial_json": json.dumps(block["input"])}]
        else:
            opening, deltas = {"type": "text", "text": ""}, [{"type": "text_delta", "text": w}
                                                             for w in _words(block["text"])]
        yield "content_block_start", {"type": "content_block_start", "index": index, "content_block": opening}
        for delta in deltas:
            yield "content_block_delta", {"type": "content_block_delta", "index": index, "delta": delta}
        yield "content_block_stop", {"type": "content_block_stop", "index": index}
    counted = {"usage": {"output_tokens": answer["usage"]["output_tokens"]}} if usage else {}
    yield "message_delta", {"type": "message_delta", **counted,
                            "delta": {"stop_reason": answer["stop_reason"], "stop_sequence": None}}
    yield "message_stop", {"type": "message_stop"}


def embedding_vector(model: str, text: str) -> list[float]:
    """Deterministic pseudo-embedding in [-1, 1] of length EMBEDDING_DIM."""
    d = hashlib.sha256(f"{model}\n{text}".encode()).digest()
    return [round(int.from_bytes(d[2 * i: 2 * i + 2], "big") / 32767.5 - 1, 6) for i in range(EMBEDDING_DIM)]


def build_embeddings(p: Prompt, body: dict[str, Any]) -> dict[str, Any]:
    b64 = body.get("encoding_format") == "base64"
    data = []
    for i, text in enumerate(p.texts):
        vec: Any = embedding_vector(p.model, text)
        if b64:
            vec = base64.b64encode(struct.pack(f"<{len(vec)}f", *vec)).decode()
        data.append({"object": "embedding", "index": i, "embedding": vec})
    usage = {"prompt_tokens": p.prompt_tokens, "total_tokens": p.prompt_tokens}
    return {"object": "list", "data": data, "model": p.model, "usage": usage}


