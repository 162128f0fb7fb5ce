"""OpenAI-compatible backends (vLLM, Ollama, OpenAI, the simulated backend): one attempt, one call."""

from __future__ import annotations

from ..catalog import Model
from ..domain import Attempt
from .http import failed, post_json


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
    assert model.backend is not None
    url = model.backend.base_url.rstrip("/") + endpoint.removeprefix("/v1")
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    payload = {**body, "model": model.backend_model}
    sent = await post_json(url, payload, headers, timeout)
    if isinstance(sent, Attempt):
        return sent
    answer, parsed = sent
    request_id = answer.headers.get("x-request-id")
    if 200 <= answer.status_code < 300 and isinstance(parsed, dict):
        prompt, completion, cached, reasoning = _usage(parsed)
        return Attempt(status_code=answer.status_code, body=parsed, request_id=request_id,
                       input_tokens=prompt, output_tokens=completion, cached_tokens=cached,
                       reasoning_tokens=reasoning)
    if 200 <= answer.status_code < 300:
        return Attempt(status_code=502, message="The backend answered with a body that is not JSON.")
    return failed(answer, parsed, request_id, _message(parsed, answer.status_code))
