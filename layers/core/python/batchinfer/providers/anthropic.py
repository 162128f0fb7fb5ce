"""Anthropic-compatible Messages backends (Anthropic's API, or a proxy in front of it): one attempt, one
call, the request sent as it came (Message Batches' `params`, under the batch's `anthropic-version`)."""

from __future__ import annotations

from ..catalog import Model
from ..domain import Attempt
from .http import failed, post_json

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
    assert model.backend is not None
    url = model.backend.base_url.rstrip("/") + endpoint.removeprefix("/v1")
    headers = {"anthropic-version": version or DEFAULT_VERSION}
    if api_key:
        headers["x-api-key"] = api_key
    payload = {**body, "model": model.backend_model}
    sent = await post_json(url, payload, headers, timeout)
    if isinstance(sent, Attempt):
        return sent
    answer, parsed = sent
    request_id = answer.headers.get("request-id")
    if 200 <= answer.status_code < 300 and isinstance(parsed, dict) and parsed.get("type") == "message":
        prompt, completion = _usage(parsed)
        cached = int((parsed.get("usage") or {}).get("cache_read_input_tokens") or 0)
        return Attempt(status_code=answer.status_code, body=parsed, request_id=request_id,
                       input_tokens=prompt, output_tokens=completion, cached_tokens=cached)
    if 200 <= answer.status_code < 300:
        return Attempt(status_code=502, message="The backend answered with a body that is not a message.")
    return failed(answer, parsed, request_id, _message(parsed, answer.status_code))
