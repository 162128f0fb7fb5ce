"""Completion webhooks: the account's registration (`/v1/batch_webhook`), the event a batch's ending
records, and its delivery.

- An ending is announced once: `ending_event` gives the event's put, which `lifecycle` writes in the very
  transaction that gives the batch its final status (so no ending is missed and none is announced twice).
  After that commits, `announce` sends it to the delivery queue; if that send is lost, the sweeper sends it
  again (`relay_due`: pending events are under `by_due` WEBHOOK).
- A delivery (`deliver`, the webhooks function, one queue message) is one fenced attempt: begun by bumping
  the event's `attempt_count`, so a duplicate message cannot make the same attempt twice; its outcome
  recorded on the event; a failure schedules the next attempt with exponential backoff and jitter, up to
  `webhook_max_attempts` in all, by a delayed message. Every attempt carries the same `webhook-id` (the
  event id) and is signed per Standard Webhooks with the account's secret (and, for a while after a
  rotation, with the old one too).
- The URL is checked (`addresses`) at registration and again before each attempt, which connects to the
  address that check approved.

Events name the batch only: nothing of a prompt or a result is in an event, an attempt or a log line.
"""

from __future__ import annotations

import base64
import datetime as dt
import json
import logging
import random
import secrets
import time
from collections.abc import Callable

from standardwebhooks.webhooks import Webhook as Signer

from ... import protocols
from ...addresses import UrlRefused, WebhookTarget, check_url
from ...domain import EVENT_IDS, BatchStatus, new_event_id
from ...errors import Conflict, InvalidRequest, NotFound, clipped, quoted
from ...layout import due_lateness
from ...observability import Bulkhead
from ...providers.webhook import post_event
from ...records import BatchItem, Op, Webhook, WebhookEvent
from ...runtime import Services
from ...scheduling.policy import walk_order
from ...storage.dynamo import ConditionFailed
from ..accounts import Principal

log = logging.getLogger(__name__)
ATTEMPT_ERROR_CHARS = 512  # what an attempt's record keeps of why it failed

DISABLED = "Batch webhooks are not enabled."
NO_WEBHOOK = "No batch webhook is set."
NO_SECRET = ("webhook_url needs the account's signing secret, and this account has no webhook: set one first "
             "with PUT /v1/batch_webhook (its answer shows the secret), then create the batch.")
CLAIM_GRACE_SECONDS = 30  # beyond an attempt's timeout: an attempt begun longer ago than this died


# --- Registration ------------------------------------------------------------------------------------------

def _sealing_context(account_id: str) -> dict[str, str]:
    return {"account_id": account_id, "purpose": "batch-webhook-secret"}


def _new_secret() -> str:
    return "whsec_" + base64.b64encode(secrets.token_bytes(24)).decode()


def check_target(svc: Services, url: object, param: str = "url") -> WebhookTarget:
    """The URL checked as a webhook target, or a 400 naming the parameter and the fault."""
    try:
        return check_url(url, allow_loopback=svc.settings.webhook_allow_loopback, resolve=svc.resolve)
    except UrlRefused as refused:
        raise InvalidRequest(f"Invalid '{param}': {refused}.", code="invalid_webhook_url", param=param) from None


def webhook_object(item: dict, secret: str | None = None) -> dict:
    body = {"object": "batch_webhook", "url": item["url"], "created_at": item["created_at"],
            "updated_at": item["updated_at"], "secret_created_at": item["secret_created_at"]}
    if secret is not None:
        body["secret"] = secret  # shown only when it is new
    return body


def set_webhook(svc: Services, principal: Principal, url: str, rotate_secret: bool) -> dict:
    """Set (or change) the account's webhook. A new secret is shown once: on the first PUT, and on rotation."""
    if not svc.settings.batch_webhooks_enabled:
        raise InvalidRequest(DISABLED, code="webhooks_disabled")
    check_target(svc, url)
    existing = Webhook.get(svc.table, principal.account_id)
    now = svc.now()
    context = _sealing_context(principal.account_id)
    fields = {"url": url, "updated_at": now}
    secret = None
    if existing is None or rotate_secret:
        secret = _new_secret()
        fields.update(secret=svc.secret_box.seal(secret, context), secret_created_at=now,
                      created_at=existing["created_at"] if existing else now)
        if existing is not None:  # the old secret signs beside the new one for a while, so receivers can switch
            fields.update(previous=existing["secret"], previous_until=now + svc.settings.webhook_secret_overlap_seconds)
    else:
        fields.update({k: existing[k] for k in ("secret", "secret_created_at", "created_at", "previous",
                                                "previous_until") if k in existing})
    try:
        Webhook.put(svc.table, principal.account_id, fields, existing)
    except ConditionFailed:
        raise Conflict("The webhook was changed by another request at the same time; try again.",
                       code="webhook_changed") from None
    return webhook_object({**fields}, secret)


def get_webhook(svc: Services, principal: Principal) -> dict:
    item = Webhook.get(svc.table, principal.account_id)
    if item is None:
        raise NotFound(NO_WEBHOOK, code="webhook_not_found")
    return webhook_object(item)


def delete_webhook(svc: Services, principal: Principal) -> dict:
    """Remove the webhook and its secret: events not yet delivered are skipped from then on."""
    item = Webhook.delete(svc.table, principal.account_id)
    if item is None:
        raise NotFound(NO_WEBHOOK, code="webhook_not_found")
    return {"object": "batch_webhook.deleted", "url": item["url"], "deleted": True}


def batch_webhook_url(svc: Services, principal: Principal, url: object) -> str | None:
    """A batch's own `webhook_url` (inline and file batches), checked as the account's is, signed with the
    account's secret: refused while the account has none."""
    if url is None:
        return None
    if not svc.settings.batch_webhooks_enabled:
        raise InvalidRequest(DISABLED, code="webhooks_disabled", param="webhook_url")
    check_target(svc, url, param="webhook_url")
    if Webhook.get(svc.table, principal.account_id) is None:
        raise InvalidRequest(NO_SECRET, code="webhook_secret_missing", param="webhook_url")
    return url  # type: ignore[return-value]


# --- Events --------------------------------------------------------------------------------------------

def event_type(batch: BatchItem, final: BatchStatus) -> str:
    """The event this ending announces: its batch's protocol names it."""
    return protocols.of_batch_id(batch["id"]).ending_event(final)


def ending_event(svc: Services, batch: BatchItem, final: BatchStatus) -> dict | None:
    """The event announcing this ending, to be put in the transaction that ends the batch; None when
    nobody is to be told (webhooks off, or neither the batch nor its account has a webhook)."""
    if not svc.settings.batch_webhooks_enabled:
        return None
    if not batch.get("webhook_url") and Webhook.get(svc.table, batch["account_id"]) is None:
        return None
    now = svc.now()
    return WebhookEvent.new(event_id=new_event_id(svc.clock()), account_id=batch["account_id"],
                            event_type=event_type(batch, final), batch_id=batch["id"], url=batch.get("webhook_url"),
                            now=now, relay_at=now + svc.settings.webhook_relay_seconds,
                            keep_until=now + svc.settings.webhook_event_retention_seconds)


def event_put(svc: Services, event: dict) -> Op:
    return WebhookEvent.create(svc.table, event)


def _message(event: dict) -> dict:
    return {"pk": event["pk"], "sk": event["sk"]}


def announce(svc: Services, event: dict | None) -> None:
    """After the ending committed: queue its first delivery. A lost send is not lost: the sweeper resends."""
    if event is None:
        return
    try:
        svc.queues.send_webhook(_message(event))
    except Exception as error:  # the event is recorded; relay_due sends it once its relay time comes
        log.warning("webhook event %s not queued (%s); the sweeper will", event["id"], type(error).__name__)


def relay_due(svc: Services, limit: int = 50, deadline: float | None = None,
              overdue: Callable[[int], None] | None = None) -> int:
    """Send again the pending events nobody has heard of for a while (a lost message, a delivery that died);
    none after `deadline` (time.monotonic()): those stay due for the next run. `overdue` hears how many seconds
    past its relay time the most overdue of them is."""
    now = svc.now()
    sent = 0
    due = WebhookEvent.due(svc.table, now, limit)
    if overdue:
        overdue(due_lateness(due, now))
    turn = svc.last_ran.get("relay_turn", now) + 1
    svc.last_ran["relay_turn"] = turn
    for item in walk_order(due, _event_key, svc.failed_last, turn):
        if deadline is not None and time.monotonic() >= deadline:
            break
        # One event whose relay raises is logged, counted and passed over (taken last next time); it stays
        # due, so a later run sends it again.
        with Bulkhead("webhook relay", _event_key(item), "relay", svc.failed_last):
            try:
                WebhookEvent.relayed(svc.table, item, now + svc.settings.webhook_relay_seconds)
            except ConditionFailed:
                continue  # another sweeper, or the delivery itself, moved it on
            svc.queues.send_webhook(_message(item))
            sent += 1
    return sent


def _event_key(item: dict) -> str:
    return f"{item['pk']}|{item['sk']}"


def event_body(event: dict) -> str:
    return json.dumps({"id": event["id"], "object": "event", "type": event["type"],
                       "created_at": event["created_at"], "data": {"id": event["batch_id"]}}, separators=(",", ":"))


def event_object(event: dict) -> dict:
    """An event as `GET /v1/batch_webhook/events` lists it: the body that is sent, and its delivery."""
    return {**json.loads(event_body(event)),
            "delivery": {"status": event["status"], "attempts": event.get("attempts", []),
                         "next_attempt_at": event.get("next_attempt_at") if event["status"] == "pending" else None,
                         **({"reason": event["skipped_reason"]} if event.get("skipped_reason") else {})}}


def events_page(svc: Services, principal: Principal, limit: int, after: str | None) -> dict:
    if not 1 <= limit <= 100:
        raise InvalidRequest("limit must be between 1 and 100.", param="limit")
    if after is not None and not EVENT_IDS.names(after):  # a cursor: any event id, listed or not
        raise InvalidRequest(f"after must be an event id such as evt_..., not {quoted(after)}.", param="after")
    items, more = WebhookEvent.of_account(svc.table, principal.account_id, limit, after)
    data = [event_object(item) for item in items]
    return {"object": "list", "data": data, "first_id": data[0]["id"] if data else None,
            "last_id": data[-1]["id"] if data else None, "has_more": more}


# --- Delivery --------------------------------------------------------------------------------------------

def signature(secret: str, event_id: str, timestamp: int, body: str) -> str:
    """`webhook-signature`: `v1,<base64 HMAC-SHA256 of id.timestamp.body>` (Standard Webhooks)."""
    return Signer(secret).sign(event_id, dt.datetime.fromtimestamp(timestamp, dt.UTC), body)


def backoff_seconds(svc: Services, attempts_made: int) -> float:
    """The wait before the next attempt: the base doubled per attempt made, +-20% jitter so that the
    receivers of many events do not get them back all at once."""
    return svc.settings.webhook_retry_base_seconds * 2 ** (attempts_made - 1) * random.uniform(0.8, 1.2)


def _signing_secrets(svc: Services, webhook: dict, now: int) -> list[str]:
    context = _sealing_context(webhook["account_id"])
    found = [svc.secret_box.open(webhook["secret"], context)]
    if webhook.get("previous") and webhook.get("previous_until", 0) > now:
        found.append(svc.secret_box.open(webhook["previous"], context))
    return found


def deliver(svc: Services, message: dict) -> str:
    """One delivery message: make the event's next attempt if it is due. Returns what happened
    (delivered, retry, failed, skipped, later, stale), for metrics."""
    event = WebhookEvent.get(svc.table, message["pk"], message["sk"])
    if event is None or event["status"] != "pending":
        return "stale"  # delivered, given up, or past its retention
    now = svc.now()
    if event["next_attempt_at"] > now:  # a wait longer than SQS's 15 minutes comes back early, and waits again
        svc.queues.send_webhook(message, event["next_attempt_at"] - now)
        return "later"
    timeout = svc.settings.webhook_timeout_seconds
    try:
        WebhookEvent.begin_attempt(svc.table, event, now, now + int(timeout) + CLAIM_GRACE_SECONDS)
    except ConditionFailed:
        return "stale"  # a duplicate message: another delivery made this attempt
    webhook = Webhook.get(svc.table, event["account_id"])
    if webhook is None:
        WebhookEvent.skip(svc.table, {**event, "attempt_count": event["attempt_count"] + 1},
                          "no webhook is set for the account (it was removed)")
        return "skipped"
    url = event.get("url") or webhook["url"]
    began = time.time()  # the signature's timestamp is the wall clock's: receivers compare it with theirs
    try:
        target = check_url(url, allow_loopback=svc.settings.webhook_allow_loopback, resolve=svc.resolve)
    except UrlRefused as refused:
        status_code, error = None, f"not sent: {refused}"
    else:
        body = event_body(event)
        signatures = " ".join(signature(s, event["id"], int(began), body)
                              for s in _signing_secrets(svc, webhook, now))
        outcome = post_event(target, body.encode(), {"webhook-id": event["id"], "webhook-timestamp": str(int(began)),
                                                     "webhook-signature": signatures}, timeout)
        status_code, error = outcome.status_code, outcome.error
    # Kept in the event's record, one per attempt: short whatever the refusal or the receiver said.
    attempt = {"at": now, "url": url, "status_code": status_code,
               "error": clipped(error, ATTEMPT_ERROR_CHARS) if error is not None else None,
               "duration_ms": int((time.time() - began) * 1000)}
    made = event["attempt_count"] + 1
    if error is None:
        result, status, next_at = "delivered", "delivered", None
    elif made >= svc.settings.webhook_max_attempts:
        result, status, next_at = "failed", "failed", None
    else:
        result, status = "retry", "pending"
        next_at = now + max(1, round(backoff_seconds(svc, made)))
    WebhookEvent.record_attempt(svc.table, event, attempt, status, next_at,
                                None if next_at is None else next_at + svc.settings.webhook_relay_seconds)
    if next_at is not None:
        svc.queues.send_webhook(message, next_at - now)
    log.info("webhook event %s attempt %d: %s", event["id"], made, status_code if error is None else error)
    return result
