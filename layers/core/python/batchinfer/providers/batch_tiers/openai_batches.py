"""OpenAI's Batch API (the `openai` kind's tier): the input JSONL uploaded to `POST {base_url}/files` (purpose
`batch`), `POST {base_url}/batches` with the job's key in `metadata`, `GET {base_url}/batches/{id}`, its
output and error files read from `GET {base_url}/files/{id}/content` a page of lines at a time, and
`POST {base_url}/batches/{id}/cancel`. One input line per request: its body as it would be sent directly, with
the backend's model name. Contracts: ../shared/reference/provider-batch-contracts.md, section 1."""

from __future__ import annotations

import json

import httpx

from ...catalog import Model
from ...domain import Attempt
from ...jsontext import Text
from ..openai_compat import _usage
from .common import JobView, LineAnswer, Page, TierError

ENDED = ("completed", "failed", "expired", "cancelled")
# What this tier takes (a Messages request for an `openai` model runs directly: its translation is not sent yet).
ENDPOINTS = ("/v1/chat/completions", "/v1/embeddings", "/v1/responses")
JOB_KEY = "batchinfer_job"  # the metadata key that names the service's job on the provider's
TIMEOUT = httpx.Timeout(60.0, connect=10.0)
LIST_PAGES = 20  # pages of 100 batches a lookup reads at most (the newest first): a job is looked up soon after


def _base(model: Model) -> str:
    assert model.backend is not None and model.backend.base_url
    return model.backend.base_url.rstrip("/")


def _headers(api_key: str | None) -> dict[str, str]:
    return {"Authorization": f"Bearer {api_key}"} if api_key else {}


def _call(method: str, url: str, api_key: str | None, **kwargs: object) -> dict:
    try:
        answer = httpx.request(method, url, headers=_headers(api_key), timeout=TIMEOUT, **kwargs)  # type: ignore[arg-type]
    except httpx.HTTPError as error:
        raise TierError(f"{method} {url}: {type(error).__name__}") from error
    if not answer.is_success:
        raise TierError(f"{method} {url}: HTTP {answer.status_code} {answer.text[:300]}")
    try:
        return answer.json()
    except ValueError as error:
        raise TierError(f"{method} {url}: the answer is not JSON") from error


def _view(batch: dict) -> JobView:
    status = str(batch.get("status"))
    errors = (batch.get("errors") or {}).get("data") or []
    return JobView(provider_id=str(batch["id"]), status=status, ended=status in ENDED, failed=status == "failed",
                   output_file=batch.get("output_file_id"), error_file=batch.get("error_file_id"),
                   message="; ".join(str(e.get("message")) for e in errors if isinstance(e, dict)))


def find(model: Model, api_key: str | None, job_key: str) -> JobView | None:
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


def submit(model: Model, api_key: str | None, job_key: str, endpoint: str, lines: list[tuple[str, dict]]) -> JobView:
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


def results(model: Model, api_key: str | None, file_id: str, start: int, limit: int) -> Page:
    """Up to `limit` lines of an output or error file from byte `start` (a page's `next` is the byte after its
    last line), each as the Attempt a direct call would have given. Asked for RANGE_BYTES at a time with a
    `Range` header (a line longer than that: for the rest of the file); a server that sends the whole file
    anyway has the bytes before `start` skipped as they stream, never held."""
    page = _read(model, api_key, file_id, start, limit, start + RANGE_BYTES - 1)
    if not page.answers and page.next is not None:  # one line longer than a range
        page = _read(model, api_key, file_id, start, limit, None)
    return page


RANGE_BYTES = 1 << 20  # what one page asks for at most (a page of 200 typical lines is about 100 KB)


def _read(model: Model, api_key: str | None, file_id: str, start: int, limit: int, last: int | None) -> Page:
    url = f"{_base(model)}/files/{file_id}/content"
    page = Page()
    headers = {**_headers(api_key), "Range": f"bytes={start}-{'' if last is None else last}"}
    try:
        with httpx.stream("GET", url, headers=headers, timeout=TIMEOUT) as answer:
            if answer.status_code == 416:  # nothing from `start` on: the file ended there
                return page
            if not answer.is_success:
                raise TierError(f"GET {url}: HTTP {answer.status_code}")
            at = start if answer.status_code == 206 else 0
            pending = b""
            for chunk in answer.iter_bytes():
                pending += chunk
                while (end := pending.find(b"\n")) != -1:
                    raw, pending = pending[:end + 1], pending[end + 1:]
                    at += len(raw)
                    if at <= start or not raw.strip():
                        continue
                    page.answers.append(_answer(raw.decode()))
                    if len(page.answers) >= limit:
                        page.next = at
                        return page
            ranged = answer.status_code == 206 and last is not None and \
                not answer.headers.get("content-range", "").endswith(f"/{last + 1}")
            if ranged and at > last:  # the range ended mid-file: the next page starts after its last whole line
                page.next = at
            elif pending.strip() and at + len(pending) > start:  # a last line without its newline
                page.answers.append(_answer(pending.decode()))
    except httpx.HTTPError as error:
        raise TierError(f"GET {url}: {type(error).__name__}") from error
    return page


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
    body = Text(body, _body_text(line, body)) if isinstance(body, dict) else None
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


def _body_text(line: str, body: dict) -> str:
    """The body's JSON text as the provider sent it (kept, never re-encoded), found after `"body":` in the
    response; re-encoded only if it cannot be found there."""
    decoder = json.JSONDecoder()
    at = line.find('"response"')
    while (at := line.find('"body"', at + 1)) != -1:
        colon = line.find(":", at + 6)
        start = colon + 1
        while start < len(line) and line[start] in " \t":
            start += 1
        try:
            value, end = decoder.raw_decode(line, start)
        except ValueError:
            continue
        if value == body:
            return line[start:end]
    return json.dumps(body, separators=(",", ":"))
