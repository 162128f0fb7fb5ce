"""The HTTP both backend kinds share: one pooled client per event loop, and a POST whose transport failure
is already the Attempt it gave (no answer: the backend may have run it, so its cost is unknown)."""

from __future__ import annotations

import asyncio

import httpx

from ..domain import Attempt

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


async def post_json(url: str, payload: dict, headers: dict[str, str], timeout: float
                    ) -> tuple[httpx.Response, object] | Attempt:
    """POST `payload`: (the answer, its JSON body or None), or the Attempt a transport failure gave."""
    try:
        answer = await client_for_loop().post(url, json=payload, headers=headers, timeout=timeout)
    except httpx.TimeoutException:
        return Attempt(status_code=None, cost_known=False, message="The backend did not answer in time.")
    except httpx.TransportError as error:
        # The request may or may not have reached the backend.
        return Attempt(status_code=None, cost_known=False,
                       message=f"Could not reach the backend: {type(error).__name__}")
    try:
        return answer, answer.json()
    except ValueError:
        return answer, None


def failed(answer: httpx.Response, parsed: object, request_id: str | None, message: str) -> Attempt:
    """An error answer: its status, body and message, and its `retry-after` in seconds (an HTTP date is not
    used: the retry policy's own delay applies)."""
    value = answer.headers.get("retry-after")
    return Attempt(status_code=answer.status_code, body=parsed if isinstance(parsed, dict) else None,
                   request_id=request_id, message=message,
                   retry_after=float(value) if value and value.replace(".", "", 1).isdigit() else None)
