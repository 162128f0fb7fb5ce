"""The Anthropic Message Batches protocol (`/v1/messages/batches`): create, retrieve, list, results, cancel,
delete, and how a Message Batch looks to Anthropic clients. Storage, scheduling, results and lifecycle are
the other batches' (`service.creating.intake`, `service.reading.results`, `service.lifecycle`): this module
only parses and presents.

What differs from the OpenAI-shaped batches:
- the whole batch is refused (400) only for its shape: the `requests` array, each `custom_id`
  (1-64 of letters, digits, `_`, `-`, unique), the request-count and body-size limits. Each request's
  `params` is then checked on its own, against the rules of the batch's `anthropic-version`; one that cannot
  run as written is stored as an `errored` result at once and joins no lane, while the others run;
- a model on an `openai` backend gets each request translated (`messages_to_chat`); what the translation
  cannot carry makes that request errored, naming the parameter;
- `request_counts` show every request as `processing` until the batch has ended, and `results_url`
  appears only then; results and delete answer 400 before.
"""


from __future__ import annotations

import datetime as dt
import re
from collections.abc import Iterator

from anyio import to_thread

from ...catalog import MESSAGES_ENDPOINT
from ...domain import FINAL_BATCH, BatchStatus, Stop
from ...errors import BatchNotFound, InvalidRequest, PermissionDenied, clipped, quoted
from ...protocols.anthropic import PROTOCOL
from ...records import Batch, BatchExtras, BatchItem
from ...runtime import Services
from ...service import lifecycle
from ...service.accounts import Principal
from ...service.creating import forecast, intake
from ...service.creating.message_params import VERSIONS, ParamsError, params_model
from ...service.creating.validation import (
    RejectedRequest,
    ValidatedBatch,
    ValidRequest,
)
from ...service.offloading import execution
from ...service.reading import analytics, finished_order, results
from ...service.reading.listing import collect_owned
from ...service.running import batch_usage
from ...service.steering import pausing, priority, retry
from ...spending import parse_cap

IDS = PROTOCOL.batch_ids
WINDOW_SECONDS = 24 * 3600  # a Message Batch's completion window is always 24 hours

_CUSTOM_ID = re.compile(r"[A-Za-z0-9_-]{1,64}")

NOT_ENDED = ("Message Batch '{id}' has not ended yet (processing_status '{status}'); {what} once it has "
             "ended. Cancel it to end it sooner.")


# --- Headers -----------------------------------------------------------------------------------------

def check_headers(version: str | None, beta: str | None) -> str:
    """The request's `anthropic-version`, once it is one this service serves; `anthropic-beta` is refused."""
    if beta is not None:
        raise InvalidRequest(f"anthropic-beta: beta features are not available here (got '{beta}'). Remove the "
                             "header (use client.messages.batches, not client.beta.messages.batches).",
                             param="anthropic-beta")
    if version is None:
        raise InvalidRequest("anthropic-version: header is required (one of " + ", ".join(VERSIONS) + ").",
                             param="anthropic-version")
    if version not in VERSIONS:
        raise InvalidRequest(f"anthropic-version: '{version}' is not a version this service serves; use one of "
                             + ", ".join(VERSIONS) + ".", param="anthropic-version")
    return version


# --- Create ------------------------------------------------------------------------------------------

def create(svc: Services, principal: Principal, raw: bytes, idem_key: str | None, version: str
           ) -> tuple[BatchItem, bool]:
    """Create a Message Batch. Returns (batch item, created): created is False for a replay."""
    limits = svc.settings
    if not limits.message_batches_enabled:
        raise PermissionDenied("Message Batches are not enabled.", code="message_batches_disabled")
    payload, claim, existing = intake.open_create(svc, principal, raw, idem_key, PROTOCOL)
    if existing:
        return existing, False
    batch, extra = _prepared(svc, principal, payload, version)
    item, created = intake.store(svc, principal, batch, claim, PROTOCOL, extra)
    if created and not item["lanes"]:  # every request errored at intake: it has ended already
        item = lifecycle.settle_batch(svc, item["id"]) or item
    return item, created


def _prepared(svc: Services, principal: Principal, payload: object, version: str
              ) -> tuple[ValidatedBatch, BatchExtras]:
    """What create checks before storing (an estimate checks the same): the batch and its item's extension
    fields."""
    intake.admit(svc, principal)
    batch = _validated(svc, principal.account, payload, version)
    cap = parse_cap(payload.get("max_cost_usd"))  # an extension: the batch's spending cap
    return batch, BatchExtras(priority=priority.parse(payload.get("priority")), max_cost_usd=cap,
                              protocol_fields=(("anthropic_version", version),),
                              execution=execution.parse(payload.get("execution")))


def estimate(svc: Services, principal: Principal, raw: bytes, version: str) -> dict:
    """An estimate (an extension): the body checked as create checks it (requests that cannot run are
    listed in `rejected`, not refused), nothing stored."""
    if not svc.settings.message_batches_enabled:
        raise PermissionDenied("Message Batches are not enabled.", code="message_batches_disabled")
    batch, extra = _prepared(svc, principal, intake.parse_json_body(raw), version)
    intake.check_cap(svc, batch, extra)
    window = batch.window_seconds or svc.settings.batch_completion_window_seconds
    answer = forecast.estimate(svc, principal, batch, on_tier=execution.estimate_rule(
        svc, batch.endpoint, extra.execution, extra.priority, window, extra.max_cost_usd is not None))
    intake.check_room(svc, principal, answer["request_count"])
    return answer


def _validated(svc: Services, account: dict, payload: object, version: str) -> ValidatedBatch:
    """The batch's shape, checked at once (any fault refuses it), then each request's params on its own."""
    limits = svc.settings
    if not isinstance(payload, dict):
        raise InvalidRequest("The body must be a JSON object with a 'requests' array.")
    extra = sorted(set(payload) - {"requests", "max_cost_usd", "priority", "execution"})  # the last three: extensions
    if extra:
        raise InvalidRequest(f"{clipped(extra[0])}: Extra inputs are not permitted.", param=clipped(extra[0]))
    requests = payload.get("requests")
    if not isinstance(requests, list) or not requests:
        raise InvalidRequest("requests: must be a non-empty array of {custom_id, params}.", param="requests")
    if len(requests) > limits.max_requests_per_batch:
        raise InvalidRequest(f"requests: the batch holds {len(requests)} requests; at most "
                             f"{limits.max_requests_per_batch} are allowed. Split it into several batches.",
                             param="requests")
    seen: set[str] = set()
    for i, req in enumerate(requests):
        where = f"requests[{i}]"
        if not isinstance(req, dict):
            raise InvalidRequest(f"{where}: must be an object {{custom_id, params}}.", param=where)
        custom_id = req.get("custom_id")
        named = f"{where} (custom_id {quoted(custom_id)})" if isinstance(custom_id, str) else where
        extra = sorted(set(req) - {"custom_id", "params"})
        if extra:
            raise InvalidRequest(f"{named}.{clipped(extra[0])}: Extra inputs are not permitted.",
                                 param=f"{where}.{clipped(extra[0])}")
        if not isinstance(custom_id, str) or not _CUSTOM_ID.fullmatch(custom_id):
            raise InvalidRequest(f"{named}.custom_id: must be 1-64 letters, digits, '_' or '-'.",
                                 param=f"{where}.custom_id")
        if custom_id in seen:
            raise InvalidRequest(f"{named}.custom_id: '{custom_id}' is used more than once; each custom_id must be "
                                 "unique within the batch.", param=f"{where}.custom_id")
        seen.add(custom_id)
        if "params" not in req:
            raise InvalidRequest(f"{named}.params: Field required.", param=f"{where}.params")
    checked = [_checked(svc, account, req["custom_id"], req["params"], version) for req in requests]
    return ValidatedBatch(endpoint=MESSAGES_ENDPOINT, requests=checked, metadata=None,
                          status=BatchStatus.IN_PROGRESS, window_seconds=WINDOW_SECONDS)


def _checked(svc: Services, account: dict, custom_id: str, params: object, version: str
             ) -> ValidRequest | RejectedRequest:
    try:
        return ValidRequest(custom_id=custom_id, model_id=params_model(svc, account, params, version), body=params)
    except ParamsError as errored:
        return RejectedRequest(custom_id=custom_id, error=errored.error)


# --- Read --------------------------------------------------------------------------------------------

def _rfc3339(epoch: int | None) -> str | None:
    if epoch is None:
        return None
    return dt.datetime.fromtimestamp(int(epoch), dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def ended(item: BatchItem) -> bool:
    return item["status"] in FINAL_BATCH


def request_counts(item: BatchItem) -> dict:
    """Anthropic's five counters: all `processing` until the batch has ended; then they add up to the total."""
    total = item["total"]
    if not ended(item):
        return {"processing": total, "succeeded": 0, "errored": 0, "canceled": 0, "expired": 0}
    stop = item.get("stop") or item.get("parked")  # parked: never-dispatched ones a retry left as they ended
    unstarted = int(item.get("unstarted", 0))
    canceled = unstarted if stop == Stop.CANCEL.value else 0
    expired = unstarted if stop == Stop.EXPIRE.value else 0
    if (by := item.get("unstarted_by")) is not None:  # a retried batch's runs may have ended differently
        canceled, expired = int(by.get(Stop.CANCEL.value, 0)), int(by.get(Stop.EXPIRE.value, 0))
    succeeded = int(item.get("completed", 0))
    return {"processing": 0, "succeeded": succeeded, "errored": total - succeeded - canceled - expired,
            "canceled": canceled, "expired": expired}


def message_batch_object(item: BatchItem, base_url: str) -> dict:
    """The batch as Anthropic's MessageBatch. `base_url`: where the client reached this API (its results_url
    is on the same host and base path, so the SDK's second request comes back here)."""
    status = item["status"]
    ended_at = next((item[f"{s}_at"] for s in ("completed", "cancelled", "expired", "failed")
                     if item.get(f"{s}_at") is not None), None)
    processing = "ended" if ended(item) else "canceling" if status == BatchStatus.CANCELLING.value else "in_progress"
    return {
        "id": item["id"], "type": "message_batch", "processing_status": processing,
        "request_counts": request_counts(item),
        "ended_at": _rfc3339(ended_at) if ended(item) else None,
        "created_at": _rfc3339(item["created_at"]), "expires_at": _rfc3339(item["expires_at"]),
        "archived_at": None, "cancel_initiated_at": _rfc3339(item.get("cancelling_at")),
        "results_url": f"{base_url}/v1/messages/batches/{item['id']}/results" if ended(item) else None,
        **batch_usage.usage_fields(item),  # an extension: the batch's tokens and known cost so far
        # An extension, on a batch created with a spending cap only: the cap, and `error` once it stopped it.
        **({"max_cost_usd": item["max_cost_usd"], "error": item.get("error")}
           if item.get("max_cost_usd") is not None else {}),
        "paused_at": _rfc3339(pausing.paused_at(item)),  # an extension: null unless the batch is paused
        **({"retry_count": item["retry_count"]} if item.get("retry_count") else {}),  # once retried (an extension)
        "priority": priority.of(item),  # an extension: the batch's priority among its account's batches
        "execution": execution.of(item),  # an extension: how its models' parts run (null: each one's default)
        "saved_usd": batch_usage.saved_of(item),  # an extension: what a provider's batch tier saved
        "analytics": _analytics(item),  # an extension: its rates, latencies, attempts, errors
    }


def _analytics(item: BatchItem) -> dict:
    """The batch's analytics (`service.reading.analytics`) with its times in RFC 3339, as the batch's others."""
    shown = analytics.analytics_of(item)
    return {**shown, "started_at": _rfc3339(shown["started_at"]),
            "last_finished_at": _rfc3339(shown["last_finished_at"])}


def owned(svc: Services, principal: Principal, batch_id: str) -> BatchItem:
    """The caller's Message Batch; any other id (an OpenAI-shaped batch's too) reads as not found."""
    item = Batch.get(svc.table, batch_id) if IDS.names(batch_id) else None
    if item is None or item.get("account_id") != principal.account_id or item.get("deleting"):
        raise BatchNotFound(batch_id, noun="Message Batch")
    return item


def list_page(svc: Services, principal: Principal, limit: int, after_id: str | None, before_id: str | None,
              base_url: str) -> dict:
    """One page of the account's Message Batches, newest first: after `after_id` (older ones) or before
    `before_id` (newer ones, the page nearest to it), as the SDK pages with first_id and last_id."""
    if not 1 <= limit <= 1000:
        raise InvalidRequest("limit: must be between 1 and 1000.", param="limit")
    if after_id and before_id:
        raise InvalidRequest("Give after_id or before_id, not both.", param="before_id")
    anchor_id = after_id or before_id
    start = None
    if anchor_id:
        name = "after_id" if after_id else "before_id"
        anchor = Batch.get(svc.table, anchor_id) if IDS.names(anchor_id) else None
        if anchor is None or anchor.get("account_id") != principal.account_id:
            raise InvalidRequest(f"{name}: no Message Batch found with id {quoted(anchor_id)}.", param=name)
        start = Batch.owner_cursor(anchor)
    newest_first = before_id is None
    items, has_more = collect_owned(
        lambda begin, n: Batch.of_owner(svc.table, principal.account_id, n, begin, newest_first=newest_first,
                                        prefix=PROTOCOL.owner_prefix),
        start, limit, visible=lambda b: not b.get("deleting"))
    if not newest_first:
        items.reverse()  # read oldest first from the anchor; shown newest first like every page
    data = [message_batch_object(i, base_url) for i in items]
    return {"data": data, "has_more": has_more, "first_id": data[0]["id"] if data else None,
            "last_id": data[-1]["id"] if data else None}


def _ended_batch(svc: Services, principal: Principal, batch_id: str, what: str) -> BatchItem:
    item = owned(svc, principal, batch_id)
    if not ended(item):
        processing = message_batch_object(item, "")["processing_status"]
        raise InvalidRequest(NOT_ENDED.format(id=batch_id, status=processing, what=what))
    return item


def results_location(svc: Services, principal: Principal, batch_id: str) -> str | None:
    """A short-lived URL of the results written when a large batch ended, or None to stream them."""
    return results.export_location(svc, _ended_batch(svc, principal, batch_id, "results can be read"))


def results_lines(svc: Services, principal: Principal, batch_id: str) -> Iterator[bytes]:
    """One JSON line per request, in submission order, LF-terminated and none blank."""
    return results.export_stream(svc, _ended_batch(svc, principal, batch_id, "results can be read"))


async def finished_results(svc: Services, principal: Principal, batch_id: str, order: str, after: str | None,
                           limit: int, wait: int | None) -> dict | None:
    """With `order=finished` (an extension beyond the Anthropic API): a JSON page of results lines in the order
    they finished, while the batch runs too; `batch_status` is its processing_status. None for the plain
    results (order=submitted). A page held open (`wait`) waits without holding a thread."""
    if not 1 <= limit <= 1000:
        raise InvalidRequest("limit: must be between 1 and 1000.", param="limit")
    page = await finished_order.results_view_async(svc, lambda: owned(svc, principal, batch_id), limit=limit,
                                                   after=after, order=order, wait=wait, status=None, custom_id=None,
                                         shape=PROTOCOL.export_line)
    if page is None:
        return None
    now = await to_thread.run_sync(Batch.get, svc.table, batch_id)
    return {**page, "batch_status": message_batch_object(now or owned(svc, principal, batch_id), "")[
        "processing_status"]}


# --- Cancel and delete -------------------------------------------------------------------------------

def cancel(svc: Services, principal: Principal, batch_id: str) -> BatchItem:
    """Canceling until its running requests finish, then ended with the unstarted ones canceled."""
    return lifecycle.cancel(svc, owned(svc, principal, batch_id))


def pause(svc: Services, principal: Principal, batch_id: str) -> BatchItem:
    """Start no more of its requests (running ones finish) until resumed; the window keeps running."""
    return pausing.pause(svc, owned(svc, principal, batch_id))


def resume(svc: Services, principal: Principal, batch_id: str) -> BatchItem:
    return pausing.resume(svc, owned(svc, principal, batch_id))


def set_priority(svc: Services, principal: Principal, batch_id: str, value: str) -> BatchItem:
    """Change a Message Batch's priority among its account's batches while it runs (409 once ended)."""
    return priority.change(svc, owned(svc, principal, batch_id), value)


def delete(svc: Services, principal: Principal, batch_id: str) -> dict:
    item = _ended_batch(svc, principal, batch_id, "it can be deleted")
    lifecycle.delete(svc, item)  # at once; the sweeper removes what it holds
    return {"id": batch_id, "type": "message_batch_deleted"}


# --- Retry in place (an extension) -------------------------------------------------------------------

# A Message Batch's result types of requests that did not succeed -> the service's result statuses.
RETRY_STATUSES = {"errored": "failed", "expired": "expired", "canceled": "cancelled"}


def retry_batch(svc: Services, principal: Principal, batch_id: str, wanted: dict,
                idem_key: str | None) -> tuple[BatchItem, bool]:
    """Run again the requests of an ended Message Batch that did not succeed (those `wanted` narrows to).
    Returns (the batch, replayed)."""
    item = owned(svc, principal, batch_id)
    wanted = dict(wanted)
    cap = parse_cap(wanted.pop("max_cost_usd", None))
    return retry.retry(svc, principal, item, retry.filter_of(wanted, RETRY_STATUSES), retry.described(wanted),
                       idem_key, cap)
