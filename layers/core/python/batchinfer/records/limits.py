"""An account's per-account limits, kept so that every Lambda instance counts the same calls: its request rate
(a token bucket) and the long polls it holds now."""

from __future__ import annotations

from ..layout import TTL_ATTRIBUTE, long_polls_key, request_rate_key
from ..storage.dynamo import ConditionFailed, Table

HOLDER_PREFIX = "p_"  # the long polls item's attribute per held poll: its token, holding its end (epoch seconds)


class RequestRate:
    """The account's request rate as a token bucket, kept as one number: `full_at`, the time (ms) at which its
    bucket would be full again (GCRA's theoretical arrival time). A call takes a token when taking it leaves
    `full_at` at most `capacity` intervals ahead of now; each take moves `full_at` one interval on, from now
    when the bucket was full. DynamoDB has no max(), so the two cases are two conditional updates: a take
    tries the one it expects (the caller's guess from the account's last take) and, in the same call, gets the
    bucket back when the guess was wrong, so it costs one write, two at a change between idle and busy."""

    @staticmethod
    def take(t: Table, account_id: str, now_ms: int, interval_ms: int, capacity: int, expect_idle: bool
             ) -> tuple[bool, int]:
        """(taken, full_at): after the take when taken; as it stands when the bucket is empty."""
        most = now_ms + (capacity - 1) * interval_ms  # full_at a take may start from
        ttl = now_ms // 1000 + (capacity * interval_ms) // 1000 + 3600  # an idle account's bucket goes away
        idle = ("SET full_at = :next, #ttl = :ttl", "attribute_not_exists(full_at) OR full_at <= :now",
                {":next": now_ms + interval_ms, ":now": now_ms, ":ttl": ttl})
        busy = ("SET full_at = full_at + :i, #ttl = :ttl", "full_at > :now AND full_at <= :most",
                {":i": interval_ms, ":now": now_ms, ":most": most, ":ttl": ttl})
        form = idle if expect_idle else busy
        for _ in range(4):  # a form is tried again only after another call changed the bucket in between
            expression, condition, vals = form
            new, old = t.update_unless(*request_rate_key(account_id), expression, condition, vals=vals,
                                       names={"#ttl": TTL_ATTRIBUTE})
            if new is not None:
                return True, int(new["full_at"])
            full_at = old.get("full_at") if old else None
            if full_at is None or int(full_at) <= now_ms:
                form = idle
            elif int(full_at) <= most:
                form = busy
            else:
                return False, int(full_at)
        return False, int(full_at)


class LongPolls:
    """The long polls an account holds now: a count (`held`, what the limit's condition reads) and one
    attribute per poll, named by its token, holding when its hold ends at the latest. A hold whose API instance
    died without giving it back is cleared once its end has passed, by the next poll refused over it."""

    @staticmethod
    def hold(t: Table, account_id: str, token: str, until: int, most: int) -> dict | None:
        """Hold one more, within `most`: None when held, else the item as it stands (every hold taken)."""
        _, old = t.update_unless(*long_polls_key(account_id), "SET #h = :until ADD held :one",
                                 "attribute_not_exists(held) OR held < :most",
                                 vals={":until": until, ":one": 1, ":most": most},
                                 names={"#h": HOLDER_PREFIX + token})
        return old

    @staticmethod
    def release(t: Table, account_id: str, token: str) -> None:
        """Give one back (nothing when it was cleared as stale meanwhile)."""
        try:
            t.update(*long_polls_key(account_id), "REMOVE #h ADD held :minus", vals={":minus": -1},
                     names={"#h": HOLDER_PREFIX + token}, condition="attribute_exists(#h)")
        except ConditionFailed:
            pass

    @staticmethod
    def clear_stale(t: Table, account_id: str, item: dict, now: int) -> int:
        """Give back the holds of `item` whose end has passed (their instance died holding them): how many."""
        stale = [name for name, until in item.items() if name.startswith(HOLDER_PREFIX) and int(until) < now]
        if not stale:
            return 0
        names = {f"#s{i}": name for i, name in enumerate(stale)}
        try:
            t.update(*long_polls_key(account_id), "REMOVE " + ", ".join(names) + " ADD held :minus",
                     vals={":minus": -len(stale)}, names=names,
                     condition=" AND ".join(f"attribute_exists({alias})" for alias in names))
        except ConditionFailed:  # another poll cleared them first
            return 0
        return len(stale)
