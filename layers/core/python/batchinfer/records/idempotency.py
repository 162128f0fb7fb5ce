"""The Idempotency-Key record: which batch a key created (or a retry was sent with), and the hash of the
body it came with, so that the same call again answers with that batch."""

from __future__ import annotations

from ..layout import idempotency_key
from ..storage.dynamo import Table
from .expressions import Op


class Idempotency:
    """Which batch an Idempotency-Key created, with the hash of the body it came with."""

    @staticmethod
    def get(t: Table, account_id: str, key: str) -> dict | None:
        return t.get(*idempotency_key(account_id, key))

    @staticmethod
    def claim(t: Table, account_id: str, key: str, batch_id: str, body_hash: str, now: int) -> Op:
        # A record past its TTL may linger until DynamoDB deletes it; it no longer holds the key.
        pk, sk = idempotency_key(account_id, key)
        return t.op_put({"pk": pk, "sk": sk, "batch_id": batch_id, "body_hash": body_hash},
                        condition="attribute_not_exists(pk) OR #ttl <= :now", vals={":now": now})

    @staticmethod
    def hold(t: Table, account_id: str, key: str, batch_id: str) -> Op:
        """The key that created a batch being retried is held again while it runs (no TTL), fenced on it still
        naming that batch."""
        return t.op_update(*idempotency_key(account_id, key), "REMOVE #ttl",
                           vals={":b": batch_id}, condition="batch_id = :b AND attribute_not_exists(deleted)")

    @staticmethod
    def claim_until(t: Table, account_id: str, key: str, batch_id: str, body_hash: str, now: int, until: int) -> Op:
        """A key sent with a call that is not a create (a retry), remembered until `until`."""
        pk, sk = idempotency_key(account_id, key)
        return t.op_put({"pk": pk, "sk": sk, "batch_id": batch_id, "body_hash": body_hash, "ttl": until},
                        condition="attribute_not_exists(pk) OR #ttl <= :now", vals={":now": now})

    @staticmethod
    def remember_until(t: Table, account_id: str, key: str, until: int) -> Op:
        return t.op_update(*idempotency_key(account_id, key), "SET #ttl = :ttl", vals={":ttl": until})

    @staticmethod
    def mark_deleted(t: Table, account_id: str, key: str, until: int) -> None:
        """Raises ConditionFailed when the record is gone already."""
        t.update(*idempotency_key(account_id, key), "SET deleted = :yes, #ttl = :ttl",
                 vals={":yes": True, ":ttl": until}, condition="attribute_exists(pk)")
