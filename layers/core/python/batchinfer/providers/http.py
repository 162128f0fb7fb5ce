"""The HTTP both backend kinds share: one pooled client per event loop, and a POST whose transport failure
is already the Attempt it gave (no connection: it never reached the backend, so it cost nothing; no answer
after it was sent: the backend may have run it, so its cost is unknown); for streamed answers, a POST whose
events are read as they come (`httpx-sse` parses them)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator

import httpx
from httpx_sse import EventSource

from ..domain import Attempt
from ..jsontext import Text, read_object

_clients: dict[int, httpx.AsyncClient] = {}


def client_for_loop() -> httpx.AsyncClient:
    """One pooled client per event loop (the worker runs one loop per invocation)."""
    loop = asyncio.get_running_loop()
    client = _clients.get(id(loop))
    if client is None or client.is_closed:
        _clients.clear()
        # Budgets bound how many calls run at once (an invocation runs up to 10 records of up to 25 requests
        # each, plus what it pulls); the pool must never be what makes a call wait while it holds a slot.
        client = httpx.AsyncClient(limits=httpx.Limits(max_connections=None, max_keepalive_connections=100))
        _clients[id(loop)] = client
    return client


# Failures before the request left: no connection was made (refused, unreachable, TLS failed, none within the
# connect timeout, no pooled connection free in time), or the request was refused before it was written. The
# backend cannot have run it. Anything else (a read or write that failed or timed out, a connection dropped
# mid-answer) may come after the backend got the request.
_UNSENT = (httpx.ConnectError, httpx.ConnectTimeout, httpx.PoolTimeout, httpx.UnsupportedProtocol,
           httpx.ProxyError, httpx.LocalProtocolError)


def _lost(error: Exception) -> Attempt:
    if isinstance(error, _UNSENT):
        return Attempt(status_code=None, sent=False,
                       message=f"Could not connect to the backend ({type(error).__name__}).")
    if isinstance(error, httpx.TimeoutException):
        return Attempt(status_code=None, cost_known=False, message="The backend did not answer in time.")
    # The request may or may not have reached the backend.
    return Attempt(status_code=None, cost_known=False, message=f"Could not reach the backend: {type(error).__name__}")


async def post_json(url: str, payload: dict, headers: dict[str, str], timeout: float
                    ) -> tuple[httpx.Response, object] | Attempt:
    """POST `payload`: (the answer, its JSON object body with the text it came as, or None), or the Attempt a
    transport failure gave."""
    try:
        answer = await client_for_loop().post(url, json=payload, headers=headers, timeout=timeout)
    except httpx.TransportError as error:
        return _lost(error)
    return answer, read_object(answer.content)


class CutOff(Exception):
    """A stream stopped before its end (the connection failed, or an event was not JSON)."""


class Events:
    """A 2xx answer of server-sent events being read: (event name, JSON data or the text `[DONE]`) as each
    arrives. The timeout applies to each read, so a long answer may take as long as it streams."""

    def __init__(self, response: httpx.Response) -> None:
        self.response = response

    async def __aiter__(self) -> AsyncIterator[tuple[str, object]]:
        try:
            async for event in EventSource(self.response).aiter_sse():
                if event.data == "[DONE]":
                    yield event.event, "[DONE]"
                elif event.data:
                    value = json.loads(event.data)  # an object keeps its text, to be passed on as it came
                    yield event.event, Text(value, event.data) if isinstance(value, dict) else value
        except (httpx.HTTPError, ValueError) as error:
            raise CutOff(f"The backend's stream broke off: {type(error).__name__}") from error

    async def aclose(self) -> None:
        await self.response.aclose()


async def post_for_events(url: str, payload: dict, headers: dict[str, str], timeout: float
                          ) -> Events | tuple[httpx.Response, object] | Attempt:
    """POST `payload` asking for a stream: its events, or (the answer, its JSON body or None) when it answered
    otherwise (an error, or a backend that does not stream), or the Attempt a transport failure gave."""
    client = client_for_loop()
    try:
        answer = await client.send(client.build_request("POST", url, json=payload, headers=headers,
                                                        timeout=timeout), stream=True)
    except httpx.TransportError as error:
        return _lost(error)
    if answer.is_success and answer.headers.get("content-type", "").startswith("text/event-stream"):
        return Events(answer)
    try:
        await answer.aread()
    except httpx.TransportError as error:
        return _lost(error)
    finally:
        await answer.aclose()
    return answer, read_object(answer.content)


def failed(answer: httpx.Response, parsed: object, request_id: str | None, message: str) -> Attempt:
    """An error answer: its status, body and message, and its `retry-after` in seconds (an HTTP date is not
    used: the retry policy's own delay applies)."""
    value = answer.headers.get("retry-after")
    return Attempt(status_code=answer.status_code, body=parsed if isinstance(parsed, dict) else None,
                   request_id=request_id, message=message,
                   retry_after=float(value) if value and value.replace(".", "", 1).isdigit() else None)


def not_streamed(attempt: Attempt) -> Attempt:
    """What a stream request that was answered whole gave: its error as it was, or, when it ran (its cost is
    known), a 502: the caller asked for a stream."""
    if not attempt.ok:
        return attempt
    return Attempt(status_code=502, input_tokens=attempt.input_tokens, output_tokens=attempt.output_tokens,
                   message="The backend answered without streaming.")
