"""The OpenAI-shaped batch protocol (`/v1/batches`): create inline or from a file, retrieve, list, results,
export, cancel, delete, and how a batch looks to OpenAI clients. Storage, results and lifecycle are shared
with the other batch APIs (`service.creating.intake`, `service.reading.results`, `service.lifecycle`); this module only
parses and presents.
"""

from __future__ import annotations

from collections.abc import Iterator

from ...domain import FINAL_BATCH
from ...errors import BatchNotFound, Conflict, InvalidRequest, quoted
from ...protocols.openai import PROTOCOL
from ...records import Batch, BatchExtras, BatchItem
from ...runtime import Services
from ...service import lifecycle
from ...service.accounts import Principal
from ...service.background import webhooks
from ...service.creating import forecast, intake
from ...service.creating.validation import (
    ValidatedBatch,
    allowed_endpoints,
    endpoint_problem,
    validate_inline_batch,
    validate_metadata,
)
from ...service.offloading import execution
from ...service.reading import analytics, results
from ...service.reading.listing import owner_page
from ...service.running import batch_usage
from ...service.steering import pausing, priority, retry
from ...spending import parse_cap
from ...storage.dynamo import ConditionFailed
from . import files

IDS = PROTOCOL.batch_ids

BATCH_RUNNING = ("A request of this batch is still running. Cancel the batch, wait for its running requests to "
                 "finish, then delete it.")
NOT_FINISHED = "The batch has not finished; output.jsonl is available once it reaches a final status."


# --- Create ------------------------------------------------------------------------------------------

def create_batch(svc: Services, principal: Principal, raw: bytes, idem_key: str | None) -> tuple[dict, bool]:
    """Create an inline batch. Returns (batch object, created) — created is False for a replay."""
    payload, claim, existing = intake.open_create(svc, principal, raw, idem_key, PROTOCOL)
    if existing:
        return batch_object(existing), False
    batch, extras, admission = _prepared(svc, principal, payload)
    if admission == forecast.REJECT_IF_LATE:  # an extension: 429 when it would be late
        forecast.refuse_if_late(_estimate(svc, principal, batch, extras))
    item, created = intake.store(svc, principal, batch, claim, PROTOCOL, extras)
    return batch_object(item), created


def _prepared(svc: Services, principal: Principal, payload: object) -> tuple[ValidatedBatch, BatchExtras, str]:
    """What create checks of a batch before storing it (an estimate checks the same): the account may
    create one, the body, and its extension fields. Returns the batch, its item's extension fields and its
    admission (an extension: "always" or "reject_if_late"; 400 for any other)."""
    intake.admit(svc, principal)
    file_id = expires_after = None
    if isinstance(payload, dict) and payload.get("input_file_id") is not None:
        batch, file_id, expires_after = _file_batch(svc, principal, payload)
    else:
        batch = validate_inline_batch(svc, principal.account, payload)
    webhook_url = webhooks.batch_webhook_url(svc, principal, payload.get("webhook_url"))
    cap = parse_cap(payload.get("max_cost_usd"))  # an extension: the batch's spending cap
    admission = forecast.parse_admission(payload.get(forecast.ADMISSION_PARAM))
    extras = BatchExtras(priority=priority.parse(payload.get("priority")), webhook_url=webhook_url or None,
                         max_cost_usd=cap, input_file_id=file_id, output_expires_after=expires_after,
                         execution=execution.parse(payload.get("execution")))
    return batch, extras, admission


def _estimate(svc: Services, principal: Principal, batch: ValidatedBatch, extras: BatchExtras) -> dict:
    """The estimate of a checked batch; a file batch's lines are read and checked now, as its validation would."""
    lines = forecast.file_requests(svc, principal, batch.endpoint, extras.input_file_id) \
        if extras.input_file_id else None
    window = batch.window_seconds or svc.settings.batch_completion_window_seconds
    return forecast.estimate(svc, principal, batch, lines, execution.estimate_rule(
        svc, batch.endpoint, extras.execution, extras.priority, window, extras.max_cost_usd is not None))


def estimate_batch(svc: Services, principal: Principal, raw: bytes) -> dict:
    """An estimate (an extension): the create body checked as create checks it, nothing stored."""
    batch, extras, _ = _prepared(svc, principal, intake.parse_json_body(raw))
    intake.check_cap(svc, batch, extras)
    estimate = _estimate(svc, principal, batch, extras)
    intake.check_room(svc, principal, estimate["request_count"])
    return estimate


def _file_batch(svc: Services, principal: Principal, payload: dict) -> tuple[ValidatedBatch, str, int | None]:
    """A batch from an uploaded file, as the OpenAI SDK creates one: the batch, its file's id and its
    output_expires_after (seconds). Only the call is checked here; the file's lines are checked after it
    answers (`intake.validate_file_batch`), before anything runs."""
    files.check_enabled(svc, param="input_file_id")
    if payload.get("requests") is not None:
        raise InvalidRequest("Give either requests (an inline batch) or input_file_id (a batch from a file), "
                             "not both.", param="requests")
    endpoint = payload.get("endpoint")
    problem = endpoint_problem(allowed_endpoints(svc), endpoint, name="endpoint")
    if problem:
        raise InvalidRequest(problem, param="endpoint")
    if payload.get("completion_window") != "24h":
        raise InvalidRequest(f"completion_window must be '24h', not {payload.get('completion_window')!r}.",
                             param="completion_window")
    metadata = validate_metadata(payload.get("metadata"))
    expires_after, seconds = payload.get("output_expires_after"), None
    if expires_after is not None:
        if not isinstance(expires_after, dict):
            raise InvalidRequest("output_expires_after must be an object {anchor, seconds}.",
                                 param="output_expires_after")
        seconds = files.expires_after_seconds(expires_after.get("anchor"), expires_after.get("seconds"),
                                              "output_expires_after")
    file_id = payload["input_file_id"]
    item = files.stored_file(svc, principal.account_id, file_id) if isinstance(file_id, str) else None
    if item is None:
        raise InvalidRequest(f"Invalid 'input_file_id': file {quoted(file_id)} not found.", code="file_not_found",
                             param="input_file_id")
    if item["purpose"] != files.UPLOAD:
        raise InvalidRequest(f"Invalid 'input_file_id': file '{file_id}' has purpose '{item['purpose']}'; a batch "
                             "needs a file uploaded with purpose 'batch'.", code="invalid_file_purpose",
                             param="input_file_id")
    # A file batch's window is always the 24 hours its completion_window says.
    return ValidatedBatch(endpoint=endpoint, requests=[], metadata=metadata, window_seconds=24 * 3600), file_id, seconds


# --- Read --------------------------------------------------------------------------------------------

def batch_object(item: BatchItem) -> dict:
    """The batch as the API shows it (OpenAI's batch object plus the service's own fields)."""
    def at(name: str) -> int | None:
        return item.get(name)

    return {
        "id": item["id"], "object": "batch", "endpoint": item["endpoint"], "model": batch_model(item),
        "errors": item.get("errors"),
        "input_file_id": item.get("input_file_id"), "completion_window": "24h", "status": item["status"],
        "output_file_id": item.get("output_file_id"), "error_file_id": item.get("error_file_id"),
        "created_at": item["created_at"], "in_progress_at": at("in_progress_at"), "expires_at": at("expires_at"),
        "finalizing_at": at("finalizing_at"), "completed_at": at("completed_at"), "failed_at": at("failed_at"),
        "expired_at": at("expired_at"), "cancelling_at": at("cancelling_at"), "cancelled_at": at("cancelled_at"),
        "request_counts": {"total": item["total"], "completed": item.get("completed", 0),
                           "failed": item.get("failed", 0)},
        "metadata": item.get("metadata"),
        **({"webhook_url": item["webhook_url"]} if item.get("webhook_url") else {}),  # only where one was given
        "usage": usage_object(item),
        "cost_usd": batch_usage.cost_of(item),
        "cost_unknown_attempts": item.get("cost_unknown_attempts", 0),
        **({"max_cost_usd": item["max_cost_usd"]} if item.get("max_cost_usd") is not None else {}),  # where one was set
        "results_expires_at": at("results_expires_at"),
        "error": item.get("error"),
        "paused_at": pausing.paused_at(item),  # an extension: null unless the batch is paused
        **({"retry_count": item["retry_count"]} if item.get("retry_count") else {}),  # once retried (an extension)
        "priority": priority.of(item),  # an extension: the batch's priority among its account's batches
        "execution": execution.of(item),  # an extension: how its models' parts run (null: each one's default)
        "saved_usd": batch_usage.saved_of(item),  # an extension: what a provider's batch tier saved
        "analytics": analytics.analytics_of(item),  # an extension: its rates, latencies, attempts, errors
    }


def batch_model(item: BatchItem) -> str | None:
    """The model the batch runs (the catalog id its requests' model named), as OpenAI's batch object has it:
    None while a file batch awaits validation, and for an inline batch over several models (no one model is
    the batch's)."""
    lanes = item.get("lanes") or {}
    return next(iter(lanes)) if len(lanes) == 1 else None


def usage_object(item: BatchItem) -> dict:
    """The batch's tokens (`service.running.batch_usage`, as every batch API shows them)."""
    return batch_usage.usage_of(item)


def owned_batch(svc: Services, principal: Principal, batch_id: str) -> BatchItem:
    item = Batch.get(svc.table, batch_id) if IDS.names(batch_id) else None
    if item is None or item.get("account_id") != principal.account_id or item.get("deleting"):
        raise BatchNotFound(batch_id, param="batch_id")
    return item


def list_batches(svc: Services, principal: Principal, limit: int, after: str | None) -> dict:
    if not 1 <= limit <= 100:
        raise InvalidRequest("limit must be between 1 and 100.", param="limit")
    return owner_page(svc, principal, Batch, ids=IDS, noun="batch", after=after, limit=limit,
                      prefix=PROTOCOL.owner_prefix, newest_first=True, visible=lambda b: not b.get("deleting"),
                      shown=batch_object)


def results_page(svc: Services, principal: Principal, batch_id: str, limit: int, after: str | None) -> dict:
    if not 1 <= limit <= 1000:
        raise InvalidRequest("limit must be between 1 and 1000.", param="limit")
    batch = owned_batch(svc, principal, batch_id)
    start = results.start_after(after)
    end = min(batch["total"], start + limit)
    data = list(results.iter_results(svc, batch, start, end))
    return {"object": "list", "data": data, "has_more": end < batch["total"],
            "first_id": data[0]["id"] if data else None, "last_id": data[-1]["id"] if data else None}


def _finished_batch(svc: Services, principal: Principal, batch_id: str) -> BatchItem:
    batch = owned_batch(svc, principal, batch_id)
    if batch["status"] not in FINAL_BATCH:
        raise Conflict(NOT_FINISHED, code="batch_not_finished")
    return batch


def export_lines(svc: Services, principal: Principal, batch_id: str) -> Iterator[bytes]:
    """output.jsonl: every result, one line each, in submission order; streamed a page at a time."""
    return results.export_stream(svc, _finished_batch(svc, principal, batch_id))


def export_location(svc: Services, principal: Principal, batch_id: str) -> str | None:
    """A short-lived URL of the export written when a large batch ended, or None to stream it instead."""
    return results.export_location(svc, _finished_batch(svc, principal, batch_id))


# --- Cancel and delete -------------------------------------------------------------------------------

def cancel_batch(svc: Services, principal: Principal, batch_id: str) -> dict:
    return batch_object(lifecycle.cancel(svc, owned_batch(svc, principal, batch_id)))


def pause_batch(svc: Services, principal: Principal, batch_id: str) -> dict:
    """Start no more of its requests (running ones finish) until resumed; the window keeps running."""
    return batch_object(pausing.pause(svc, owned_batch(svc, principal, batch_id)))


def resume_batch(svc: Services, principal: Principal, batch_id: str) -> dict:
    return batch_object(pausing.resume(svc, owned_batch(svc, principal, batch_id)))


def set_priority(svc: Services, principal: Principal, batch_id: str, value: str) -> dict:
    """Change a batch's priority among its account's batches while it runs (409 once it has ended)."""
    return batch_object(priority.change(svc, owned_batch(svc, principal, batch_id), value))


def delete_batch(svc: Services, principal: Principal, batch_id: str) -> dict:
    """Answers at once: the batch reads as not found from then on, and the sweeper removes what it holds."""
    batch = owned_batch(svc, principal, batch_id)
    if batch.get("in_flight", 0) > 0:
        raise Conflict(BATCH_RUNNING, code="batch_running")
    try:
        lifecycle.delete(svc, batch)
    except ConditionFailed:
        raise Conflict(BATCH_RUNNING, code="batch_running") from None
    return {"id": batch_id, "object": "batch.deleted", "deleted": True}


# --- Retry in place (an extension) -------------------------------------------------------------------

RETRY_STATUSES = ("failed", "expired", "cancelled")  # as results show them


def retry_batch(svc: Services, principal: Principal, batch_id: str, wanted: dict,
                idem_key: str | None) -> tuple[dict, bool]:
    """Run again the requests of an ended batch that did not succeed (those `wanted` narrows to: custom_ids,
    error_codes, statuses). Returns (batch object, replayed)."""
    batch = owned_batch(svc, principal, batch_id)
    wanted = dict(wanted)
    cap = parse_cap(wanted.pop("max_cost_usd", None))
    item, replayed = retry.retry(svc, principal, batch, retry.filter_of(wanted, {s: s for s in RETRY_STATUSES}),
                                 retry.described(wanted), idem_key, cap)
    return batch_object(item), replayed

