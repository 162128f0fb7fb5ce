"""A batch's finished-order log: which requests reached an outcome, in the order their outcomes were counted.

Entry `n` (`FEED#000000n` in the batch's partition) names the requests whose final outcome one transaction
counted: a group's close (up to 25 members) or one request's settle. It is written inside that same
transaction, so an outcome is in the log if and only if it is counted, whoever counts it (the worker, or
the sweeper recovering a dead worker's lease).

Numbers are contiguous by construction: a writer reads the log's head `h` and puts entry `h + 1` on the
condition that it does not exist yet; if another writer took it, the transaction is cancelled and it tries
again after the new head. A number exists only once its entry is committed, so there are no holes, and a
late writer can only append after everything a reader may already have read: a reader that walks the log
past contiguous numbers never skips an entry, whatever the writers' clocks or delays.

Each member is named with the first characters of the token its request item got with that outcome: a retry
in place moves the item on with a new token, so a reader can tell an entry a later outcome superseded.
"""

from __future__ import annotations

import random
import time
from collections.abc import Iterable

from ..domain import RequestState
from ..layout import FEED_PREFIX, feed_key
from ..storage.dynamo import ConditionFailed, Table
from .expressions import Op

FINISHED = frozenset({RequestState.COMPLETED.value, RequestState.FAILED.value, RequestState.UNSTARTED.value})
TOKEN_CHARS = 12  # of a member's token kept in its entry: enough to tell two outcomes of one request apart
APPEND_ATTEMPTS = 40  # appends lost to other writers of the same batch before giving up (the caller retries)


def finished_members(items: Iterable[dict]) -> list[list]:
    """[index, token prefix] of the request items that hold a final outcome (a wait for a retry is none)."""
    return [[int(item["index"]), str(item["token"])[:TOKEN_CHARS]] for item in items
            if item.get("state") in FINISHED]


def entry_number(entry: dict) -> int:
    """An entry's number, read from its sort key (`FEED#000000042`): the entry holds it nowhere else."""
    return int(entry["sk"][len(FEED_PREFIX):])


class Feed:
    """The entries of one batch's finished-order log. An entry holds its key, its members and its TTL, nothing
    a reader does not use (its number is its sort key's): a reader's page of up to 40 entries is charged per
    started 4 KB. Its write costs 1 unit (2 in the transaction) whatever its size: it stays under 1 KB (25
    members at most, ~600 bytes)."""

    @staticmethod
    def head(t: Table, batch_id: str) -> int:
        """The number of the log's last entry (0 when empty): one strongly consistent read of one key."""
        pk, _ = feed_key(batch_id, 0)
        items, _ = t.query("pk = :pk AND begins_with(sk, :f)", {":pk": pk, ":f": FEED_PREFIX}, forward=False,
                           limit=1, consistent=True, projection="sk")
        return entry_number(items[0]) if items else 0

    @staticmethod
    def append(t: Table, batch_id: str, seq: int, members: list[list], ttl: int | None) -> Op:
        pk, sk = feed_key(batch_id, seq)
        item = {"pk": pk, "sk": sk, "members": members}
        if ttl:
            item["ttl"] = int(ttl)
        return t.op_put(item, condition="attribute_not_exists(pk)")

    @staticmethod
    def after(t: Table, batch_id: str, seq: int, limit: int) -> list[dict]:
        """Up to `limit` entries after entry `seq`, in order (strongly consistent: every committed one)."""
        pk, after = feed_key(batch_id, seq)
        items, _ = t.query("pk = :pk AND sk BETWEEN :a AND :z", {":pk": pk, ":a": after + "0", ":z": FEED_PREFIX + "~"},
                           limit=limit, consistent=True)
        return [item for item in items if entry_number(item) > seq]


def transact_counted(t: Table, batch_id: str, ops: list[Op], members: list[list], now: float,
                     ttl: int | None) -> None:
    """Write `ops` (a transaction that counts outcomes) with the log entry naming `members`, appended after
    the head. Raises ConditionFailed when `ops` themselves fail (a lease recovered first, ...). `now` is not
    written: an entry's place in the log is its time."""
    if not members:
        t.transact(ops)
        return
    for _ in range(APPEND_ATTEMPTS):
        seq = Feed.head(t, batch_id) + 1
        try:
            t.transact(ops + [Feed.append(t, batch_id, seq, members, ttl)])
            return
        except ConditionFailed:
            if Feed.head(t, batch_id) < seq:
                raise  # the entry's number was free: one of `ops` failed its condition
        time.sleep(random.uniform(0, 0.02))  # another close of this batch took the number: after it
    raise ConditionFailed(f"the finished-order log of batch {batch_id} kept moving")
