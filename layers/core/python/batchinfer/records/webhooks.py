"""An account's completion webhook and the events that announce a batch's ending to it."""

from __future__ import annotations

from ..layout import TTL_ATTRIBUTE, WEBHOOK_DUE, WEBHOOK_EVENT_PREFIX, owner_partition, webhook_event_key, webhook_key
from ..storage.dynamo import Table
from .expressions import Op, due_in


class Webhook:
    """The account's webhook: `url`, the sealed signing `secret`, and after a rotation the `previous`
    sealed secret, which keeps signing beside the new one until `previous_until`."""

    @staticmethod
    def get(t: Table, account_id: str) -> dict | None:
        return t.get(*webhook_key(account_id))

    @staticmethod
    def put(t: Table, account_id: str, fields: dict, existing: dict | None) -> None:
        """Write the webhook, fenced on what was read (two PUTs at once: one wins, the other answers 409)."""
        pk, sk = webhook_key(account_id)
        item = {"pk": pk, "sk": sk, "account_id": account_id, **fields}
        if existing is None:
            t.put(item, condition="attribute_not_exists(pk)")
        else:
            t.put(item, condition="updated_at = :seen AND secret = :secret",
                  vals={":seen": existing["updated_at"], ":secret": existing["secret"]})

    @staticmethod
    def delete(t: Table, account_id: str) -> dict | None:
        """Remove the webhook; returns what was removed (None if there was none)."""
        return t.delete(*webhook_key(account_id), return_old=True)


class WebhookEvent:
    """One announcement of a batch's ending, and its delivery: `status` pending, delivered, failed or
    skipped; `attempt_count` attempts started (the fence of each attempt); `attempts` their outcomes.
    Under `by_due` (WEBHOOK) while pending, due when the sweeper should send it to the queue again (its
    message was lost, or the delivery died half-way)."""

    @staticmethod
    def new(*, event_id: str, account_id: str, event_type: str, batch_id: str, url: str | None, now: int,
            relay_at: int, keep_until: int) -> dict:
        pk, sk = webhook_event_key(account_id, event_id)
        return {"pk": pk, "sk": sk, "id": event_id, "account_id": account_id, "type": event_type,
                "batch_id": batch_id, "url": url, "created_at": now, "status": "pending", "attempt_count": 0,
                "attempts": [], "next_attempt_at": now, "due_pk": WEBHOOK_DUE, "due_at": relay_at,
                TTL_ATTRIBUTE: keep_until}

    @staticmethod
    def create(t: Table, event: dict) -> Op:
        return t.op_put(event, condition="attribute_not_exists(pk)")

    @staticmethod
    def get(t: Table, pk: str, sk: str) -> dict | None:
        return t.get(pk, sk)

    @staticmethod
    def begin_attempt(t: Table, event: dict, now: int, relay_at: int) -> None:
        """Start attempt attempt_count + 1; fenced, so a duplicate message cannot start the same attempt."""
        t.update(event["pk"], event["sk"], "SET attempt_count = :next, due_at = :relay",
                 vals={":next": event["attempt_count"] + 1, ":n": event["attempt_count"], ":relay": relay_at,
                       ":pending": "pending", ":now": now},
                 condition="#status = :pending AND attempt_count = :n AND next_attempt_at <= :now")

    @staticmethod
    def record_attempt(t: Table, event: dict, attempt: dict, status: str, next_attempt_at: int | None,
                       relay_at: int | None) -> None:
        """The outcome of the attempt begun from `event`: still pending (with its next attempt) or final."""
        vals = {":a": [attempt], ":n": event["attempt_count"] + 1, ":status": status, ":pending": "pending"}
        expression = "SET attempts = list_append(attempts, :a), #status = :status"
        if next_attempt_at is None:
            expression += " REMOVE due_pk, due_at, next_attempt_at"
        else:
            expression += ", next_attempt_at = :next, due_at = :relay"
            vals.update({":next": next_attempt_at, ":relay": relay_at})
        t.update(event["pk"], event["sk"], expression, vals=vals,
                 condition="#status = :pending AND attempt_count = :n")

    @staticmethod
    def skip(t: Table, event: dict, reason: str) -> None:
        t.update(event["pk"], event["sk"], "SET #status = :skipped, skipped_reason = :why "
                 "REMOVE due_pk, due_at, next_attempt_at",
                 vals={":skipped": "skipped", ":why": reason, ":pending": "pending", ":n": event["attempt_count"]},
                 condition="#status = :pending AND attempt_count = :n")

    @staticmethod
    def relayed(t: Table, event: dict, relay_at: int) -> None:
        """The sweeper sent it to the queue again; fenced on the due time it saw (one sweeper does)."""
        t.update(event["pk"], event["sk"], "SET due_at = :relay", vals={":relay": relay_at, ":seen": event["due_at"]},
                 condition="due_at = :seen")

    @staticmethod
    def due(t: Table, now: int, limit: int) -> list[dict]:
        return due_in(t, (WEBHOOK_DUE,), now, limit)

    @staticmethod
    def of_account(t: Table, account_id: str, limit: int, after: str | None) -> tuple[list[dict], bool]:
        """A page of the account's events, newest first, after the event id `after`."""
        pk = owner_partition(account_id)
        start = {"pk": pk, "sk": WEBHOOK_EVENT_PREFIX + after} if after else None
        items, more = t.query("pk = :p AND begins_with(sk, :e)", {":p": pk, ":e": WEBHOOK_EVENT_PREFIX},
                              forward=False, limit=limit, start=start)
        return items, more is not None
