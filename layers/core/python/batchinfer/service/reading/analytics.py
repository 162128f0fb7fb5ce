"""A batch's analytics (an extension beyond the OpenAI and Anthropic APIs): how fast it ran, how long its
backend took, how often its attempts failed and why. Every protocol shows the same object on its batch,
with its own times (`analytics_of` gives Unix seconds).

The counters are kept by the writes that already settle a batch's requests (`records.analytics`); this module
reads them. Running time: from `started_at` (when its first requests were dispatched to run) to
`last_finished_at` (when its latest answered attempt was settled), while it runs as once it has ended, so the
object reads the same until the next attempt ends; less the time it did not run within that span: its pauses,
and the time it sat ended before a retry in place. Waits inside a run (backoff before a retry, the account's
daily quota, the model's budget shared with other batches) count: the rates say what the batch delivered,
the latencies what the backend took.
"""

from __future__ import annotations

import math

from ...records import BatchItem, analytics
from ...runtime import Services


def _percentile(latency: dict[int, int], q: float) -> float | None:
    """The nearest-rank percentile of the sketch, as its bucket's middle (within `analytics.RELATIVE_ERROR`)."""
    n = sum(latency.values())
    if n == 0:
        return None
    rank = max(1, math.ceil(q * n))
    seen = 0
    for k in sorted(latency):
        seen += latency[k]
        if seen >= rank:
            return round(analytics.bucket_ms(k), 1)
    return None  # unreachable: the last bucket reaches n


def running_seconds(item: BatchItem, counts: dict) -> int:
    """The batch's running time so far (see the module's description): at least a second once an attempt
    has been answered, since times are whole seconds."""
    started, last = item.get("in_progress_at"), counts["last_finished_at"]
    if started is None or last is None:
        return 0
    idle = counts["idle_seconds"]
    if counts["idle_until"] > last:  # nothing has finished since its latest idle time: that lies past the span
        idle -= counts["idle_last"]
    return max(1, int(last) - int(started) - idle)


def analytics_of(item: BatchItem) -> dict:
    """The analytics object, times in Unix seconds (a protocol turns them into its own)."""
    counts = analytics.stored(item)
    seconds = running_seconds(item, counts)
    latency = counts["latency"]
    return {
        "started_at": item.get("in_progress_at"),
        "last_finished_at": counts["last_finished_at"],
        "running_seconds": seconds,
        "requests_per_minute": round(counts["finished"] * 60 / seconds, 2) if seconds else None,
        "output_tokens_per_second": round(int(item.get("output_tokens", 0)) / seconds, 2) if seconds else None,
        # Backend latency of its answered attempts (an attempt abandoned by a worker that died has none).
        "p50_ms": _percentile(latency, 0.50), "p95_ms": _percentile(latency, 0.95),
        "max_ms": round(analytics.bucket_ms(max(latency)), 1) if latency else None,
        "attempts": counts["attempts"],
        "retries": counts["retries"],
        "errors_by_code": dict(sorted(counts["errors"].items())),
        # Of the input tokens, the share the backend served from its prompt cache (None before any input), and
        # what that saved where the catalog prices cached input lower (`cached_input_per_mtok`).
        "cached_input_share": (round(int(item.get("cached_tokens", 0)) / int(item["input_tokens"]), 4)
                               if item.get("input_tokens") else None),
        "cache_saved_usd": round(float(item.get("cache_saved_usd", 0)), 10),
    }


def after_resume(svc: Services, paused: BatchItem) -> None:
    """A resumed batch's pause, once it had started, is time it did not run. `paused`: the batch as the
    resume read it (still paused)."""
    started, paused_at = paused.get("in_progress_at"), paused.get("paused_at")
    if started is not None and paused_at is not None:
        now = svc.now()
        analytics.add_idle(svc.table, paused["id"], now - max(int(paused_at), int(started)), now)


def after_retry(svc: Services, ended: BatchItem) -> None:
    """A batch retried in place sat ended since its last answered attempt: time it did not run. `ended`: the
    batch as the retry read it."""
    started = ended.get("in_progress_at")
    if started is None:
        return
    last = analytics.stored(ended)["last_finished_at"]
    now = svc.now()
    analytics.add_idle(svc.table, ended["id"], now - int(last if last is not None else started), now)
