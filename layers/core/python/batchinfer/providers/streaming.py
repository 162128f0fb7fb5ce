"""Streamed answers (interactive `stream: true`): a chat completion's chunks relayed as OpenAI sends them, a
message's events as Anthropic sends them, and for a Messages request on an `openai` backend the chat chunks
translated to message events as they come (`messages_to_chat.MessageStream`). Batches never stream.

A stream that breaks off after it started cannot change its status any more: the caller is sent an error
event in its API's shape (OpenAI's `{"error": ...}` data, Anthropic's `event: error`), which both SDKs raise,
and the attempt's cost is unknown (the backend may have run all of it).
"""

from __future__ import annotations

from collections.abc import AsyncIterator

from ..catalog import CHAT_ENDPOINT, MESSAGES_ENDPOINT, Model
from ..domain import Attempt, Relay
from ..jsontext import to_json
from ..messages_to_chat import MessageStream, to_chat
from .anthropic import MessageEvents, open_message
from .bedrock import open_stream as open_converse_stream
from .http import CutOff
from .openai_compat import ChatChunks, open_chat


# An event the backend sent goes on as it sent it (a `Text`: its numbers keep their spelling); one made here
# (translated, or with the usage taken out) is written anew.
def _openai_event(data: object) -> bytes:
    return b"data: " + (data if isinstance(data, str) else to_json(data, ensure_ascii=False)).encode() + b"\n\n"


def _anthropic_event(name: str, data: dict) -> bytes:
    return f"event: {name}\ndata: {to_json(data, ensure_ascii=False)}\n\n".encode()


def _openai_error(message: str) -> bytes:
    return _openai_event({"error": {"message": message, "type": "server_error", "code": "upstream_error"}})


def _anthropic_error(message: str) -> bytes:
    return _anthropic_event("error", {"type": "error", "error": {"type": "api_error", "message": message}})


async def open_stream(model: Model, endpoint: str, body: dict, api_key: str | None, timeout: float,
                      version: str | None = None) -> Relay | Attempt:
    """Start a streamed answer of `endpoint` on the model's backend: the relay, or the Attempt it gave when it
    did not start (an error answer, no answer)."""
    assert model.backend is not None
    if endpoint == CHAT_ENDPOINT and model.backend.kind == "openai":
        chunks = await open_chat(model, body, api_key, timeout)
        if isinstance(chunks, Attempt):
            return chunks
        options = body.get("stream_options")
        with_usage = isinstance(options, dict) and options.get("include_usage") is True
        return Relay(_chat(chunks, with_usage), chunks.outcome, chunks.events.aclose)
    if endpoint == MESSAGES_ENDPOINT and model.backend.kind == "openai":
        try:
            chat = to_chat(body, model.backend.features)
        except ValueError as error:  # intake checks the same rules
            return Attempt(status_code=400, message=str(error))
        chunks = await open_chat(model, chat, api_key, timeout)
        if isinstance(chunks, Attempt):
            return chunks
        translation = MessageStream(str(body.get("model")), body.get("stop_sequences") or ())
        return Relay(_translated(chunks, translation), chunks.outcome, chunks.events.aclose)
    if endpoint in (CHAT_ENDPOINT, MESSAGES_ENDPOINT) and model.backend.kind == "bedrock":  # ConverseStream
        converse = await open_converse_stream(model, endpoint, body, timeout)
        if isinstance(converse, Attempt):
            return converse
        if endpoint == CHAT_ENDPOINT:
            options = body.get("stream_options")
            with_usage = isinstance(options, dict) and options.get("include_usage") is True
            return Relay(_chat(converse, with_usage), converse.outcome, converse.aclose)
        translation = MessageStream(str(body.get("model")), body.get("stop_sequences") or ())
        return Relay(_translated(converse, translation), converse.outcome, converse.aclose)
    if endpoint == MESSAGES_ENDPOINT and model.backend.kind == "anthropic":
        events = await open_message(model, body, api_key, timeout, version)
        if isinstance(events, Attempt):
            return events
        return Relay(_messages(events), events.outcome, events.events.aclose)
    return Attempt(status_code=400, message=f"{endpoint} does not stream on a {model.backend.kind} backend.")


async def _chat(chunks: ChatChunks, with_usage: bool) -> AsyncIterator[bytes]:
    """The chunks as they came, but for the usage the caller did not ask for (the backend is always asked)."""
    try:
        async for chunk in chunks:
            if not with_usage and "usage" in chunk:
                if not chunk.get("choices"):
                    continue
                chunk = {k: v for k, v in chunk.items() if k != "usage"}
            yield _openai_event(chunk)
    except CutOff as error:
        yield _openai_error(str(error))
        return
    yield _openai_event("[DONE]") if chunks.ended else _openai_error("The backend's stream ended early.")


async def _translated(chunks: ChatChunks, translation: MessageStream) -> AsyncIterator[bytes]:
    try:
        async for chunk in chunks:
            for name, data in translation.feed(chunk):
                yield _anthropic_event(name, data)
    except CutOff as error:
        yield _anthropic_error(str(error))
        return
    if not chunks.ended:
        yield _anthropic_error("The backend's stream ended early.")
        return
    for name, data in translation.end():
        yield _anthropic_event(name, data)


async def _messages(events: MessageEvents) -> AsyncIterator[bytes]:
    try:
        async for name, data in events:
            yield _anthropic_event(name, data)
    except CutOff as error:
        yield _anthropic_error(str(error))
        return
    if not events.ended:
        yield _anthropic_error("The backend's stream ended early.")
