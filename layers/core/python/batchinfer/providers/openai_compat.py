"""OpenAI-compatible backends (vLLM, Ollama, OpenAI, the simulated backend): one attempt, one call; or, for
an interactive `stream: true` chat completion, one call whose chunks are read as they come."""

from __future__ import annotations

from collections.abc import AsyncIterator

import httpx

from ..catalog import Model
from ..domain import Attempt
from .estimate import request_chars, text_chars, tokens
from .http import Events, failed, not_streamed, post_for_events, post_json


def _usage(body: dict) -> tuple[int, int, int, int]:
    """(input, output, cached input, reasoning output) tokens, in the chat/embeddings spelling or the
    Responses one (`input_tokens`, `input_tokens_details`)."""
    usage = body.get("usage") or {}
    prompt = usage.get("prompt_tokens", usage.get("input_tokens", 0)) or 0
    completion = usage.get("completion_tokens", usage.get("output_tokens", 0)) or 0
    cached = (usage.get("prompt_tokens_details") or usage.get("input_tokens_details") or {}).get("cached_tokens")
    reasoning = (usage.get("completion_tokens_details") or usage.get("output_tokens_details") or {}).get(
        "reasoning_tokens")
    return int(prompt), int(completion), int(cached or 0), int(reasoning or 0)


def _message(body: object, status: int) -> str:
    if isinstance(body, dict):
        error = body.get("error")
        if isinstance(error, dict) and error.get("message"):
            return str(error["message"])
        if isinstance(error, str):
            return error
    return f"The backend answered HTTP {status}."


async def call(model: Model, endpoint: str, body: dict, api_key: str | None, timeout: float,
               version: str | None = None) -> Attempt:
    """Send one request to the model's backend and describe what came back."""
    url, headers = _address(model, endpoint, api_key)
    sent = await post_json(url, {**body, "model": model.backend_model}, headers, timeout)
    return sent if isinstance(sent, Attempt) else _answered(*sent)


def _address(model: Model, endpoint: str, api_key: str | None) -> tuple[str, dict[str, str]]:
    assert model.backend is not None
    url = model.backend.base_url.rstrip("/") + endpoint.removeprefix("/v1")
    return url, {"Authorization": f"Bearer {api_key}"} if api_key else {}


def _answered(answer: httpx.Response, parsed: object) -> Attempt:
    request_id = answer.headers.get("x-request-id")
    if 200 <= answer.status_code < 300 and isinstance(parsed, dict):
        prompt, completion, cached, reasoning = _usage(parsed)
        return Attempt(status_code=answer.status_code, body=parsed, request_id=request_id,
                       input_tokens=prompt, output_tokens=completion, cached_tokens=cached,
                       reasoning_tokens=reasoning)
    if 200 <= answer.status_code < 300:
        return Attempt(status_code=502, message="The backend answered with a body that is not JSON.")
    return failed(answer, parsed, request_id, _message(parsed, answer.status_code))


class ChatChunks:
    """A streamed chat completion's chunks, as the backend sends them. The backend is always asked for the
    usage chunk (`stream_options.include_usage`): it is what the answer costs. A backend that sends none
    anyway (llama-cpp-python) has its usage estimated from the request's text and the streamed text."""

    def __init__(self, events: Events, request_chars: int = 0, chars_per_token: float = 4.0) -> None:
        self.events = events
        self.usage: dict | None = None
        self.ended = False  # [DONE] came
        self.request_chars = request_chars
        self.streamed_chars = 0
        self.chars_per_token = chars_per_token

    async def __aiter__(self) -> AsyncIterator[dict]:
        async for _, data in self.events:
            if data == "[DONE]":
                self.ended = True
                return
            if isinstance(data, dict):
                if isinstance(data.get("usage"), dict):
                    self.usage = data["usage"]
                for choice in data.get("choices") or ():
                    if isinstance(choice, dict):
                        self.streamed_chars += text_chars(choice.get("delta"))
                yield data

    def outcome(self) -> Attempt:
        """The attempt the stream added up to: its usage when it ran to its end (estimated when the backend
        reported none), else cost unknown."""
        status = self.events.response.status_code
        request_id = self.events.response.headers.get("x-request-id")
        if not self.ended:
            return Attempt(status_code=status, cost_known=False,
                           message="The stream ended before the backend reported its usage.")
        if self.usage is None:
            return Attempt(status_code=status, request_id=request_id, usage_estimated=True,
                           input_tokens=tokens(self.request_chars, self.chars_per_token),
                           output_tokens=tokens(self.streamed_chars, self.chars_per_token))
        prompt, completion, cached, reasoning = _usage({"usage": self.usage})
        return Attempt(status_code=status, request_id=request_id,
                       input_tokens=prompt, output_tokens=completion, cached_tokens=cached,
                       reasoning_tokens=reasoning)


async def open_chat(model: Model, body: dict, api_key: str | None, timeout: float) -> ChatChunks | Attempt:
    """Start a streamed chat completion: its chunks, or the Attempt it gave when it did not stream."""
    url, headers = _address(model, "/v1/chat/completions", api_key)
    options = body.get("stream_options") if isinstance(body.get("stream_options"), dict) else {}
    payload = {**body, "model": model.backend_model, "stream": True,
               "stream_options": {**options, "include_usage": True}}
    sent = await post_for_events(url, payload, headers, timeout)
    if isinstance(sent, Events):
        return ChatChunks(sent, request_chars(body), model.estimate_chars_per_token)
    if isinstance(sent, Attempt):
        return sent
    return not_streamed(_answered(*sent))
