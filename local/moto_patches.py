"""Make moto's DynamoDB transactions safe to use from many threads, as DynamoDB's are.

moto (5.2) runs TransactWriteItems by deep-copying every table it touches and, if any part fails,
putting the copies back. That is O(table size) per transaction, and with a threaded server a failed
transaction restores the table over writes other threads made meanwhile, silently losing them. Our
ledger is built on transactions, so the local stack and the tests would measure moto, not the design.

The patch keeps moto's own transaction code but (1) runs DynamoDB operations one at a time under a lock,
so a transaction is atomic to other callers, and (2) replaces the table copy with a snapshot of only the
items the transaction names, restored if it is cancelled. Applied by the local moto server process
(`python -m local.moto_server`) and by the test suite's in-process moto.
"""

from __future__ import annotations

import copy
import functools
import threading
import types

_lock = threading.RLock()
_applied = False


def apply() -> None:
    global _applied
    if _applied:
        return
    import moto.dynamodb.models as models
    from moto.dynamodb.models import DynamoDBBackend
    from moto.dynamodb.models.table import Table

    real_deepcopy = copy.deepcopy

    def deepcopy(obj, memo=None):
        return obj if isinstance(obj, Table) else real_deepcopy(obj, memo)

    # Only transact_write_items deep-copies Table objects in that module; keep every other copy real.
    models.copy = types.SimpleNamespace(deepcopy=deepcopy, copy=copy.copy)

    def locked(method):
        @functools.wraps(method)
        def wrapper(self, *args, **kwargs):
            with _lock:
                return method(self, *args, **kwargs)
        return wrapper

    for name in ("put_item", "get_item", "update_item", "delete_item", "query", "scan"):
        setattr(DynamoDBBackend, name, locked(getattr(DynamoDBBackend, name)))

    original = DynamoDBBackend.transact_write_items

    @functools.wraps(original)
    def transact_write_items(self, transact_items):
        with _lock:
            snapshots = []
            for entry in transact_items:
                _, op = next(iter(entry.items()))
                table = self.tables.get(op.get("TableName"))
                if table is None:
                    continue
                source = op.get("Item") or op.get("Key") or {}
                key = {a: source[a] for a in (table.hash_key_attr, table.range_key_attr) if a and a in source}
                current = self.get_item(table.name, key)
                snapshots.append((table.name, key, real_deepcopy(current.to_json()["Attributes"]) if current else None))
            try:
                return original(self, transact_items)
            except Exception:
                for table_name, key, attrs in reversed(snapshots):
                    if attrs is None:
                        self.delete_item(table_name, key)
                    else:
                        self.put_item(table_name, attrs)
                raise

    DynamoDBBackend.transact_write_items = transact_write_items
    _applied = True
