"""Providers' own batch tiers (docs/provider-batch.md), by backend kind: each kind is one module offering the
`BatchTier` calls below, so the job runner (`service.offloading.jobs`) never names a provider. `openai`
(OpenAI's Batch API, `openai_batches`), `anthropic` (Message Batches, `anthropic_batches`) and `bedrock`
(Amazon Bedrock's model invocation jobs, `bedrock_jobs`: its input and output in the service's bucket, the
`Staging` the runner hands it).

Beside the calls, a kind's module may say what it takes: `ENDPOINTS` (or `takes_endpoint`, when that depends
on the model: Bedrock's embeddings go on Titan models only), `MIN_REQUESTS` (a job with fewer
runs directly), `takes_request` (a request it cannot carry runs directly), `as_asked` (its answer shown as
a direct call's, when the tier answers in another shape) and `forget` (what a done job kept in the service's
bucket is deleted). `tier_takes` is the endpoint-level check."""

from __future__ import annotations

from typing import Protocol

from ...catalog import CHAT_ENDPOINT, Model
from ...domain import Attempt
from .. import translates
from . import anthropic_batches, bedrock_jobs, openai_batches
from .common import JobView, LineAnswer, Page, Staging, TierError

__all__ = ["BATCH_TIERS", "BatchTier", "JobView", "LineAnswer", "Page", "Staging", "TierError", "as_asked",
           "forget", "min_requests", "takes_request", "tier_of", "tier_ready", "tier_takes", "within_job"]


class BatchTier(Protocol):
    """What a provider's batch tier offers the job runner. `job_key`: the service's own name of the job, carried
    by the provider's job (OpenAI: its metadata; Anthropic: a tag in every `custom_id`) so that it can be found
    again after a worker died mid-create. Every call raises TierError when the provider did not answer it."""

    def find(self, model: Model, api_key: str | None, job_key: str, count: int = 0,
             since: int | None = None) -> JobView | None:
        """The provider's job made for `job_key`, if one was. `count`: the job's requests; `since`: when its
        last create was tried (None: never), for a kind whose jobs carry no key of their own."""
        ...

    def submit(self, model: Model, api_key: str | None, job_key: str, endpoint: str,
               lines: list[tuple[str, dict]], version: str | None = None, staging: Staging | None = None) -> JobView:
        """Make the provider's job; `version`: a Message Batch's `anthropic-version`, for a kind that takes it;
        `staging`: the service's bucket and role, for a kind whose jobs read and write it."""
        ...

    def look(self, model: Model, api_key: str | None, provider_id: str) -> JobView: ...

    def cancel(self, model: Model, api_key: str | None, provider_id: str) -> JobView: ...

    def results(self, model: Model, api_key: str | None, file_id: str, start: int, limit: int,
                staging: Staging | None = None) -> Page:
        """Up to `limit` answers from `start` (the kind's own cursor: a byte offset, a line, a token)."""
        ...


BATCH_TIERS: dict[str, BatchTier] = {"openai": openai_batches, "anthropic": anthropic_batches,  # type: ignore[dict-item]
                                     "bedrock": bedrock_jobs}


def tier_of(model: Model) -> BatchTier:
    """The batch tier client of the model's backend kind (the catalog admits a tier on these kinds only)."""
    assert model.backend is not None
    return BATCH_TIERS[model.backend.kind]


def tier_takes(model: Model, endpoint: str) -> bool:
    """Whether the model's provider batch tier takes requests of `endpoint` (each kind's `ENDPOINTS`), as they
    are or as a direct call translates them (a Messages request to an `openai` model, as a chat completion)."""
    kind = model.backend.kind if model.backend else None
    if kind not in BATCH_TIERS:
        return False
    sent = CHAT_ENDPOINT if translates(model, endpoint) else endpoint
    tier = BATCH_TIERS[kind]
    takes = getattr(tier, "takes_endpoint", None)
    return bool(takes(model, sent)) if takes is not None else sent in getattr(tier, "ENDPOINTS", ())


def min_requests(model: Model) -> int:
    """The fewest requests one job of the model's tier may carry (fewer: they run directly)."""
    return int(getattr(tier_of(model), "MIN_REQUESTS", 1))


def takes_request(model: Model, endpoint: str, body: dict) -> bool:
    """Whether the model's tier carries this request, as it is sent (else it runs directly)."""
    check = getattr(tier_of(model), "takes_request", None)
    return check is None or bool(check(model, endpoint, body))


def within_job(model: Model, endpoint: str, lines: list[tuple[str, dict]]) -> list[tuple[str, dict]]:
    """The lines one job of the model's tier takes, beyond its count of requests (OpenAI's: 50,000 embedding
    inputs); those left out run directly."""
    cut = getattr(tier_of(model), "within_job", None)
    return lines if cut is None else cut(endpoint, lines)


def as_asked(model: Model, endpoint: str, body: dict, attempt: Attempt) -> Attempt:
    """A tier's answer in the shape a direct call shows it, for a kind whose tier answers in another."""
    shown = getattr(tier_of(model), "as_asked", None)
    return attempt if shown is None else shown(model, endpoint, body, attempt)


def tier_ready(model: Model, role_arn: str | None) -> bool:
    """Whether the model's tier can be used with this deployment's settings: a kind whose jobs read and write
    the service's bucket (`STAGED`: Bedrock) needs the service role its provider assumes."""
    kind = model.backend.kind if model.backend else None
    return kind in BATCH_TIERS and (not getattr(BATCH_TIERS[kind], "STAGED", False) or bool(role_arn))


def forget(model: Model, job_key: str, staging: Staging) -> None:
    """Delete what a done job of the model's tier kept in the service's bucket, for a kind that keeps any."""
    drop = getattr(tier_of(model), "forget", None)
    if drop is not None:
        drop(model, job_key, staging)
