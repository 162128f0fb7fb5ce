"""The service's HTTP API as batchctl's user commands call it: the one CLI module that touches httpx.

Every error answer becomes an `ApiFailure` with the status and the message of either envelope (OpenAI's
`{"error": {"message", ...}}`, Anthropic's `{"type": "error", "error": {"type", "message"}}`, or API
Gateway's own `{"message"}`); a service that cannot be reached is one too, without a status.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import httpx

ANTHROPIC_VERSION = "2023-06-01"  # what the Message Batch routes require (the 1.x SDKs' version)
MESSAGES_PREFIX = "/v1/messages"
RETRIED_STATUSES = (429, 502, 503, 504)
LOOPBACK = ("127.0.0.1", "localhost", "::1", "[::1]")


class ApiFailure(Exception):
    """An error answer (status, message, code), or no answer at all (status None)."""

    def __init__(self, status: int | None, message: str, code: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.code = code

    def __str__(self) -> str:
        return f"{self.status} {self.message}" if self.status is not None else self.message


@dataclass(frozen=True)
class Reply:
    data: Any
    headers: dict[str, str]


def api_root(base_url: str) -> str:
    """The URL the routes' paths (/v1/...) go after: the base URL given with or without its /v1, as the
    OpenAI SDK's base_url (http://127.0.0.1:8000/v1) or the bare host."""
    root = base_url.strip().rstrip("/")
    return root[:-3] if root.endswith("/v1") else root


def error_of(status: int, body: bytes, reason: str) -> ApiFailure:
    """The failure an error answer describes, in whichever envelope it came."""
    try:
        data = json.loads(body)
    except ValueError:
        data = None
    if isinstance(data, dict):
        inner = data.get("error")
        if isinstance(inner, dict) and isinstance(inner.get("message"), str):  # OpenAI's and Anthropic's
            return ApiFailure(status, inner["message"], inner.get("code") or inner.get("type"))
        if isinstance(data.get("message"), str):  # API Gateway's own answers (413, 429, 5xx before the Lambda)
            return ApiFailure(status, data["message"])
        if isinstance(data.get("detail"), str):
            return ApiFailure(status, data["detail"])
    text = " ".join(body[:300].decode(errors="replace").split())
    return ApiFailure(status, text or reason or "error")


class ApiClient:
    """One connection pool to the service. Reads (GET) are retried on 429/502/503/504, and on connection
    failures once the service has answered at all, a few times with back-off, so a long `wait` survives a
    blip (while a service that is not there is said at once); writes are not (a create retried without an
    Idempotency-Key could make two batches)."""

    def __init__(self, base_url: str, api_key: str, *, timeout: float = 120.0, attempts: int = 4) -> None:
        self.root = api_root(base_url)
        self.attempts = attempts
        self._reached = False
        host = urlsplit(self.root).hostname or ""
        # The local stack is on loopback: a proxy from the environment (HTTP_PROXY without NO_PROXY) would
        # only get in the way there; anywhere else the environment's proxy and CA settings apply.
        self._http = httpx.Client(headers={"Authorization": f"Bearer {api_key}", "User-Agent": "batchctl"},
                                  timeout=httpx.Timeout(timeout, connect=10.0), trust_env=host not in LOOPBACK)

    def __enter__(self) -> ApiClient:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    def close(self) -> None:
        self._http.close()

    def _headers(self, path: str, extra: dict[str, str] | None) -> dict[str, str]:
        headers = {"anthropic-version": ANTHROPIC_VERSION} if path.startswith(MESSAGES_PREFIX) else {}
        return {**headers, **(extra or {})}

    def _unreachable(self, error: Exception) -> ApiFailure:
        reason = str(error) or type(error).__name__
        hint = " (is the local stack running? `make run`)" if urlsplit(self.root).hostname in LOOPBACK else ""
        return ApiFailure(None, f"cannot reach {self.root}: {reason}{hint}")

    def request(self, method: str, path: str, *, json: Any = None, content: bytes | None = None,
                params: dict[str, Any] | None = None, files: dict | None = None, data: dict | None = None,
                headers: dict[str, str] | None = None) -> Reply:
        """One call; the answer's JSON and headers, or ApiFailure. `path` starts with /v1."""
        extra = self._headers(path, headers)
        if content is not None:
            extra.setdefault("Content-Type", "application/json")
        tries = self.attempts if method == "GET" else 1
        for attempt in range(1, tries + 1):
            try:
                answer = self._http.request(method, self.root + path, json=json, content=content, params=params,
                                            files=files, data=data, headers=extra)
            except httpx.HTTPError as error:
                if attempt == tries or not self._reached:
                    raise self._unreachable(error) from None
                time.sleep(min(0.5 * 2 ** attempt, 8.0))
                continue
            self._reached = True
            if answer.status_code in RETRIED_STATUSES and attempt < tries:
                time.sleep(_retry_after(answer.headers.get("retry-after"), attempt))
                continue
            if answer.status_code >= 400:
                raise error_of(answer.status_code, answer.content, answer.reason_phrase)
            try:
                body = answer.json() if answer.content else None
            except ValueError:
                raise ApiFailure(answer.status_code, f"the answer to {method} {path} is not JSON") from None
            return Reply(body, dict(answer.headers))
        raise AssertionError("unreachable")  # the loop returns or raises

    def get(self, path: str, **params: Any) -> Any:
        return self.request("GET", path, params={k: v for k, v in params.items() if v is not None}).data

    def post(self, path: str, body: Any = None, headers: dict[str, str] | None = None) -> Any:
        return self.request("POST", path, json=body, headers=headers).data

    def delete(self, path: str) -> Any:
        return self.request("DELETE", path).data

    def stream_lines(self, path: str) -> Iterator[bytes]:
        """The non-empty lines of a JSONL answer (without their LF), read as they arrive: memory stays flat
        whatever the size. A large result set answers with a redirect to a short-lived storage URL, which
        is followed (httpx drops the Authorization header on the way to another host)."""
        try:
            with self._http.stream("GET", self.root + path, headers=self._headers(path, None),
                                   follow_redirects=True) as answer:
                if answer.status_code >= 400:
                    raise error_of(answer.status_code, answer.read(), answer.reason_phrase)
                pending: list[bytes] = []  # the start of a line that has not ended yet
                for chunk in answer.iter_bytes():
                    *ended, rest = chunk.split(b"\n")
                    for piece in ended:
                        line = b"".join(pending) + piece if pending else piece
                        pending = []
                        if line.strip():
                            yield line
                    if rest:
                        pending.append(rest)
                if pending and (line := b"".join(pending)).strip():
                    yield line
        except httpx.HTTPError as error:
            raise self._unreachable(error) from None


def _retry_after(header: str | None, attempt: int) -> float:
    try:
        return min(max(float(header), 0.0), 30.0) if header else min(0.5 * 2 ** attempt, 8.0)
    except ValueError:
        return min(0.5 * 2 ** attempt, 8.0)
