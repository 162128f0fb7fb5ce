"""Batches of either kind as batchctl shows them: reading one (`status`) or the newest of both kinds
(`list`), what counts as ended and completed, and how they print. Batch ids (`batch_...`) go to
`/v1/batches`, Message Batch ids (`msgbatch_...`) to `/v1/messages/batches`."""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from urllib.parse import quote

from .api_client import ApiClient, ApiFailure

MESSAGE_BATCH_PREFIX = "msgbatch_"
OPENAI_FINAL = ("completed", "failed", "expired", "cancelled")


def is_message_batch(batch_id: str) -> bool:
    return batch_id.startswith(MESSAGE_BATCH_PREFIX)


def batch_path(batch_id: str) -> str:
    base = "/v1/messages/batches" if is_message_batch(batch_id) else "/v1/batches"
    return f"{base}/{quote(batch_id, safe='')}"


def _epoch(value: object) -> float:
    if isinstance(value, int | float):
        return float(value)
    if isinstance(value, str):  # a Message Batch's RFC 3339 times
        try:
            return dt.datetime.fromisoformat(value).timestamp()
        except ValueError:
            return 0.0
    return 0.0


@dataclass(frozen=True)
class BatchView:
    """Either kind of batch, as the commands show it."""

    id: str
    status: str  # a batch's status; a Message Batch's processing_status
    total: int
    completed: int  # a Message Batch: succeeded
    failed: int  # a Message Batch: errored, canceled and expired
    ended: bool
    completed_ok: bool  # ended as completed (else `wait` exits 3)
    created_at: float
    raw: dict

    @classmethod
    def of(cls, raw: dict) -> BatchView:
        if raw.get("type") == "message_batch":
            counts = raw.get("request_counts") or {}
            total = sum(int(counts.get(k, 0)) for k in ("processing", "succeeded", "errored", "canceled", "expired"))
            ended = raw.get("processing_status") == "ended"
            # Ended after a cancel, or with requests its window ran out on: not completed. Errored requests
            # alone are like failed requests in a completed batch: the batch completed.
            ok = ended and not raw.get("cancel_initiated_at") and not counts.get("expired")
            return cls(raw["id"], raw.get("processing_status", "?"), total, int(counts.get("succeeded", 0)),
                       sum(int(counts.get(k, 0)) for k in ("errored", "canceled", "expired")), ended, ok,
                       _epoch(raw.get("created_at")), raw)
        counts = raw.get("request_counts") or {}
        status = raw.get("status", "?")
        return cls(raw["id"], status, int(counts.get("total", 0)), int(counts.get("completed", 0)),
                   int(counts.get("failed", 0)), status in OPENAI_FINAL, status == "completed",
                   _epoch(raw.get("created_at")), raw)

    def counts_text(self) -> str:
        if self.raw.get("type") == "message_batch":
            c = self.raw.get("request_counts") or {}
            text = (f"{self.total} total, {c.get('succeeded', 0)} succeeded, {c.get('errored', 0)} errored, "
                    f"{c.get('canceled', 0)} canceled, {c.get('expired', 0)} expired")
            return text + (f", {c['processing']} processing" if c.get("processing") else "")
        return f"{self.total} total, {self.completed} completed, {self.failed} failed"

    def summary(self) -> str:
        return f"{self.id} {self.status}: {self.counts_text()}"


def fetch(client: ApiClient, batch_id: str) -> BatchView:
    return BatchView.of(client.get(batch_path(batch_id)))


def _time(epoch: object) -> str:
    if not epoch:
        return "-"
    return dt.datetime.fromtimestamp(_epoch(epoch), dt.UTC).strftime("%Y-%m-%d %H:%M:%SZ")


def describe(view: BatchView) -> str:
    """`status` for a person: the batch and what is known about it, one field a line."""
    raw = view.raw
    rows = [("requests", view.counts_text()), ("priority", raw.get("priority") or "normal")]
    if raw.get("type") == "message_batch":
        rows += [("created", _time(raw.get("created_at"))), ("expires", _time(raw.get("expires_at"))),
                 ("cancel asked", _time(raw.get("cancel_initiated_at"))), ("ended", _time(raw.get("ended_at"))),
                 ("results", raw.get("results_url") or "-")]
    else:
        ended_at = next((raw[f"{s}_at"] for s in OPENAI_FINAL if raw.get(f"{s}_at")), None)
        usage = raw.get("usage") or {}
        rows += [("endpoint", raw.get("endpoint", "-")), ("created", _time(raw.get("created_at"))),
                 ("expires", _time(raw.get("expires_at"))), ("ended", _time(ended_at)),
                 ("input file", raw.get("input_file_id") or "-"), ("output file", raw.get("output_file_id") or "-"),
                 ("error file", raw.get("error_file_id") or "-"),
                 ("usage", f"{usage.get('input_tokens', 0)} input + {usage.get('output_tokens', 0)} output tokens, "
                           f"${float(raw.get('cost_usd') or 0):.6f}"),
                 ("metadata", ", ".join(f"{k}={v}" for k, v in (raw.get("metadata") or {}).items()) or "-")]
        errors = (raw.get("errors") or {}).get("data") or []
        rows += [("error", f"line {e.get('line')}: {e.get('code')}: {e.get('message')}") for e in errors[:5]]
        if raw.get("error"):
            rows.append(("error", f"{raw['error'].get('code')}: {raw['error'].get('message')}"))
    if raw.get("paused_at"):  # an extension of both APIs: it starts no request until resumed
        rows.insert(1, ("paused", f"since {_time(raw['paused_at'])} (batchctl resume {view.id})"))
    width = max(len(k) for k, _ in rows)
    head = f"{view.id}  {view.status}" + (" (paused)" if raw.get("paused_at") else "")
    return "\n".join([head, *(f"  {k:<{width}}  {v}" for k, v in rows)])


def list_batches(client: ApiClient, limit: int) -> tuple[list[BatchView], bool]:
    """The newest `limit` batches of both kinds, newest first, and whether there are more."""
    def collect(path: str, page_max: int, cursor: str) -> tuple[list[dict], bool]:
        items: list[dict] = []
        after = None
        while len(items) < limit:
            page = client.get(path, limit=min(page_max, limit - len(items)), **{cursor: after})
            items += page.get("data") or []
            if not page.get("has_more") or not page.get("data"):
                return items, False
            after = page["data"][-1]["id"]
        return items, True

    batches, more = collect("/v1/batches", 100, "after")
    try:
        messages, more_messages = collect("/v1/messages/batches", 1000, "after_id")
    except ApiFailure as failure:
        if failure.status != 404:  # a service without Message Batches
            raise
        messages, more_messages = [], False
    views = sorted((BatchView.of(b) for b in batches + messages), key=lambda v: (v.created_at, v.id), reverse=True)
    return views[:limit], more or more_messages or len(views) > limit


def batch_table(views: list[BatchView]) -> str:
    rows = [("ID", "STATUS", "REQUESTS", "CREATED")]
    rows += [(v.id, v.status, v.counts_text(), _time(v.created_at)) for v in views]
    widths = [max(len(r[i]) for r in rows) for i in range(3)]
    return "\n".join(f"{r[0]:<{widths[0]}}  {r[1]:<{widths[1]}}  {r[2]:<{widths[2]}}  {r[3]}" for r in rows)

