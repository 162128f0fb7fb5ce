"""A batch's usage fields as every batch API shows them (`usage`, `cost_usd`, `cost_unknown_attempts`), and
the one rounding of a dollar amount every answer uses. The counters are the batch item's (moved by the ledger
as each request's outcome is written); this only presents them."""

from __future__ import annotations

from ...records import BatchItem

USD_DIGITS = 10  # sums of binary floats: a shown amount keeps ten decimals, so 0.1 + 0.2 reads 0.3


def shown_usd(value: object) -> float:
    """A dollar amount as an answer shows it (a batch's, a day's)."""
    return round(float(value or 0), USD_DIGITS)  # type: ignore[arg-type]


def usage_of(item: BatchItem) -> dict:
    """The batch's tokens; with DeepInfra's `input_tokens_details.cached_tokens` and
    `output_tokens_details.reasoning_tokens` once a backend has reported any."""
    usage = {"input_tokens": item.get("input_tokens", 0), "output_tokens": item.get("output_tokens", 0),
             "total_tokens": item.get("input_tokens", 0) + item.get("output_tokens", 0)}
    if "cached_tokens" in item or "reasoning_tokens" in item:
        usage["input_tokens_details"] = {"cached_tokens": item.get("cached_tokens", 0)}
        usage["output_tokens_details"] = {"reasoning_tokens": item.get("reasoning_tokens", 0)}
    return usage


def cost_of(item: BatchItem) -> float:
    """The batch's known cost in USD: what its answered attempts cost at the catalog's prices."""
    return shown_usd(item.get("cost_usd", 0))


def saved_of(item: BatchItem) -> float:
    """What the batch's requests run on a provider's batch tier saved: their cost at the model's price less
    their cost at the tier's (service.offloading)."""
    return shown_usd(item.get("saved_usd", 0))


def usage_fields(item: BatchItem) -> dict:
    """`usage`, `cost_usd` and `cost_unknown_attempts` (attempts whose outcome is unknown: their cost is not in
    `cost_usd`)."""
    return {"usage": usage_of(item), "cost_usd": cost_of(item),
            "cost_unknown_attempts": int(item.get("cost_unknown_attempts", 0))}
