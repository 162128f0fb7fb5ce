"""OpenAI's Batch API (the `openai` kind's tier): the input JSONL uploaded to `POST {base_url}/files` (purpose
`batch`), `POST {base_url}/batches` with the job's key in `metadata`, `GET {base_url}/batches/{id}`, its
output and error files read from `GET {base_url}/files/{id}/content` a page of lines at a time, and
`POST {base_url}/batches/{id}/cancel`. One input line per request: its body as it would be sent directly, with
the backend's model name. Contracts: ../shared/reference/provider-batch-contracts.md, section 1."""

from __future__ import annotations

import json

from ...catalog import Model
from ...domain import Attempt
from ...jsontext import Text
from ..openai_compat import _usage
from .common import JobView, LineAnswer, Page, Staging, call_json
from .jsonl_pages import TIMEOUT as PAGE_TIMEOUT
from .jsonl_pages import read as read_pages
from .jsonl_pages import value_text

ENDED = ("completed", "failed", "expired", "cancelled")
# What this tier takes (a Messages request for an `openai` model runs directly: its translation is not sent yet).
ENDPOINTS = ("/v1/chat/completions", "/v1/embeddings", "/v1/responses")
JOB_KEY = "batchinfer_job"  # the metadata key that names the service's job on the provider's
TIMEOUT = PAGE_TIMEOUT
LIST_PAGES = 20  # pages of 100 batches a lookup reads at most (the newest first): a job is looked up soon after
# One embeddings job holds at most this many inputs across its requests (OpenAI refuses more).
MAX_EMBEDDING_INPUTS = 50_000


def embedding_inputs(body: dict) -> int:
    """The inputs an embeddings request counts toward a job's cap: a text or one list of tokens is one input; a
    list of texts or of token lists, one each."""
    given = body.get("input")
    return len(given) if isinstance(given, list) and given and not isinstance(given[0], int) else 1


def within_job(endpoint: str, lines: list[tuple[str, dict]]) -> list[tuple[str, dict]]:
    """The lines one job takes: on `/v1/embeddings` those that fit in `MAX_EMBEDDING_INPUTS`, in order (one that
    does not fit is left out and runs directly); every line on the other endpoints."""
    if endpoint != "/v1/embeddings":
        return lines
    kept, inputs = [], 0
    for key, body in lines:
        counted = embedding_inputs(body)
        if inputs + counted <= MAX_EMBEDDING_INPUTS:
            kept.append((key, body))
            inputs += counted
    return kept


def _base(model: Model) -> str:
    assert model.backend is not None and model.backend.base_url
    return model.backend.base_url.rstrip("/")


def _headers(api_key: str | None) -> dict[str, str]:
    return {"Authorization": f"Bearer {api_key}"} if api_key else {}


def _call(method: str, url: str, api_key: str | None, **kwargs: object) -> dict:
    return call_json(method, url, _headers(api_key), TIMEOUT, **kwargs)


def _view(batch: dict) -> JobView:
    status = str(batch.get("status"))
    errors = (batch.get("errors") or {}).get("data") or []
    return JobView(provider_id=str(batch["id"]), status=status, ended=status in ENDED, failed=status == "failed",
                   output_file=batch.get("output_file_id"), error_file=batch.get("error_file_id"),
                   message="; ".join(str(e.get("message")) for e in errors if isinstance(e, dict)))


def find(model: Model, api_key: str | None, job_key: str, count: int = 0, since: int | None = None) -> JobView | None:
    """The provider's job made for `job_key`, if one was: OpenAI has no idempotency key, so the batches are
    listed (newest first) and matched on their metadata."""
    after = None
    for _ in range(LIST_PAGES):
        page = _call("GET", f"{_base(model)}/batches", api_key,
                     params={"limit": 100, **({"after": after} if after else {})})
        for batch in page.get("data") or []:
            if (batch.get("metadata") or {}).get(JOB_KEY) == job_key:
                return _view(batch)
        if not page.get("has_more") or not page.get("last_id"):
            return None
        after = page["last_id"]
    return None


def submit(model: Model, api_key: str | None, job_key: str, endpoint: str, lines: list[tuple[str, dict]],
           version: str | None = None, staging: Staging | None = None) -> JobView:
    """Upload the input file (one line per request, `custom_id` the service's key of it) and create the job."""
    text = "".join(json.dumps({"custom_id": key, "method": "POST", "url": endpoint,
                               "body": {**body, "model": model.backend_model}}, separators=(",", ":")) + "\n"
                   for key, body in lines)
    uploaded = _call("POST", f"{_base(model)}/files", api_key, data={"purpose": "batch"},
                     files={"file": (f"{job_key}.jsonl", text.encode(), "application/jsonl")})
    created = _call("POST", f"{_base(model)}/batches", api_key,
                    json={"input_file_id": uploaded["id"], "endpoint": endpoint, "completion_window": "24h",
                          "metadata": {JOB_KEY: job_key}})
    return _view(created)


def look(model: Model, api_key: str | None, provider_id: str) -> JobView:
    return _view(_call("GET", f"{_base(model)}/batches/{provider_id}", api_key))


def cancel(model: Model, api_key: str | None, provider_id: str) -> JobView:
    return _view(_call("POST", f"{_base(model)}/batches/{provider_id}/cancel", api_key))


def results(model: Model, api_key: str | None, file_id: str, start: int, limit: int,
            staging: Staging | None = None) -> Page:
    """Up to `limit` lines of an output or error file from byte `start` (a page's `next` is the byte after its
    last line), each as the Attempt a direct call would have given (`jsonl_pages`: a bounded range at a time)."""
    return read_pages(f"{_base(model)}/files/{file_id}/content", _headers(api_key), start, limit, _answer)


def _answer(line: str) -> LineAnswer:
    """One output or error line: `response` with its HTTP status and body (a success, or an error answer the
    endpoint gave), or `error` alone (the provider never ran it: expired, cancelled, ...)."""
    parsed = json.loads(line)
    key = str(parsed.get("custom_id"))
    response = parsed.get("response")
    if not isinstance(response, dict) or not response.get("status_code"):  # status 0 or none: never answered
        return LineAnswer(key, None)
    status = int(response["status_code"])
    body = response.get("body")
    body = Text(body, value_text(line, "response", "body", body)) if isinstance(body, dict) else None
    request_id = response.get("request_id")
    if 200 <= status < 300 and body is not None:
        prompt, completion, cached, reasoning = _usage(body)
        return LineAnswer(key, Attempt(status_code=status, body=body, request_id=request_id, input_tokens=prompt,
                                       output_tokens=completion, cached_tokens=cached, reasoning_tokens=reasoning))
    error = (body or {}).get("error")
    message = str(error.get("message")) if isinstance(error, dict) and error.get("message") else \
        f"The provider's batch answered HTTP {status}."
    return LineAnswer(key, Attempt(status_code=status if status >= 300 else 502, body=body, request_id=request_id,
                                   message=message))
