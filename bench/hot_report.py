"""The hot-item report: which DynamoDB items and index partitions a run wrote most, per request, and what
that becomes at the target load, against DynamoDB's 1,000 write units/s per partition.

From the botocore calls of a run (bench/calls.py: each write's item key, its write units, and the index
partitions it wrote, as the index projections decide). Each key has a scope, read off its key: an item or
index partition of the whole deployment (`LEASE`, `ACTIVE`, `PURGE`), of a model (`MODEL#...`, `RETRY#...`),
of an account (`ACCOUNT#...`, `KEY#...`), of a batch (`BATCH#.../BATCH`, its lane `MODEL#.../LANE#...`), of
a lease (a worker's slot lease, an interactive call's lease), or of one request or group (the rest of
`BATCH#...`). Its write units per request of its scope (units / requests of that scope in the run) times that
scope's request rate at the target give its load at the target:

  the target: one model at C = 1,024, L = 0.05 s (20,480 requests/s) over 1,000 accounts with one batch
  each, and a second model at C = 128, L = 5 s (25.6 requests/s).

So a deployment key is scaled to 20,505.6 requests/s, a model key to 20,480, an account or batch key to 20.48
(one of 1,000), a request's own items to what one request writes (once per its life, at most a few per
second). A lease is shown at its rate in the run (units/s): more load means more leases, not busier ones.
Goal: every key below 50 % of a partition (500 write units/s) at the target. A key can only be
spread across partitions by the design (a sharded key), not by DynamoDB: an item never is.

Printed by the many-lanes benchmark (bench/many_lanes.py) with `--hot`, or by `python -m bench.hot_items`,
which runs that workload with the report.
"""

from __future__ import annotations

import sys
from collections import Counter, defaultdict

from batchinfer.layout import GROUP_PREFIX, REQUEST_PREFIX

PARTITION_WCU = 1000.0
GOAL_SHARE = 0.5
TARGET_RATE = 20_480.0  # the hot model's requests/s
SECOND_RATE = 128 / 5  # the second model's
TARGET_ACCOUNTS = 1000


def scope_of(name: str) -> str:
    """deployment, model, account, batch or request, from an item key ("pk / sk") or an index partition."""
    pk, _, sk = name.partition(" / ")
    if sk.startswith("LANE#"):
        return "batch"
    if sk.startswith(("SLOTS#", "INTERACTIVE#")):
        return "lease"
    if pk.startswith(("MODEL#", "RETRY#", "BUDGET#")):  # BUDGET#: the model budget's shards past the first
        return "model"
    if pk.startswith(("ACCOUNT#", "KEY#", "OWNER#")):
        return "account"
    if pk.startswith("BATCH#"):
        return "batch" if sk in ("BATCH", "") else "request"
    return "deployment"


def target_rate(scope: str) -> float:
    return {"deployment": TARGET_RATE + SECOND_RATE, "model": TARGET_RATE, "account": TARGET_RATE / TARGET_ACCOUNTS,
            "batch": TARGET_RATE / TARGET_ACCOUNTS, "request": 0.0, "lease": 0.0}[scope]


def tally(calls: list) -> tuple[dict[str, float], dict[str, float]]:
    """Write units per item key and per index partition over the calls."""
    items: dict[str, float] = defaultdict(float)
    partitions: dict[str, float] = defaultdict(float)
    for call in calls:
        for (pk, sk), wru, parts in getattr(call, "keys", []):
            items[f"{pk} / {sk}"] += wru
            for index, partition, units in parts:
                partitions[f"{index}: {partition}"] += units
    return items, partitions


def kind_of(pk: str, sk: str) -> str:
    """What an item is, from its key: the rows of the write-units breakdown."""
    if pk.startswith("BATCH#"):
        return {"BATCH": "batch item"}.get(sk) or ("group items" if sk.startswith(GROUP_PREFIX) else
                                                   "request items" if sk.startswith(REQUEST_PREFIX) else
                                                   "batch, other")
    if pk.startswith("BUDGET#"):
        return "model budget"
    if pk.startswith("MODEL#"):
        return ("model budget" if sk == "BUDGET" else "lanes" if sk.startswith("LANE#") else
                "slot leases" if sk.startswith("SLOTS#") else "interactive leases" if sk.startswith(
                    "INTERACTIVE#") else "model, other")
    if pk.startswith("ACCOUNT#"):
        return "account item" if sk == "ACCOUNT" else "usage" if sk.startswith("USAGE#") else "account, other"
    return pk.split("#", 1)[0].lower() or "other"


def group_sizes(calls: list, per_batch: int) -> Counter:
    """How many requests the run's groups held (size -> groups), from the group items its calls wrote: a
    group's key is its batch and first index, so within a batch the next group's first index ends it (the
    last ends at `per_batch`, the batch's size)."""
    firsts: dict[str, set[int]] = defaultdict(set)
    for call in calls:
        if call.ok:
            for (pk, sk), _, _ in getattr(call, "keys", []):
                if sk.startswith(GROUP_PREFIX):
                    firsts[pk].add(int(sk[len(GROUP_PREFIX):]))
    sizes: Counter = Counter()
    for starts in firsts.values():
        ordered = sorted(starts)
        for first, end in zip(ordered, [*ordered[1:], per_batch], strict=True):
            sizes[end - first] += 1
    return sizes


def print_breakdown(calls: list, n: int, out=sys.stdout, per_batch: int | None = None) -> None:
    """Where a request's write units go: per kind of item, and per function (the table's, not the GSIs');
    with `per_batch` (every batch's size), the sizes of the groups (each pays a claim and a close)."""
    kinds: dict[str, float] = defaultdict(float)
    writes: dict[str, int] = defaultdict(int)
    writers: dict[str, float] = defaultdict(float)
    for call in calls:
        for (pk, sk), wru, _ in getattr(call, "keys", []):
            kinds[kind_of(pk, sk)] += wru
            writes[kind_of(pk, sk)] += 1
            writers[call.label] += wru
    for title, table in (("item", kinds), ("function", writers)):
        shown = ", ".join(f"{name} {units / n:.2f}" for name, units in sorted(table.items(), key=lambda kv: -kv[1])
                          if units / n >= 0.005)
        print(f"    write units per request by {title}: {shown}", file=out)
    # Units per write tell an item's size (1 KB a unit, twice in a transaction) from how often it is written.
    shown = ", ".join(f"{name} {writes[name] / n:.2f} x {units / writes[name]:.1f}" for name, units in
                      sorted(kinds.items(), key=lambda kv: -kv[1]) if units / n >= 0.005)
    print(f"    writes per request x units per write: {shown}", file=out)
    if per_batch:
        sizes = group_sizes(calls, per_batch)
        groups = sum(sizes.values())
        shown = ", ".join(f"{size}: {count}" for size, count in sorted(sizes.items()))
        print(f"    groups: {groups}, {n / max(groups, 1):.2f} requests each; by size {shown}", file=out)


def rows(units: dict[str, float], n: int, batches: int, accounts: int, wall: float,
         index: bool = False) -> list[tuple]:
    """(name, scope, units per request of its scope, write units/s at the target, share of a partition)."""
    per_scope = {"deployment": n, "model": n, "account": n / accounts, "batch": n / batches, "request": 1,
                 "lease": n}
    out = []
    for name, total in units.items():
        scope = scope_of(name.split(": ", 1)[1] if index else name)
        per_request = total / per_scope[scope]
        # A request's own items: what one request writes to them, over its whole life.
        at_target = {"request": per_request, "lease": total / wall}.get(scope, per_request * target_rate(scope))
        out.append((name, scope, per_request, at_target, at_target / PARTITION_WCU))
    return sorted(out, key=lambda r: -r[3])


def print_report(calls: list, n: int, wall: float, batches: int = 1, accounts: int = 1, top: int = 10,
                 out=sys.stdout) -> list[tuple]:
    """Print the top keys and index partitions at the target; returns the rows of both."""
    items, partitions = tally(calls)
    item_rows = rows(items, n, batches, accounts, wall)
    index_rows = rows(partitions, n, batches, accounts, wall, index=True)
    print(f"  hot items and index partitions ({n} requests, {batches} batches, {accounts} accounts, "
          f"{wall:.0f} s): write units per request of the key's scope, and at the target "
          f"({TARGET_RATE:,.0f} + {SECOND_RATE:g} req/s, {TARGET_ACCOUNTS:,} accounts) against "
          f"{PARTITION_WCU:,.0f} WCU/s a partition (goal < {GOAL_SHARE:.0%})", file=out)
    for title, table in (("items", item_rows), ("index partitions", index_rows)):
        print(f"    top {top} {title}:", file=out)
        for name, scope, per_request, at_target, share in table[:top]:
            shown = name if len(name) <= 70 else name[:67] + "..."
            verdict = "ok" if share < GOAL_SHARE else "OVER"
            print(f"      {shown:<70} {scope:<10} {per_request:8.3f}/req  {at_target:>10,.1f} WCU/s  "
                  f"{share:7.1%}  {verdict}", file=out)
    for name, *_ in item_rows[:2]:  # who writes the hottest items, so the next reader knows what to shard
        by_writer: dict[tuple[str, str], list[float]] = defaultdict(lambda: [0, 0.0])
        for call in calls:
            for (pk, sk), wru, _ in getattr(call, "keys", []):
                if f"{pk} / {sk}" == name:
                    by_writer[(call.label, call.operation)][0] += 1
                    by_writer[(call.label, call.operation)][1] += wru
        shown = ", ".join(f"{label} {operation} {count:.0f} ({units / n:.3f}/req)" for (label, operation), (
            count, units) in sorted(by_writer.items(), key=lambda kv: -kv[1][1]))
        print(f"    {name[:60]} written by: {shown}", file=out)
    worst = max(item_rows[:1] + index_rows[:1], key=lambda r: r[4], default=None)
    if worst is not None:
        print(f"    hottest: {worst[0]} at {worst[4]:.1%} of a partition at the target "
              f"({'met' if worst[4] < GOAL_SHARE else 'NOT MET'})", file=out)
    return item_rows + index_rows
