"""Providers' own batch tiers (docs/provider-batch.md), by backend kind: each kind is one module offering the
`BatchTier` calls below, so the job runner (`service.offloading.jobs`) never names a provider. `openai`
(OpenAI's Batch API) and `anthropic` (Message Batches); `bedrock` (model invocation jobs) is to implement the
same calls."""

from __future__ import annotations

from typing import Protocol

from ...catalog import CHAT_ENDPOINT, Model
from .. import translates
from . import anthropic_batches, openai_batches
from .common import JobView, LineAnswer, Page, TierError

__all__ = ["BATCH_TIERS", "BatchTier", "JobView", "LineAnswer", "Page", "TierError", "tier_of", "tier_takes"]


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
               lines: list[tuple[str, dict]], version: str | None = None) -> JobView:
        """Make the provider's job; `version`: a Message Batch's `anthropic-version`, for a kind that takes it."""
        ...

    def look(self, model: Model, api_key: str | None, provider_id: str) -> JobView: ...

    def cancel(self, model: Model, api_key: str | None, provider_id: str) -> JobView: ...

    def results(self, model: Model, api_key: str | None, file_id: str, start: int, limit: int) -> Page:
        """Up to `limit` answers from `start` (the kind's own cursor: a byte offset, a line, a token)."""
        ...


BATCH_TIERS: dict[str, BatchTier] = {"openai": openai_batches, "anthropic": anthropic_batches}  # type: ignore[dict-item]


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
    return sent in getattr(BATCH_TIERS[kind], "ENDPOINTS", ())
