"""What every record's expressions share: a transaction's write (`Op`), the `IN` test of a status set, the
`ADD` of counters, and the read of what the `by_due` index holds due."""

from __future__ import annotations

from ..storage.dynamo import Table

Op = dict  # one write of a transaction (Table.op_*)


def _in(name: str, statuses: frozenset) -> tuple[str, dict]:
    """`#name IN (:name_0, ...)` and its values, from a set of statuses (sorted: stable expressions)."""
    vals = {f":{name}_{i}": s.value for i, s in enumerate(sorted(statuses))}
    return f"#{name} IN ({', '.join(vals)})", vals


def _add_op(t: Table, key: tuple[str, str], counters: dict[str, float], condition: str | None = None
            ) -> Op | None:
    """`ADD a :a, b :b` for the non-zero counters (`#open` is a reserved word, hence the alias), or None;
    `condition`: what the item must satisfy (a check alone when no counter moves)."""
    counters = {k: v for k, v in counters.items() if v}
    if not counters:
        return t.op_check(*key, condition) if condition else None
    return t.op_update(*key, "ADD " + ", ".join(f"{k} :{k.lstrip('#')}" for k in counters),
                       vals={f":{k.lstrip('#')}": v for k, v in counters.items()}, condition=condition)


def due_in(t: Table, partitions: tuple[str, ...], now: int, limit: int) -> list[dict]:
    """Items of the `by_due` index due by `now` in any of the partitions (the shards of one key), the most
    overdue first: `limit` from each at most, so one busy shard cannot hide the others' for long."""
    due: list[dict] = []
    for partition in partitions:
        items, _ = t.query("due_pk = :d AND due_at <= :now", {":d": partition, ":now": now}, index="by_due",
                           limit=limit)
        due += items
    return sorted(due, key=lambda item: int(item["due_at"]))[:limit]
