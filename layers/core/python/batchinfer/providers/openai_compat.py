"""OpenAI-compatible backends (vLLM, Ollama, OpenAI, the simulated backend): one attempt, one call."""

from __future__ import annotations

import asyncio

import httpx

from ..catalog import Model
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


def _usage(body: dict) -> tuple[int, int]:
    usage = body.get("usage") or {}
    prompt = usage.get("prompt_tokens", usage.get("input_tokens", 0)) or 0
    completion = usage.get("completion_tokens", usage.get("output_tokens", 0)) or 0
    return int(prompt), int(completion)


def _message(body: object, status: int) -> str:
    if isinstance(body, dict):
        error = body.get("error")
        if isinstance(error, dict) and error.get("message"):
            return str(error["message"])
        if isinstance(error, str):
            return error
    return f"The backend answered HTTP {status}."


async def call(model: Model, endpoint: str, body: dict, api_key: str | None, timeout: float) -> Attempt:
    """Send one request to the model's backend and describe what came back."""
    assert model.backend is not None
    url = model.backend.base_url.rstrip("/") + endpoint.removeprefix("/v1")
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    payload = {**body, "model": model.backend_model}
    try:
        answer = await client_for_loop().post(url, json=payload, headers=headers, timeout=timeout)
    except httpx.TimeoutException:
        return Attempt(status_code=None, cost_known=False, message="The backend did not answer in time.")
    except httpx.TransportError as error:
        # The request may or may not have reached the backend.
        return Attempt(status_code=None, cost_known=False,
                       message=f"Could not reach the backend: {type(error).__name__}")
    try:
        parsed = answer.json()
    except ValueError:
        parsed = None
    request_id = answer.headers.get("x-request-id")
    if 200 <= answer.status_code < 300 and isinstance(parsed, dict):
        prompt, completion = _usage(parsed)
        return Attempt(status_code=answer.status_code, body=parsed, request_id=request_id,
                       input_tokens=prompt, output_tokens=completion)
    if 200 <= answer.status_code < 300:
        return Attempt(status_code=502, message="The backend answered with a body that is not JSON.")
    retry_after = answer.headers.get("retry-after")
    return Attempt(status_code=answer.status_code, body=parsed if isinstance(parsed, dict) else None,
                   request_id=request_id, message=_message(parsed, answer.status_code),
                   retry_after=float(retry_after) if retry_after and retry_after.replace(".", "", 1).isdigit()
                   else None)
