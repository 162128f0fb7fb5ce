"""Anthropic's Message Batches (the `anthropic` kind's tier): `POST {base_url}/messages/batches` with one
`{custom_id, params}` per request (`params` exactly as a direct call sends them: `request_body`),
`GET {base_url}/messages/batches/{id}` (`processing_status` in_progress, canceling, ended), `POST
.../{id}/cancel`, and the batch's `results_url` (JSONL) read a page of lines at a time from a byte cursor.
Headers as a direct call's: `x-api-key` and `anthropic-version`. Contracts:
../shared/reference/provider-batch-contracts.md, section 2.

Finding a job again. A MessageBatch has no metadata and its `custom_id`s can only be read once it has ended,
so the job's key is carried two ways:
- every `custom_id` is the job's tag (a hash of its key) and the request's index, `<tag>_<index>`; the tier's
  id of the job (`provider_id`) is the provider's id and the tag, `<msgbatch id>#<tag>`, so a results line of
  any other job is never taken for one of this job's requests;
- the runner records the moment before each create (`since`); `find` lists the newest batches and takes one
  created within the create's reach of that moment that holds the job's number of requests (an ended one is
  confirmed by its first results line's tag). With no create ever tried for the job, nothing is listed.
A batch taken wrongly (another job of the same size made in the same minute, still running) lands nothing:
its lines carry another tag, so this job's requests come back to run directly."""

from __future__ import annotations

import hashlib
import json
from datetime import datetime

from ...catalog import MESSAGES_ENDPOINT, Model
from ...domain import Attempt
from ...jsontext import Text
from ..anthropic import ERROR_STATUS, error_message, message_attempt, request_body
from ..anthropic import headers as anthropic_headers
from .common import JobView, LineAnswer, Page, Staging, call_json
from .jsonl_pages import TIMEOUT as PAGE_TIMEOUT
from .jsonl_pages import read as read_pages
from .jsonl_pages import value_text

ENDPOINTS = (MESSAGES_ENDPOINT,)  # Messages requests only (an `anthropic` backend serves nothing else)
MAX_REQUESTS = 100_000  # requests one Message Batch holds at most (and 256 MB)
TIMEOUT = PAGE_TIMEOUT
LIST_PAGES = 10  # pages of 100 batches a lookup reads at most (the newest first)
# How far from the recorded moment a batch made by that create may carry its `created_at`: the create's whole
# timeout and some clock skew between the service and the provider.
REACH_SECONDS = 120


def tag_of(job_key: str) -> str:
    """The job's tag in its `custom_id`s (`^[a-zA-Z0-9_-]{1,64}$`: 22 characters, the index after it)."""
    return "bi" + hashlib.sha256(job_key.encode()).hexdigest()[:20]


def _base(model: Model) -> str:
    assert model.backend is not None and model.backend.base_url
    return model.backend.base_url.rstrip("/") + "/messages/batches"


def _call(method: str, url: str, api_key: str | None, version: str | None = None, **kwargs: object) -> dict:
    return call_json(method, url, anthropic_headers(api_key, version), TIMEOUT, **kwargs)


def _counts(batch: dict) -> dict[str, int]:
    counts = batch.get("request_counts") or {}
    return {name: int(counts.get(name) or 0) for name in ("processing", "succeeded", "errored", "canceled",
                                                          "expired")}


def _view(batch: dict, tag: str) -> JobView:
    status = str(batch.get("processing_status"))
    ended = status == "ended"
    counts = _counts(batch)
    url = batch.get("results_url")
    # No batch fails as a whole at Anthropic: one where nothing succeeded and every request errored is shown so.
    failed = ended and counts["succeeded"] == 0 and counts["errored"] == sum(counts.values()) > 0
    return JobView(provider_id=f"{batch['id']}#{tag}", status=status, ended=ended, failed=failed,
                   output_file=f"{url}#{tag}" if ended and url else None,
                   message=", ".join(f"{k} {v}" for k, v in counts.items() if v))


def _split(handle: str) -> tuple[str, str]:
    """(the provider's id or results URL, the job's tag) of a `provider_id` or `output_file`."""
    value, _, tag = handle.rpartition("#")
    return value, tag


def _seconds(stamp: object) -> float | None:
    try:
        return datetime.fromisoformat(str(stamp).replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


def find(model: Model, api_key: str | None, job_key: str, count: int = 0, since: int | None = None) -> JobView | None:
    """The provider's job made for `job_key` by a create tried at `since`, if that create made one (see the
    module's docstring); None at once when no create was ever tried."""
    if since is None:
        return None
    tag, after = tag_of(job_key), None
    for _ in range(LIST_PAGES):
        page = _call("GET", _base(model), api_key, params={"limit": 100, **({"after_id": after} if after else {})})
        for batch in page.get("data") or []:
            made = _seconds(batch.get("created_at"))
            if made is None:
                continue
            if made < since - REACH_SECONDS:  # newest first: every later one is older still
                return None
            if made > since + REACH_SECONDS or sum(_counts(batch).values()) != count:
                continue
            view = _view(batch, tag)
            if view.output_file is None or _first_tag(model, api_key, view.output_file) in (tag, None):
                return view
        if not page.get("has_more") or not page.get("last_id"):
            return None
        after = page["last_id"]
    return None


def _first_tag(model: Model, api_key: str | None, output_file: str) -> str | None:
    page = results(model, api_key, output_file.rpartition("#")[0] + "#", 0, 1)
    return page.answers[0].key.rpartition("_")[0] if page.answers else None


def submit(model: Model, api_key: str | None, job_key: str, endpoint: str, lines: list[tuple[str, dict]],
           version: str | None = None, staging: Staging | None = None) -> JobView:
    """Create the Message Batch: one entry per request, `custom_id` the job's tag and the request's key,
    `params` as a direct call sends them, under the batch's `anthropic-version`."""
    tag = tag_of(job_key)
    requests = [{"custom_id": f"{tag}_{key}", "params": request_body(model, body)} for key, body in lines]
    return _view(_call("POST", _base(model), api_key, version, json={"requests": requests}), tag)


def look(model: Model, api_key: str | None, provider_id: str) -> JobView:
    batch_id, tag = _split(provider_id)
    return _view(_call("GET", f"{_base(model)}/{batch_id}", api_key), tag)


def cancel(model: Model, api_key: str | None, provider_id: str) -> JobView:
    batch_id, tag = _split(provider_id)
    return _view(_call("POST", f"{_base(model)}/{batch_id}/cancel", api_key), tag)


def results(model: Model, api_key: str | None, file_id: str, start: int, limit: int,
            staging: Staging | None = None) -> Page:
    """Up to `limit` results lines from byte `start`, each as the Attempt a direct call would have given, its
    key the request's index (a line of another job keeps its whole `custom_id`: the runner passes it over).
    `file_id`: the results URL and the job's tag (an empty tag: every line keeps its whole `custom_id`)."""
    url, tag = _split(file_id)
    return read_pages(url, {**anthropic_headers(api_key), "Accept": "application/binary"}, start, limit,
                            lambda line: _answer(line, tag))


def _answer(line: str, tag: str) -> LineAnswer:
    """One results line: `succeeded` is the message as a direct call's 200; `errored` the error as a direct
    call would have answered it (its HTTP status from its type: invalid_request_error a final 400,
    rate_limit_error, api_error, overloaded_error retryable); `canceled` and `expired` were never run."""
    parsed = json.loads(line)
    custom_id = str(parsed.get("custom_id"))
    prefix, _, index = custom_id.rpartition("_")
    key = index if tag and prefix == tag else custom_id
    result = parsed.get("result") if isinstance(parsed.get("result"), dict) else {}
    kind = result.get("type")
    if kind == "succeeded" and isinstance(result.get("message"), dict):
        message = result["message"]
        return LineAnswer(key, message_attempt(
            200, Text(message, value_text(line, "result", "message", message)), None))
    if kind == "errored" and isinstance(result.get("error"), dict):
        body = result["error"]
        inner = body.get("error") if isinstance(body.get("error"), dict) else {}
        status = ERROR_STATUS.get(str(inner.get("type")), 500)
        return LineAnswer(key, Attempt(status_code=status, body=Text(body, value_text(
            line, "result", "error", body)), request_id=body.get("request_id"),
            message=error_message(body, status)))
    return LineAnswer(key, None)  # canceled, expired (or a result this client does not know): run directly
