"""Anthropic-compatible Messages backends (Anthropic's API, or a proxy in front of it): one attempt, one
call, the request sent as it came (Message Batches' `params`, under the batch's `anthropic-version`); or,
for an interactive `stream: true` message, one call whose events are read as they come."""

from __future__ import annotations

from collections.abc import AsyncIterator

import httpx

from ..catalog import Model
from ..domain import Attempt
from .estimate import request_chars, text_chars, tokens
from .http import Events, failed, not_streamed, post_for_events, post_json

DEFAULT_VERSION = "2023-06-01"


def _usage(body: dict) -> tuple[int, int]:
    usage = body.get("usage") or {}
    # Cache writes and reads are input too (priced as input here: the catalog has one input price).
    prompt = sum(int(usage.get(name) or 0) for name in
                 ("input_tokens", "cache_creation_input_tokens", "cache_read_input_tokens"))
    return prompt, int(usage.get("output_tokens") or 0)


def _message(body: object, status: int) -> str:
    if isinstance(body, dict) and isinstance(body.get("error"), dict) and body["error"].get("message"):
        return str(body["error"]["message"])
    return f"The backend answered HTTP {status}."


async def call(model: Model, endpoint: str, body: dict, api_key: str | None, timeout: float,
               version: str | None = None) -> Attempt:
    """Send one Messages request to the model's backend and describe what came back."""
    url, headers = _address(model, endpoint, api_key, version)
    sent = await post_json(url, request_body(model, body), headers, timeout)
    return sent if isinstance(sent, Attempt) else _answered(*sent)


def request_body(model: Model, params: dict) -> dict:
    """What is sent for a Messages request: its params as they came, with the backend's name of the model (a
    direct call and a Message Batches job's `params` alike)."""
    return {**params, "model": model.backend_model}


def headers(api_key: str | None, version: str | None = None) -> dict[str, str]:
    """The headers every call to the backend carries: `anthropic-version` (the batch's, or the default) and
    `x-api-key` when the model has a key."""
    sent = {"anthropic-version": version or DEFAULT_VERSION}
    if api_key:
        sent["x-api-key"] = api_key
    return sent


def _address(model: Model, endpoint: str, api_key: str | None, version: str | None) -> tuple[str, dict[str, str]]:
    assert model.backend is not None
    url = model.backend.base_url.rstrip("/") + endpoint.removeprefix("/v1")
    return url, headers(api_key, version)


def message_attempt(status: int, parsed: object, request_id: str | None) -> Attempt:
    """A 2xx answer as an Attempt: the message with its usage, or a 502 when the body is not a message."""
    if isinstance(parsed, dict) and parsed.get("type") == "message":
        prompt, completion = _usage(parsed)
        cached = int((parsed.get("usage") or {}).get("cache_read_input_tokens") or 0)
        return Attempt(status_code=status, body=parsed, request_id=request_id,
                       input_tokens=prompt, output_tokens=completion, cached_tokens=cached)
    return Attempt(status_code=502, message="The backend answered with a body that is not a message.")


# An error answer's `error.type`, and the HTTP status the API answers it with (Message Batches' `errored`
# results carry only the type: the status is what a direct call would have answered).
ERROR_STATUS = {"invalid_request_error": 400, "authentication_error": 401, "billing_error": 402,
                "permission_error": 403, "not_found_error": 404, "request_too_large": 413,
                "rate_limit_error": 429, "api_error": 500, "timeout_error": 504, "overloaded_error": 529}


def error_message(body: object, status: int) -> str:
    return _message(body, status)


def _answered(answer: httpx.Response, parsed: object) -> Attempt:
    request_id = answer.headers.get("request-id")
    if 200 <= answer.status_code < 300:
        return message_attempt(answer.status_code, parsed, request_id)
    return failed(answer, parsed, request_id, _message(parsed, answer.status_code))


class MessageEvents:
    """A streamed message's events, as the backend sends them (passed on unchanged): input tokens from
    `message_start`, output tokens from `message_delta`, the end at `message_stop`. A backend that reports
    no tokens has them estimated from the request's text and the streamed text."""

    def __init__(self, events: Events, request_chars: int = 0, chars_per_token: float = 4.0) -> None:
        self.events = events
        self.usage: dict = {}
        self.ended = False
        self.request_chars = request_chars
        self.streamed_chars = 0
        self.chars_per_token = chars_per_token

    async def __aiter__(self) -> AsyncIterator[tuple[str, dict]]:
        async for name, data in self.events:
            if not isinstance(data, dict):
                continue
            kind = data.get("type", name)
            if kind == "message_start" and isinstance(data.get("message"), dict):
                self.usage.update(data["message"].get("usage") or {})
            elif kind == "message_delta":
                self.usage.update({k: v for k, v in (data.get("usage") or {}).items() if v is not None})
            elif kind == "message_stop":
                self.ended = True
            elif kind in ("content_block_start", "content_block_delta"):
                self.streamed_chars += text_chars(data.get("content_block") or data.get("delta"))
            yield kind, data

    def outcome(self) -> Attempt:
        status = self.events.response.status_code
        request_id = self.events.response.headers.get("request-id")
        if not self.ended:
            return Attempt(status_code=status, cost_known=False, message="The stream ended before message_stop.")
        if "input_tokens" not in self.usage and "output_tokens" not in self.usage:
            return Attempt(status_code=status, request_id=request_id, usage_estimated=True,
                           input_tokens=tokens(self.request_chars, self.chars_per_token),
                           output_tokens=tokens(self.streamed_chars, self.chars_per_token))
        prompt, completion = _usage({"usage": self.usage})
        return Attempt(status_code=status, request_id=request_id, input_tokens=prompt, output_tokens=completion,
                       cached_tokens=int(self.usage.get("cache_read_input_tokens") or 0))


async def open_message(model: Model, params: dict, api_key: str | None, timeout: float,
                       version: str | None = None) -> MessageEvents | Attempt:
    """Start a streamed message: its events, or the Attempt it gave when it did not stream."""
    url, headers = _address(model, "/v1/messages", api_key, version)
    sent = await post_for_events(url, {**params, "model": model.backend_model, "stream": True}, headers, timeout)
    if isinstance(sent, Events):
        return MessageEvents(sent, request_chars(params), model.estimate_chars_per_token)
    if isinstance(sent, Attempt):
        return sent
    return not_streamed(_answered(*sent))
