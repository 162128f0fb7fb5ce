"""`execution` on create (an extension): how each model's part of a batch runs. `direct`: every request one
by one, as always; `provider_batch`: each model's part goes to its provider's batch tier where the catalog
offers one, the part is at least the tier's `min_requests` and the guard's moment (the window's end less the
tier's `guard_seconds`) is still ahead; `auto`: as `provider_batch`, except that a `high` priority batch runs
directly. Absent: each model's catalog `default`."""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass

from ...catalog import Model
from ...errors import InvalidRequest
from ...providers import as_sent
from ...providers.batch_tiers import takes_request, tier_ready, tier_takes
from ...records import BatchItem, Op
from ...records.provider_jobs import ProviderJob
from ...runtime import Services

EXECUTIONS = ("direct", "provider_batch", "auto")


def parse(value: object, param: str = "execution") -> str | None:
    """`execution` as given in a create body (None: absent, each model's default); anything else is a 400."""
    if value is None:
        return None
    if isinstance(value, str) and value in EXECUTIONS:
        return value
    raise InvalidRequest(f"{param} must be one of 'direct', 'provider_batch' or 'auto', not {value!r}.",
                         param=param)


def of(batch: BatchItem | dict) -> str | None:
    """The batch's `execution` as shown: as it was given, or null (each model's catalog default)."""
    return batch.get("execution")


def goes_to_tier(batch: BatchItem | dict, model: Model, count: int, now: int) -> bool:
    """Whether the batch's `count` requests for `model` go to its provider's batch tier."""
    tier = model.provider_batch
    if tier is None or model.backend is None or count < tier.min_requests:
        return False
    if not tier_takes(model, batch["endpoint"]):
        return False
    execution = batch.get("execution") or tier.default
    if execution == "direct" or (execution == "auto" and batch.get("priority") == "high"):
        return False
    return now < int(batch["expires_at"]) - tier.guard_seconds


# Provider jobs one batch plans at most (one transaction writes them with the batch); a part larger than this
# many of its tier's jobs runs its rest directly once they are done.
MAX_PLANNED_JOBS = 20


def plan(svc: Services, batch: BatchItem, lanes: dict[str, int], now: int) -> tuple[set[str], list[Op]]:
    """Which models' parts of a new batch go to their provider's tier (their lanes are not created: the jobs
    take their requests), and the job records to write with the batch, each due at once."""
    held: set[str] = set()
    ops: list[Op] = []
    for model_id, total in lanes.items():
        model = svc.catalog.lookup(model_id)
        if model is None or not goes_to_tier(batch, model, total, now) or not ready(svc, model):
            continue
        tier = model.provider_batch
        assert tier is not None
        held.add(model_id)
        lane_from = 0
        for seq, size in enumerate(job_sizes(total, tier.max_requests)):
            ops.append(ProviderJob.create(svc.table, ProviderJob.new(batch, model_id, seq, lane_from, size, now)))
            lane_from += size
    return held, ops


def job_sizes(total: int, most: int) -> list[int]:
    """How many of a part's `total` requests each of its jobs takes: as few jobs as `most` a job allows, as
    even as can be (so none is left far smaller than the others: a Bedrock job under its 100 records would
    run directly); beyond MAX_PLANNED_JOBS full jobs, the rest runs directly."""
    count = -(-total // most)
    if count > MAX_PLANNED_JOBS:
        return [most] * MAX_PLANNED_JOBS
    base, extra = divmod(total, count)
    return [base + 1] * extra + [base] * (count - extra)


def carried(model: Model, endpoint: str, body: dict) -> tuple[str, dict] | None:
    """(the endpoint, the body) a request goes in a job of the model's tier as, the very request a direct call
    sends; None when the tier does not carry it (its translation refuses it, or the tier's jobs cannot:
    Bedrock's take no tools, nor an embeddings request of several texts), so it runs directly."""
    try:
        sent_endpoint, sent = as_sent(model, endpoint, body)
    except ValueError:
        return None
    return (sent_endpoint, sent) if takes_request(model, sent_endpoint, sent) else None


@dataclass(frozen=True)
class TierRule:
    """For an estimate: `goes(model, count)`, whether a model's part of `count` requests the tier carries
    would go to its tier, and `carries`, which requests those are (the rest run directly)."""

    goes: Callable[[Model, int], bool]

    def carries(self, model: Model, endpoint: str, body: dict) -> bool:
        # A part that cannot go however many it holds (`direct`, the guard's moment passed, ...) is not looked
        # into request by request.
        return model.provider_batch is not None and self.goes(model, sys.maxsize) \
            and carried(model, endpoint, body) is not None


def estimate_rule(svc: Services, endpoint: str, execution: str | None, priority: str, window_seconds: int,
                  capped: bool = False) -> TierRule:
    """For an estimate: which part of a batch created now would go to each model's tier (a capped batch's too:
    its jobs commit their worst case at the tier's price before they are submitted)."""
    now = svc.now()
    batch = {"endpoint": endpoint, "execution": execution, "priority": priority, "expires_at": now + window_seconds}
    return TierRule(lambda model, count: goes_to_tier(batch, model, count, now) and ready(svc, model))


def ready(svc: Services, model: Model) -> bool:
    """Whether this deployment can use the model's tier (Bedrock's needs its service role configured)."""
    return tier_ready(model, svc.settings.bedrock_batch_role_arn)
