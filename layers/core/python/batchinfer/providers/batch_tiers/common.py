"""What every provider's batch tier client answers in: a job as the runner sees it, and a page of answers."""

from __future__ import annotations

from dataclasses import dataclass, field

import httpx

from ...domain import Attempt
from ...storage.blobs import Blobs


class TierError(Exception):
    """A call to a provider's batch API that did not go through (no answer, or an error answer): the job's
    step is tried again at its next look."""


@dataclass(frozen=True)
class JobView:
    """A provider's job: its id; `ended` once it will change no more (completed, failed, expired, cancelled);
    `failed` when it failed as a whole (nothing ran); where its answers are."""

    provider_id: str
    status: str  # the provider's own word for it
    ended: bool
    failed: bool = False
    output_file: str | None = None
    error_file: str | None = None
    message: str = ""


@dataclass(frozen=True)
class Staging:
    """What a kind whose jobs read their input from and write their output to the service's own bucket needs
    (Bedrock's model invocation jobs): the bucket, and the service role the provider assumes to reach it
    (None: not configured; such a kind's parts run directly)."""

    blobs: Blobs
    role_arn: str | None = None


@dataclass(frozen=True)
class LineAnswer:
    """One request's answer in a job's results: `key` is the custom id the service gave it; `attempt` what the
    provider answered (as a direct call's Attempt), or None when the provider never ran it (expired, cancelled)."""

    key: str
    attempt: Attempt | None


@dataclass
class Page:
    """Answers from a cursor; `next` is where the next page starts, None at the file's end."""

    answers: list[LineAnswer] = field(default_factory=list)
    next: int | None = None


def call_json(method: str, url: str, headers: dict[str, str], timeout: float, **kwargs: object) -> dict:
    """One call to a provider's batch API and its JSON answer; TierError when it did not go through (no answer,
    an error answer, or one that is not JSON)."""
    try:
        answer = httpx.request(method, url, headers=headers, timeout=timeout, **kwargs)  # type: ignore[arg-type]
    except httpx.HTTPError as error:
        raise TierError(f"{method} {url}: {type(error).__name__}") from error
    if not answer.is_success:
        raise TierError(f"{method} {url}: HTTP {answer.status_code} {answer.text[:300]}")
    try:
        return answer.json()
    except ValueError as error:
        raise TierError(f"{method} {url}: the answer is not JSON") from error
