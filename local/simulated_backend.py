"""Simulated model backend -- a TEST DOUBLE that stands in for real model servers.

This is NOT a model and runs no inference. Every answer is built deterministically from a hash
of the request (model + message texts), so the same input always gives the same output and
different inputs give different outputs. It exists for unit/integration tests and benchmarks.

Endpoints: POST /v1/chat/completions, /v1/embeddings, /v1/responses (OpenAI shapes), POST /v1/messages
(Anthropic shape), GET /v1/models; and Amazon Bedrock's runtime as boto3 calls it (`endpoint_url`, any SigV4
signature): POST /model/{modelId}/converse (Converse's JSON; tool use as the other routes; errors as Bedrock
sends them: the status of the error class, its name in `x-amzn-ErrorType`, a `{"message": ...}` body, the
request id in `x-amzn-RequestId`) and /model/{modelId}/invoke (Titan text `{"inputText"}` and Cohere embed
`{"texts", "input_type"}` embedding bodies; the token count in `X-Amzn-Bedrock-Input-Token-Count`) and
/model/{modelId}/converse-stream (the same answer as `application/vnd.amazon.eventstream` frames, as botocore
parses them: messageStart, a contentBlockDelta per word or the tool's input, contentBlockStop, messageStop,
metadata with the usage; `[[sim:cut-stream]]` ends it after its first delta, with no messageStop). Faults
there answer as Bedrock's classes: 429 ThrottlingException, 500 InternalServerException, a timeout 408
ModelTimeoutException, a 400 ValidationException. Chat completions and messages stream with `stream: true` (server-sent
events in each API's shapes: the same answer, a word per delta, after the latency; chat sends a usage chunk
only with `stream_options.include_usage`, as OpenAI does).

Faults, set at start-up (CLI / SimConfig) or at run time through the control API:
  latency_seconds        every model request sleeps this long (asyncio, so requests overlap): the mean
  latency_distribution   fixed (the default), lognormal (latency_sigma around the mean) or long_tail (one
                         request in ten takes ten times the others); drawn from the request's own body, so
                         the same request always takes the same time (a direct client sees the same times)
  rate_429/500/timeout   probabilities, drawn from random.Random(seed) (one draw per request);
                         a timeout sleeps timeout_sleep_seconds, then answers 504
  answer_extra_json      JSON members (text, e.g. '"timings":{"prompt_per_second":12500.0}') added as they
                         are to every whole answer, and to a streamed chat completion's finishing chunk: real
                         servers add fields of their own (llama-server's `timings`) and spell numbers their
                         own way (`12500.0`, `1e-7`)
  stream_usage           false: a streamed chat completion never sends its usage chunk, even when asked
                         (llama-cpp-python's server does not), and a streamed message has no token counts
Every answer carries a request id header, as OpenAI's and Anthropic's do: `x-request-id` (OpenAI shapes),
`request-id` (Anthropic's).
Markers inside message content:
  [[sim:400]] (or model "reject-me")  -> 400, non-retryable
  [[sim:context-overflow]]            -> 400 with llama-server's body for a prompt over its context, its own
                                         fields and all: {"error": {"code": 400, "message": ..., "type":
                                         "exceed_context_size_error", "n_prompt_tokens": N, "n_ctx": 4096}}
  [[sim:fail-always]]                 -> 500 every time
  [[sim:big:N]]                       -> an answer of about N bytes
  [[sim:flaky:N:CODE]]                -> the first N requests with this exact body fail with CODE
                                         (429, 500 or timeout), later ones succeed
  [[sim:tool:NAME]]                   -> in the LAST message only (so a tool loop ends once the tool's answer
                                         is sent back): a call of tool NAME with input {"query": <the first word
                                         of the answer>}; chat answers finish_reason "tool_calls" with one
                                         tool_calls entry (id "call_<16 hex>") and content null, /v1/messages
                                         answers stop_reason "tool_use" with one tool_use block (id
                                         "toolu_<16 hex>"); max_tokens is not applied to it
  [[sim:bedrock:CLASS]]               -> (Bedrock routes) the error class CLASS (ThrottlingException,
                                         AccessDeniedException, ModelErrorException, ...) with its status
  [[sim:tag:NAME]]                    -> the request is listed under NAME in GET /_sim/timeline's `tags`
                                         (a benchmark tells its kinds of traffic apart); no other effect
Anthropic tool_result blocks count as the text of their content; tool_use blocks add no text.
Control API:
  GET/PUT /_sim/config      read / update any subset of the SimConfig fields (seed re-seeds)
  GET /_sim/stats           total_requests, by_status, by_path, in_flight, max_in_flight, busy_seconds (the sum
                            of every request's time in flight), first_started_at, last_ended_at (epoch seconds)
  GET /_sim/timeline        [started, ended] (epoch seconds) of every request since the last reset, and
                            beside them each one's [[sim:tag:NAME]] (or null)
  POST /_sim/stats/reset    reset the counters, the timeline and the flaky-attempt memory
Run: python -m local.simulated_backend --host 127.0.0.1 --port 8100 [--latency 0.0]
     [--latency-distribution fixed|lognormal|long_tail] [--latency-sigma 0.5] [--rate-429 0]
     [--rate-500 0] [--rate-timeout 0] [--timeout-sleep 30] [--seed 0]   (defaults from SIM_* env vars)
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import binascii
import hashlib
import json
import math
import os
import random
import re
import struct
import time
import uuid
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from functools import cached_property
from itertools import accumulate
from statistics import NormalDist
from typing import Any, Literal

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

MAX_BIG_BYTES = 64 * 1024 * 1024
TIMELINE_MAX = 200_000  # requests whose start and end times GET /_sim/timeline keeps (since the last reset)
EMBEDDING_DIM = 8
_WORDS = ("amber", "basalt", "cedar", "delta", "ember", "fjord", "granite", "harbor",
          "indigo", "juniper", "kestrel", "lagoon", "meadow", "nimbus", "orchid", "quartz")
_MARK_400 = "[[sim:400]]"
_MARK_FAIL = "[[sim:fail-always]]"
_MARK_CONTEXT = "[[sim:context-overflow]]"
SIM_CONTEXT_SIZE = 4096
_ANY_MARK_RE = re.compile(r"\[\[sim:[^\]]*\]\]")
_BIG_RE = re.compile(r"\[\[sim:big:(\d+)\]\]")
_FLAKY_RE = re.compile(r"\[\[sim:flaky:(\d+):(429|500|timeout)\]\]")
_TAG_RE = re.compile(rb"\[\[sim:tag:([A-Za-z0-9_-]{1,64})\]\]")
_TOOL_RE = re.compile(r"\[\[sim:tool:([A-Za-z0-9_-]{1,64})\]\]")  # the tool names both APIs accept
# status -> (OpenAI error type, OpenAI error code, Anthropic error type)
_ERROR_KINDS = {400: ("invalid_request_error", None, "invalid_request_error"),
                500: ("server_error", None, "api_error"),
                429: ("requests", "rate_limit_exceeded", "rate_limit_error"),
                504: ("timeout", "timeout", "timeout_error")}


class SimConfig(BaseModel):
    """Fault settings of the simulated backend."""

    model_config = ConfigDict(extra="forbid")
    latency_seconds: float = Field(0.0, ge=0)
    latency_distribution: Literal["fixed", "lognormal", "long_tail"] = "fixed"
    latency_sigma: float = Field(0.5, ge=0, le=3)
    rate_429: float = Field(0.0, ge=0, le=1)
    rate_500: float = Field(0.0, ge=0, le=1)
    rate_timeout: float = Field(0.0, ge=0, le=1)
    timeout_sleep_seconds: float = Field(30.0, ge=0)
    seed: int = 0
    answer_extra_json: str = ""
    stream_usage: bool = True

    @field_validator("answer_extra_json")
    @classmethod
    def _members(cls, value: str) -> str:
        if value and not isinstance(json.loads("{" + value + "}"), dict):
            raise ValueError("answer_extra_json: JSON object members, such as '\"a\":1.0'")
        return value


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


def _parse_chat(body: Any, max_names: tuple[str, ...] = ("max_completion_tokens", "max_tokens")) -> Prompt:
    model = _base(body, streams=True)
    texts, last_user = _parse_messages(body.get("messages"), "messages")
    if body.get("system"):  # Anthropic Messages: top-level system prompt
        texts = [_text_of(body["system"], "system"), *texts]
    return Prompt(model, texts, last_user, _max_tokens(body, *max_names), len(texts))


def _parse_responses(body: Any) -> Prompt:
    model = _base(body)
    inp = body.get("input")
    inp = [{"role": "user", "content": inp}] if isinstance(inp, str) and inp else inp
    texts, last_user = _parse_messages(inp, "input", require_role=False)
    if isinstance(body.get("instructions"), str):
        texts = [body["instructions"], *texts]
    return Prompt(model, texts, last_user, _max_tokens(body, "max_output_tokens"), len(texts))


def _parse_embeddings(body: Any) -> Prompt:
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
_BEDROCK_BY_STATUS = {400: "ValidationException", 429: "ThrottlingException", 500: "InternalServerException",
                      504: "ModelTimeoutException", 499: "ModelTimeoutException"}
_BEDROCK_RE = re.compile(r"\[\[sim:bedrock:([A-Za-z]{1,64})\]\]")


def _bedrock_invalid(message: str) -> SimError:
    return SimError(400, message, code="ValidationException")


def _converse_texts(blocks: Any, param: str) -> str:
    if not isinstance(blocks, list) or not blocks:
        raise _bedrock_invalid(f"The value at {param} must be a non-empty list of content blocks.")
    texts = []
    for k, block in enumerate(blocks):
        if not isinstance(block, dict) or len(block) != 1:
            raise _bedrock_invalid(f"The content block at {param}.{k} must set exactly one member.")
        if "text" in block:
            if not isinstance(block["text"], str) or not block["text"].strip():
                raise _bedrock_invalid(f"The text field in the ContentBlock object at {param}.{k} is blank. Add "
                                       "text to the text field, and try again.")
            texts.append(block["text"])
        elif "toolResult" in block:  # the tool's answer is text, as for the other routes
            for inner in block["toolResult"].get("content") or []:
                texts.append(inner["text"] if "text" in inner else json.dumps(inner.get("json")))
    return " ".join(texts)


def _parse_converse(body: Any) -> Prompt:
    """A Converse request, checked as Bedrock checks it (roles alternate from a user turn, no blank text, tool
    blocks only with a toolConfig), so a translation that real Bedrock would refuse fails here too."""
    model = body["modelId"]
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise _bedrock_invalid("The messages field must be a non-empty list.")
    texts: list[str] = []
    last_user, previous, tool_blocks = "", None, False
    for i, message in enumerate(messages):
        role = message.get("role") if isinstance(message, dict) else None
        if role not in ("user", "assistant") or (previous is None and role != "user") or role == previous:
            raise _bedrock_invalid("A conversation must start with a user message and alternate between user and "
                                   "assistant roles. Try again with a conversation that alternates.")
        previous = role
        tool_blocks = tool_blocks or any("toolUse" in b or "toolResult" in b for b in message.get("content") or []
                                         if isinstance(b, dict))
        texts.append(_converse_texts(message.get("content"), f"messages.{i}.member.content"))
        if role == "user":
            last_user = texts[-1]
    if tool_blocks and not (body.get("toolConfig") or {}).get("tools"):
        raise _bedrock_invalid("The toolConfig field must be defined when using toolUse and toolResult content "
                               "blocks.")
    system = [b.get("text", "") for b in body.get("system") or [] if isinstance(b, dict)]
    if system:
        texts = [" ".join(system), *texts]
    config = body.get("inferenceConfig") or {}
    max_tokens = config.get("maxTokens")
    if max_tokens is not None and (isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1):
        raise _bedrock_invalid("The maxTokens field must be a positive integer.")
    return Prompt(model, texts, last_user, max_tokens, len(texts))


def _build_converse(p: Prompt, body: dict[str, Any]) -> dict[str, Any]:
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


def _parse_invoke(body: Any) -> Prompt:
    """A Titan text or Cohere embed body."""
    model = body["modelId"]
    if isinstance(body.get("inputText"), str) and body["inputText"]:
        return Prompt(model, [body["inputText"]], body["inputText"])
    texts = body.get("texts")
    if isinstance(texts, list) and texts and all(isinstance(t, str) and t for t in texts):
        if body.get("input_type") not in ("search_document", "search_query", "classification", "clustering"):
            raise _bedrock_invalid("Malformed input request: #: required key [input_type] not found, please "
                                   "reformat your input and try again.")
        return Prompt(model, texts, texts[-1])
    raise _bedrock_invalid("Malformed input request: expected inputText (Titan) or texts (Cohere), please reformat "
                           "your input and try again.")


def _build_invoke(p: Prompt, body: dict[str, Any]) -> dict[str, Any]:
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


def _bedrock_error(err: SimError) -> Response:
    name = err.code if err.code in BEDROCK_ERRORS else _BEDROCK_BY_STATUS.get(err.status, "InternalServerException")
    return JSONResponse({"message": err.message}, status_code=BEDROCK_ERRORS.get(name, err.status),
                        headers={"x-amzn-ErrorType": f"{name}:http://internal.amazon.com/coral/com.amazon.bedrock/"})


def tool_call_of(p: Prompt) -> tuple[str, str, dict[str, str]] | None:
    """(16 hex id, tool name, input) when the prompt's last message holds [[sim:tool:NAME]], else None.
    Only the last message counts, so once the tool's answer is sent back the double answers in text."""
    match = _TOOL_RE.search(p.texts[-1]) if p.texts else None
    if match is None:
        return None
    text, _, _ = generate_answer(p)
    return p.digest.hex()[:16], match.group(1), {"query": text.split()[0]}


def _build_chat(p: Prompt, body: dict[str, Any]) -> dict[str, Any]:
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
    if system:
        cached = sum(len(_text_of(m.get("content"), "messages").split()) + 3 for m in system)
        usage["prompt_tokens_details"] = {"cached_tokens": cached}
    if body.get("reasoning_effort"):
        usage["completion_tokens_details"] = {"reasoning_tokens": n_out // 2}
    return usage


def _build_responses(p: Prompt, body: dict[str, Any]) -> dict[str, Any]:
    text, n_out, cut = generate_answer(p)
    item = {"type": "message", "id": f"msg_{p.digest.hex()[:16]}", "status": "completed", "role": "assistant",
            "content": [{"type": "output_text", "text": text, "annotations": []}]}
    return {"id": f"resp_{p.digest.hex()[:16]}", "object": "response", "created_at": int(time.time()), "model": p.model,
            "status": "incomplete" if cut else "completed", "error": None,
            "incomplete_details": {"reason": "max_output_tokens"} if cut else None, "output": [item],
            "parallel_tool_calls": True, "tool_choice": "auto", "tools": [],
            "usage": {"input_tokens": p.prompt_tokens, "output_tokens": n_out, "total_tokens": p.prompt_tokens + n_out}}


def _build_anthropic(p: Prompt, body: dict[str, Any]) -> dict[str, Any]:
    text, n_out, cut = generate_answer(p)
    content: list[dict[str, Any]] = [{"type": "text", "text": text}]
    stop = "max_tokens" if cut else "end_turn"
    if call := tool_call_of(p):
        call_id, name, tool_input = call
        content = [{"type": "tool_use", "id": f"toolu_{call_id}", "name": name, "input": tool_input}]
        stop, n_out = "tool_use", len(json.dumps(tool_input).split())
    return {"id": f"msg_{p.digest.hex()[:16]}", "type": "message", "role": "assistant", "model": p.model,
            "content": content, "stop_reason": stop,
            "stop_sequence": None, "usage": {"input_tokens": p.prompt_tokens, "output_tokens": n_out}}


def _words(text: str) -> list[str]:
    """The text in deltas of one word each (the space before a word goes with it), joining back to the text."""
    return re.findall(r"\s*\S+", text) or [text]


def _chat_chunks(answer: dict[str, Any], body: dict[str, Any], usage: bool = True) -> Any:
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


def _message_events(answer: dict[str, Any], usage: bool = True) -> Any:
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


def _streamed(answer: dict[str, Any], body: dict[str, Any], flavour: str, usage: bool = True,
              extra: str = "") -> StreamingResponse:
    async def events() -> Any:
        if flavour == "anthropic":
            for name, data in _message_events(answer, usage):
                yield f"event: {name}\ndata: {json.dumps(data)}\n\n"
        else:
            for data in _chat_chunks(answer, body, usage):
                text = json.dumps(data)
                if extra and any(c.get("finish_reason") for c in data["choices"]):  # as llama-server's timings
                    text = text[:-1] + ", " + extra + "}"
                yield f"data: {text}\n\n"
            yield "data: [DONE]\n\n"
    return StreamingResponse(events(), media_type="text/event-stream")


def embedding_vector(model: str, text: str) -> list[float]:
    """Deterministic pseudo-embedding in [-1, 1] of length EMBEDDING_DIM."""
    d = hashlib.sha256(f"{model}\n{text}".encode()).digest()
    return [round(int.from_bytes(d[2 * i: 2 * i + 2], "big") / 32767.5 - 1, 6) for i in range(EMBEDDING_DIM)]


def _build_embeddings(p: Prompt, body: dict[str, Any]) -> dict[str, Any]:
    b64 = body.get("encoding_format") == "base64"
    data = []
    for i, text in enumerate(p.texts):
        vec: Any = embedding_vector(p.model, text)
        if b64:
            vec = base64.b64encode(struct.pack(f"<{len(vec)}f", *vec)).decode()
        data.append({"object": "embedding", "index": i, "embedding": vec})
    usage = {"prompt_tokens": p.prompt_tokens, "total_tokens": p.prompt_tokens}
    return {"object": "list", "data": data, "model": p.model, "usage": usage}


class _SimState:
    def __init__(self, config: SimConfig) -> None:
        self.config = config
        self.rng = random.Random(config.seed)
        self.in_flight = 0
        self.reset()

    def reset(self) -> None:
        self.total = 0
        self.by_status: Counter[str] = Counter()
        self.by_path: Counter[str] = Counter()
        self.max_in_flight = self.in_flight
        self.flaky: dict[str, int] = {}
        self.busy_seconds = 0.0
        self.first_started_at: float | None = None
        self.last_ended_at: float | None = None
        self.timeline: list[tuple[float, float]] = []  # (started, ended) of each request, the last TIMELINE_MAX
        self.tags: list[str | None] = []  # beside each: its [[sim:tag:NAME]]

    def stats(self) -> dict[str, Any]:
        return {"total_requests": self.total, "by_status": dict(sorted(self.by_status.items())),
                "by_path": dict(sorted(self.by_path.items())), "in_flight": self.in_flight,
                "max_in_flight": self.max_in_flight, "busy_seconds": round(self.busy_seconds, 6),
                "first_started_at": self.first_started_at, "last_ended_at": self.last_ended_at}


def _error_response(err: SimError, flavour: str) -> Response:
    if flavour == "bedrock":
        return _bedrock_error(err)
    oa_type, oa_code, an_type = _ERROR_KINDS.get(err.status, ("server_error", None, "api_error"))
    if err.body is not None:
        content = err.body
    elif flavour == "anthropic":
        content: dict[str, Any] = {"type": "error", "error": {"type": an_type, "message": err.message}}
    else:
        content = {"error": {"message": err.message, "type": oa_type, "param": err.param,
                             "code": err.code or oa_code}}
    return JSONResponse(content, status_code=err.status, headers=err.headers)


LONG_TAIL_SHARE, LONG_TAIL_FACTOR = 0.1, 10.0


def latency_of(config: SimConfig, body: dict[str, Any]) -> float:
    """The request's latency: the configured mean, spread by the distribution; the draw comes from a hash of
    the body (not the shared random stream), so it is the same for the same request whoever sends it."""
    mean = config.latency_seconds
    if config.latency_distribution == "fixed" or mean <= 0:
        return mean
    digest = hashlib.sha256(json.dumps(body, sort_keys=True).encode()).digest()
    u = (int.from_bytes(digest[:8], "big") + 0.5) / 2**64  # in (0, 1)
    if config.latency_distribution == "lognormal":  # mu chosen so the mean stays `mean`
        sigma = config.latency_sigma
        return mean * math.exp(sigma * NormalDist().inv_cdf(u) - sigma * sigma / 2)
    base = mean / (1 - LONG_TAIL_SHARE + LONG_TAIL_SHARE * LONG_TAIL_FACTOR)
    return base * (LONG_TAIL_FACTOR if u < LONG_TAIL_SHARE else 1.0)


async def _apply_faults(request: Request, state: _SimState, prompt: Prompt, body: dict[str, Any]) -> None:
    joined = "\n".join(prompt.texts)
    if prompt.model == "reject-me" or _MARK_400 in joined:
        raise SimError(400, "Request rejected by the simulated backend", code="sim_rejected")
    if _MARK_CONTEXT in joined:  # as llama-server answers it
        message = "the request exceeds the available context size, try increasing it"
        raise SimError(400, message, body={"error": {
            "code": 400, "message": message, "type": "exceed_context_size_error",
            "n_prompt_tokens": SIM_CONTEXT_SIZE + prompt.prompt_tokens, "n_ctx": SIM_CONTEXT_SIZE}})
    cfg = state.config
    if cfg.latency_seconds > 0:
        await asyncio.sleep(latency_of(cfg, body))
    if _MARK_FAIL in joined:
        raise SimError(500, "Simulated permanent server error")
    fault = None
    flaky = _FLAKY_RE.search(joined)
    if flaky:
        key = hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()
        attempts = state.flaky[key] = state.flaky.get(key, 0) + 1
        fault = flaky.group(2) if attempts <= int(flaky.group(1)) else None
    draw = state.rng.random()  # always one draw per request, so runs are reproducible
    if fault is None:
        limits = accumulate((cfg.rate_429, cfg.rate_500, cfg.rate_timeout))
        fault = next((f for f, limit in zip(("429", "500", "timeout"), limits, strict=True) if draw < limit), None)
    if fault == "timeout":
        deadline = time.monotonic() + cfg.timeout_sleep_seconds
        while (left := deadline - time.monotonic()) > 0:
            await asyncio.sleep(min(left, 0.2))
            if await request.is_disconnected():  # stop early so in_flight stays truthful
                raise SimError(499, "Client closed the request")
        raise SimError(504, "Simulated upstream timeout")
    if fault in ("429", "500"):
        headers = {"retry-after": "1"} if fault == "429" else None
        raise SimError(int(fault), f"Simulated HTTP {fault} error", headers=headers)


def _endpoint(state: _SimState, parse: Callable[[Any], Prompt], build: Callable[..., dict[str, Any]],
              flavour: str) -> Callable[..., Any]:
    async def handle(request: Request) -> Response:
        try:
            try:
                body = json.loads(await request.body())
            except ValueError:
                raise SimError(400, "We could not parse the JSON body of your request") from None
            if flavour == "bedrock":  # the model is in the path; faults by marker answer as Bedrock's classes
                if not isinstance(body, dict):
                    raise _bedrock_invalid("The request body must be a JSON object.")
                body = {**body, "modelId": request.path_params["model_id"]}
                named = _BEDROCK_RE.search(json.dumps(body))
                if named and named.group(1) in BEDROCK_ERRORS:
                    raise SimError(BEDROCK_ERRORS[named.group(1)], f"Simulated {named.group(1)}", code=named.group(1))
            prompt = parse(body)
            await _apply_faults(request, state, prompt, body)
            if request.url.path.endswith("/converse-stream"):
                frames = converse_events(build(prompt, body), cut="[[sim:cut-stream]]" in "\n".join(prompt.texts))
                return StreamingResponse(iter(frames), media_type="application/vnd.amazon.eventstream")
            if body.get("stream") is True:
                return _streamed(build(prompt, body), body, flavour, state.config.stream_usage,
                                 state.config.answer_extra_json)
            answer = json.dumps(build(prompt, body), ensure_ascii=False, separators=(",", ":"))
            if state.config.answer_extra_json:
                answer = answer[:-1] + "," + state.config.answer_extra_json + "}"
            counted = ({"X-Amzn-Bedrock-Input-Token-Count": str(prompt.prompt_tokens)} if parse is _parse_invoke
                       else None)
            return Response(answer, media_type="application/json", headers=counted)
        except SimError as err:
            return _error_response(err, flavour)

    async def identified(request: Request) -> Response:
        response = await handle(request)
        header = {"anthropic": "request-id", "bedrock": "x-amzn-RequestId"}.get(flavour, "x-request-id")
        response.headers[header] = f"req_sim_{uuid.uuid4().hex}"
        return response

    async def endpoint(request: Request) -> Response:
        state.total += 1
        state.by_path[request.url.path] += 1
        state.in_flight += 1
        state.max_in_flight = max(state.max_in_flight, state.in_flight)
        started = time.time()
        if state.first_started_at is None:
            state.first_started_at = started
        status = 499  # recorded as such if the request is cancelled (client went away)
        tag = _TAG_RE.search(await request.body())
        try:
            response = await identified(request)
            status = response.status_code
            return response
        finally:
            state.in_flight -= 1
            state.by_status[str(status)] += 1
            state.last_ended_at = time.time()
            state.busy_seconds += state.last_ended_at - started
            if len(state.timeline) < TIMELINE_MAX:
                state.timeline.append((started, state.last_ended_at))
                state.tags.append(tag.group(1).decode() if tag else None)

    return endpoint


def create_app(config: SimConfig | None = None) -> FastAPI:
    """Build the simulated backend app; its state is reachable as app.state.sim."""
    app = FastAPI(title="Simulated model backend (test double, not a model)")
    app.state.sim = state = _SimState(config or SimConfig())
    routes: dict[str, tuple[Callable[..., Any], Callable[..., Any], str]] = {
        "/v1/chat/completions": (_parse_chat, _build_chat, "openai"),
        "/v1/embeddings": (_parse_embeddings, _build_embeddings, "openai"),
        "/v1/responses": (_parse_responses, _build_responses, "openai"),
        "/v1/messages": (lambda b: _parse_chat(b, ("max_tokens",)), _build_anthropic, "anthropic"),
        "/model/{model_id:path}/converse": (_parse_converse, _build_converse, "bedrock"),
        "/model/{model_id:path}/invoke": (_parse_invoke, _build_invoke, "bedrock"),
        "/model/{model_id:path}/converse-stream": (_parse_converse, _build_converse, "bedrock"),
    }
    for path, (parse, build, flavour) in routes.items():
        app.add_api_route(path, _endpoint(state, parse, build, flavour), methods=["POST"])

    @app.get("/v1/models")
    async def list_models() -> dict[str, Any]:
        return {"object": "list", "data": []}

    @app.get("/_sim/config")
    async def get_config() -> dict[str, Any]:
        return state.config.model_dump()

    @app.put("/_sim/config")
    async def put_config(request: Request) -> JSONResponse:
        try:
            update = json.loads(await request.body())
            new = SimConfig.model_validate({**state.config.model_dump(), **update})
        except (ValueError, TypeError, ValidationError) as exc:  # TypeError: body is not an object
            return _error_response(SimError(400, str(exc)), "openai")
        if "seed" in update:
            state.rng.seed(new.seed)
        state.config = new
        return JSONResponse(new.model_dump())

    @app.get("/_sim/stats")
    async def get_stats() -> dict[str, Any]:
        return state.stats()

    @app.get("/_sim/timeline")
    async def get_timeline() -> dict[str, Any]:
        return {"requests": [[round(a, 6), round(b, 6)] for a, b in state.timeline], "tags": state.tags}

    @app.post("/_sim/stats/reset")
    async def reset_stats() -> dict[str, Any]:
        state.reset()
        return state.stats()

    return app


_CLI_OPTIONS = (("--latency", "latency_seconds", "SIM_LATENCY_SECONDS", float),
                ("--latency-distribution", "latency_distribution", "SIM_LATENCY_DISTRIBUTION", str),
                ("--latency-sigma", "latency_sigma", "SIM_LATENCY_SIGMA", float),
                ("--rate-429", "rate_429", "SIM_RATE_429", float), ("--rate-500", "rate_500", "SIM_RATE_500", float),
                ("--rate-timeout", "rate_timeout", "SIM_RATE_TIMEOUT", float),
                ("--timeout-sleep", "timeout_sleep_seconds", "SIM_TIMEOUT_SLEEP_SECONDS", float),
                ("--seed", "seed", "SIM_SEED", int))


def main(argv: list[str] | None = None) -> None:
    """CLI entry point; SIM_* environment variables (read only here) provide the option defaults."""
    import uvicorn

    parser = argparse.ArgumentParser(description="Simulated model backend (deterministic test double, not a model)")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8100)
    parser.add_argument("--log-level", default="warning")
    for flag, name, env_var, kind in _CLI_OPTIONS:
        default = kind(os.environ.get(env_var, SimConfig.model_fields[name].default))
        parser.add_argument(flag, dest=name, type=kind, default=default, help=f"default from ${env_var}")
    args = parser.parse_args(argv)
    config = SimConfig(**{name: getattr(args, name) for _, name, _, _ in _CLI_OPTIONS})
    uvicorn.run(create_app(config), host=args.host, port=args.port, log_level=args.log_level)


if __name__ == "__main__":
    main()
