"""An account's records: the account (its unfinished counts, slots and upload quota), its API keys and its
day's usage."""

from __future__ import annotations

from ..domain import utc_day
from ..layout import account_key, api_key_key, usage_key
from ..storage.dynamo import ConditionFailed, Table
from .expressions import Op


class Account:
    """The account's unfinished batches and requests (the 429 limits) and its slots in flight."""

    @staticmethod
    def with_usage(t: Table, account_id: str, day: str) -> tuple[dict | None, dict | None]:
        """The account and what it spent that day, in one round trip (what a claim looks at)."""
        keys = [account_key(account_id), usage_key(account_id, day)]
        found = t.get_many(keys)
        return found.get(keys[0]), found.get(keys[1])

    @staticmethod
    def may_run_batches(account: dict, usage: dict | None) -> bool:
        """Batch access on and the day's quota not used up: its batch requests may start now."""
        return bool(account.get("batch_access")) and float((usage or {}).get("cost_usd", 0)) < float(
            account.get("daily_quota_usd", 0))

    @staticmethod
    def get(t: Table, account_id: str) -> dict | None:
        return t.get(*account_key(account_id))

    @staticmethod
    def create(t: Table, account: dict) -> None:
        pk, sk = account_key(account["id"])
        t.put({"pk": pk, "sk": sk, **account}, condition="attribute_not_exists(pk)")

    @staticmethod
    def set_fields(t: Table, account_id: str, fields: dict) -> dict:
        """Set some of the account's own fields; returns the account. ConditionFailed if there is none."""
        return t.update(*account_key(account_id), "SET " + ", ".join(f"#{k} = :{k}" for k in fields),
                        vals={f":{k}": v for k, v in fields.items()}, names={f"#{k}": k for k in fields},
                        condition="attribute_exists(pk)", return_new=True)

    @staticmethod
    def reserve_unfinished(t: Table, account_id: str, requests: int, max_batches: int, max_requests: int) -> Op:
        return t.op_update(
            *account_key(account_id), "ADD unfinished_batches :one, unfinished_requests :n",
            vals={":one": 1, ":n": requests, ":maxb": max_batches, ":maxr": max_requests - requests},
            condition="attribute_exists(pk) AND (attribute_not_exists(unfinished_batches) OR "
                      "unfinished_batches < :maxb) AND (attribute_not_exists(unfinished_requests) OR "
                      "unfinished_requests <= :maxr)")

    @staticmethod
    def reserve_requests(t: Table, account_id: str, requests: int, max_requests: int) -> Op:
        """More unfinished requests for a batch already counted (a file batch, once validated)."""
        return t.op_update(*account_key(account_id), "ADD unfinished_requests :n",
                           vals={":n": requests, ":maxr": max_requests - requests},
                           condition="attribute_not_exists(unfinished_requests) OR unfinished_requests <= :maxr")

    @staticmethod
    def release_unfinished(t: Table, account_id: str, requests: int) -> Op:
        return t.op_update(*account_key(account_id), "ADD unfinished_batches :minus, unfinished_requests :minus_total",
                           vals={":minus": -1, ":minus_total": -requests})

    @staticmethod
    def take(t: Table, account_id: str, k: int, cap: int) -> Op:
        return t.op_update(*account_key(account_id), "ADD in_flight :k", vals={":k": k, ":cap": cap - k},
                           condition="attribute_not_exists(in_flight) OR in_flight <= :cap")

    @staticmethod
    def count_upload(t: Table, account_id: str, hour: int, max_per_hour: int) -> None:
        """One more upload this clock hour, within the limit. ConditionFailed when the hour's are used up."""
        try:  # the same hour as the last upload
            t.update(*account_key(account_id), "ADD uploads_in_hour :one",
                     vals={":one": 1, ":h": hour, ":max": max_per_hour},
                     condition="upload_hour = :h AND uploads_in_hour < :max")
        except ConditionFailed:  # a new hour (or the first upload): start counting again
            t.update(*account_key(account_id), "SET upload_hour = :h, uploads_in_hour = :one",
                     vals={":one": 1, ":h": hour},
                     condition="attribute_exists(pk) AND (attribute_not_exists(upload_hour) OR upload_hour < :h)")

    @staticmethod
    def add_in_flight(t: Table, account_id: str, delta: int) -> Op:
        return t.op_update(*account_key(account_id), "ADD in_flight :m", vals={":m": delta})


class ApiKey:
    """An API key, by the SHA-256 of the key (the key itself is never stored)."""

    @staticmethod
    def get(t: Table, key_hash: str, consistent: bool = True) -> dict | None:
        return t.get(*api_key_key(key_hash), consistent=consistent)

    @staticmethod
    def create(t: Table, key_hash: str, account_id: str, key_id: str, prefix: str, now: int,
               expires_at: int | None) -> None:
        pk, sk = api_key_key(key_hash)
        t.put({"pk": pk, "sk": sk, "account_id": account_id, "key_id": key_id, "prefix": prefix,
               "created_at": now, "expires_at": expires_at})

    @staticmethod
    def revoke(t: Table, key_hash: str, now: int) -> None:
        """ConditionFailed if there is no such key."""
        t.update(*api_key_key(key_hash), "SET revoked_at = :now", vals={":now": now}, condition="attribute_exists(pk)")


def key_account_and_usage(t: Table, key_hash: str, account_id: str, day: str) -> tuple[dict | None, ...]:
    """A batch's key, its account and the account's spending that day, in one round trip (the checks a
    worker makes before every attempt)."""
    keys = [api_key_key(key_hash), account_key(account_id), usage_key(account_id, day)]
    found = t.get_many(keys)
    return tuple(found.get(k) for k in keys)


class Usage:
    """What an account spent on one UTC day (the daily quota); kept three days."""

    @staticmethod
    def get(t: Table, account_id: str, day: str) -> dict | None:
        return t.get(*usage_key(account_id, day), consistent=False)

    @staticmethod
    def add_cost(t: Table, account_id: str, cost_usd: float, now: int, unknown: int = 0, estimated: int = 0) -> Op:
        """The day's spend; `unknown`: attempts whose outcome (and so cost) was lost after they were sent;
        `estimated`: attempts whose cost (in `cost_usd`) was estimated, their backend having reported no usage."""
        return t.op_update(*usage_key(account_id, utc_day(now)),
                           "ADD cost_usd :c" + (", cost_unknown_attempts :u" if unknown else "")
                           + (", usage_estimated_attempts :e" if estimated else "") + " SET #ttl = :ttl",
                           vals={":c": cost_usd, ":ttl": now + 3 * 86400, **({":u": unknown} if unknown else {}),
                                 **({":e": estimated} if estimated else {})})
