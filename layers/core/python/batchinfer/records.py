"""The records the service keeps in DynamoDB, and every expression that reads or changes them.

Service code says what changes (a lane advances, a batch stops, slots go back); this module says how
DynamoDB spells it: the update, condition and key-condition expressions, each next to the record it
touches. Keys come from `layout`; statuses and states from `domain`, whose transition tables fence
every status write. Ops are built for `Table.transact`, so callers combine them into one transaction.

Records: the batch (`BatchItem`), its lanes (one per model with undispatched requests), its groups (a
lease over up to 25 first attempts), its requests (written with their outcome, or for a retry), the
model's budget, the account (unfinished counts and slots), the day's usage, and an Idempotency-Key.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TypedDict

from .domain import (
    STOPPABLE_BATCH,
    BatchStatus,
    RequestState,
    Stop,
    batch_transition,
    batches_that_may_become,
    request_transition,
    utc_day,
)
from .layout import (
    ACTIVE_PARTITIONS,
    GROUP_PREFIX,
    LANES_END,
    LEASE_PARTITIONS,
    OWNER_FILE_PREFIX,
    PURGE_PARTITIONS,
    REQUEST_PREFIX,
    TTL_ATTRIBUTE,
    WEBHOOK_DUE,
    WEBHOOK_EVENT_PREFIX,
    account_key,
    active_partition,
    api_key_key,
    batch_key,
    file_key,
    idempotency_key,
    interactive_lease_key,
    lane_key,
    lanes_of,
    lease_due,
    model_budget_key,
    owner_file_sort,
    owner_partition,
    owner_sort,
    purge_due,
    request_key,
    request_sk,
    retry_due,
    slot_lease_key,
    upload_key,
    usage_key,
    webhook_event_key,
    webhook_key,
)
from .storage.dynamo import ConditionFailed, Table

Op = dict  # one write of a transaction (Table.op_*)


# --- Typed shapes (what the items hold; DynamoDB adds nothing) ----------------------------------------

class LaneState(TypedDict):
    next: int  # the lane's next undispatched position
    total: int


class BatchItem(TypedDict, total=False):
    pk: str
    sk: str
    id: str
    account_id: str
    key_hash: str  # the key that created it: the worker re-checks it before every attempt
    endpoint: str
    status: str  # BatchStatus
    created_at: int
    expires_at: int  # the completion window: requests may start until then
    metadata: dict | None
    total: int
    lanes: dict[str, LaneState]  # model id -> lane progress
    completed: int
    failed: int
    rejected: int  # requests that failed at intake (a Message Batch's invalid ones): in no lane, never run
    unstarted: int  # requests that never ran because the batch stopped (cancelled, expired, failed)
    open: int  # requests dispatched and not yet final
    in_flight: int  # requests holding a slot
    input_tokens: int
    output_tokens: int
    cost_usd: float
    cost_unknown_attempts: int
    result_bytes: int
    owner_pk: str  # by_owner index
    owner_sk: str
    active_pk: str  # by_active index, while unfinished
    active_sk: str
    idempotency_key: str | None
    stop: str  # Stop, once the batch stopped starting requests
    deleting: bool
    export_object: str  # output.jsonl written to S3 when the batch ended large


class GroupItem(TypedDict, total=False):
    pk: str
    sk: str
    batch_id: str
    model: str
    account_id: str
    first: int
    positions: list[list]  # [index, custom_id, offset, length] per member
    state: str  # RequestState: dispatched or running
    token: str  # the lease's fence
    due_pk: str
    due_at: int  # when the lease runs out
    created_at: int
    started_at: int
    item_ttl: int  # the TTL its members' items get
    slot_lease: str  # the SlotLease its members run in, if any (they hold no budget slots of their own)
    budget_shards: dict  # without a SlotLease: how many of its members' slots came from which budget shard


class RequestItem(TypedDict, total=False):
    pk: str
    sk: str
    batch_id: str
    index: int
    custom_id: str
    model: str
    account_id: str
    offset: int  # the body's place in the batch's requests object
    length: int
    state: str  # RequestState
    token: str
    attempt: int
    error: dict
    # A completed request's {status_code, request_id, body_text}: body_text is the body as the backend sent
    # it; a large body is the S3 object `response_object` names instead. (Items written before bodies were
    # kept as text hold `body` as a map, or the whole response in `response_object` without `response`.)
    response: dict
    response_object: str
    due_pk: str  # a retry's or a lease's due time (by_due)
    due_at: int
    group_token: str  # for a group member: the group that wrote it
    slot_lease: str  # a retry dispatched in a SlotLease's slots
    budget_shard: int  # a retry dispatched in a slot of its own: the budget shard it came from (0 if absent)
    tally: dict  # for a group member: what its outcome adds to the counters
    ttl: int


def _in(name: str, statuses: frozenset) -> tuple[str, dict]:
    """`#name IN (:name_0, ...)` and its values, from a set of statuses (sorted: stable expressions)."""
    vals = {f":{name}_{i}": s.value for i, s in enumerate(sorted(statuses))}
    return f"#{name} IN ({', '.join(vals)})", vals


def _add_op(t: Table, key: tuple[str, str], counters: dict[str, float]) -> Op | None:
    """`ADD a :a, b :b` for the non-zero counters (`#open` is a reserved word, hence the alias), or None."""
    counters = {k: v for k, v in counters.items() if v}
    if not counters:
        return None
    return t.op_update(*key, "ADD " + ", ".join(f"{k} :{k.lstrip('#')}" for k in counters),
                       vals={f":{k.lstrip('#')}": v for k, v in counters.items()})


# --- Batch --------------------------------------------------------------------------------------------

def due_in(t: Table, partitions: tuple[str, ...], now: int, limit: int) -> list[dict]:
    """Items of the `by_due` index due by `now` in any of the partitions (the shards of one key), the most
    overdue first: `limit` from each at most, so one busy shard cannot hide the others' for long."""
    due: list[dict] = []
    for partition in partitions:
        items, _ = t.query("due_pk = :d AND due_at <= :now", {":d": partition, ":now": now}, index="by_due",
                           limit=limit)
        due += items
    return sorted(due, key=lambda item: int(item["due_at"]))[:limit]


class Batch:
    """The batch item: status, lanes, counters; under `by_owner` always, `by_active` while unfinished and
    `by_due` (PURGE) once its retention clock runs."""

    @staticmethod
    def new(*, batch_id: str, account_id: str, key_hash: str, endpoint: str, now: int, expires_at: int,
            metadata: dict | None, lanes: dict[str, int], owner_created_us: int, idempotency_key: str | None,
            extra: dict | None = None, rejected: int = 0, status: BatchStatus = BatchStatus.VALIDATING
            ) -> BatchItem:
        """A batch as created: validating (or already in progress), every counter at zero but `failed`.
        `lanes`: model id -> its request count; `rejected`: requests that failed at intake, which run nowhere
        (a Message Batch checks each request on its own)."""
        pk, sk = batch_key(batch_id)
        item: BatchItem = {
            "pk": pk, "sk": sk, "id": batch_id, "account_id": account_id, "key_hash": key_hash,
            "endpoint": endpoint, "status": status.value, "created_at": now,
            "expires_at": expires_at, "metadata": metadata, "total": sum(lanes.values()) + rejected,
            "lanes": {m: {"next": 0, "total": n} for m, n in lanes.items()}, "rejected": rejected,
            "completed": 0, "failed": rejected, "unstarted": 0, "open": 0, "in_flight": 0, "input_tokens": 0,
            "output_tokens": 0,
            "cost_usd": 0.0, "cost_unknown_attempts": 0,
            "owner_pk": owner_partition(account_id), "owner_sk": owner_sort(owner_created_us, batch_id),
            "active_pk": active_partition(batch_id), "active_sk": batch_id, "idempotency_key": idempotency_key,
        }
        item.update(extra or {})  # type: ignore[typeddict-item]
        return item

    @staticmethod
    def get(t: Table, batch_id: str) -> BatchItem | None:
        return t.get(*batch_key(batch_id))  # type: ignore[return-value]

    @staticmethod
    def create(t: Table, item: BatchItem) -> Op:
        return t.op_put(item, condition="attribute_not_exists(pk)")

    @staticmethod
    def claim_lane(t: Table, batch: BatchItem, model_id: str, lane_next: int, k: int, now: int) -> Op:
        """Advance the model's lane by k dispatched requests; the batch is in progress from then on.
        Fenced on the lane's position (one claimant wins) and on the batch still running."""
        status = batch_transition(batch["status"], BatchStatus.IN_PROGRESS)
        may, may_vals = _in("status", batches_that_may_become(status) | {status})
        return t.op_update(
            *batch_key(batch["id"]),
            "SET lanes.#m.#next = :new, #status = :running, in_progress_at = if_not_exists(in_progress_at, :now) "
            "ADD in_flight :k, #open :k",
            vals={":new": lane_next + k, ":old": lane_next, ":running": status.value, ":now": now, ":k": k,
                  **may_vals},
            names={"#m": model_id},
            condition="lanes.#m.#next = :old AND attribute_not_exists(#stop) AND attribute_not_exists(deleting) "
                      f"AND expires_at > :now AND {may}")

    @staticmethod
    def may_start(t: Table, batch_id: str, now: int, first_attempt: bool) -> Op:
        """The check a start makes on its batch: not stopped, not being deleted, and for a first attempt the
        window still open (the window only stops requests from starting)."""
        if first_attempt:
            return t.op_check(*batch_key(batch_id), "attribute_not_exists(#stop) AND attribute_not_exists("
                              "deleting) AND expires_at > :now", vals={":now": now})
        return t.op_check(*batch_key(batch_id), "attribute_not_exists(#stop) AND attribute_not_exists(deleting)")

    @staticmethod
    def take_retry_slot(t: Table, batch_id: str) -> Op:
        return t.op_update(*batch_key(batch_id), "ADD in_flight :one", vals={":one": 1},
                           condition="attribute_not_exists(#stop) AND attribute_not_exists(deleting)")

    @staticmethod
    def add(t: Table, batch_id: str, counters: dict[str, float]) -> Op | None:
        return _add_op(t, batch_key(batch_id), counters)

    @staticmethod
    def stop(t: Table, batch_id: str, stop: Stop, now: int, error: dict | None = None) -> Op:
        """Stop a batch from starting requests; a cancel also makes it cancelling. Fenced on it being
        stoppable and not stopped yet."""
        sets = ["#stop = :stop", "stopped_at = :now"]
        stoppable, vals = _in("status", STOPPABLE_BATCH)
        vals.update({":stop": stop.value, ":now": now})
        if stop is Stop.CANCEL:
            for status in STOPPABLE_BATCH:
                batch_transition(status, BatchStatus.CANCELLING)
            sets += ["#status = :cancelling", "cancelling_at = :now"]
            vals[":cancelling"] = BatchStatus.CANCELLING.value
        if error is not None:
            sets.append("#error = :error")
            vals[":error"] = error
        return t.op_update(*batch_key(batch_id), "SET " + ", ".join(sets), vals=vals,
                           condition=f"attribute_not_exists(#stop) AND {stoppable}")

    @staticmethod
    def finalize(t: Table, batch: BatchItem, final: BatchStatus, stop: Stop | None, now: int,
                 retention_ends: int, never_started_failed: int, export: str | None,
                 sets: dict | None = None, never_started: int = 0) -> Op:
        """Give the batch its final status, start its retention clock (`by_due` PURGE) and leave
        `by_active`. Fenced on the status and the stop the decision was made on, and on nothing of it
        running or open. `sets`: more fields the ending gives it (result files, validation errors)."""
        final = batch_transition(batch["status"], final)
        vals = {":final": final.value, ":now": now, ":exp": retention_ends, ":purge": purge_due(batch["id"]),
                ":never": never_started_failed, ":unstarted": never_started, ":old": batch["status"], ":zero": 0}
        more = dict(sets or {})
        if export:
            more["export_object"] = export
        for name, value in more.items():
            vals[f":set_{name}"] = value
        if stop is None:
            same_stop = "attribute_not_exists(#stop)"
        else:
            same_stop, vals[":stop"] = "#stop = :stop", stop.value
        return t.op_update(
            *batch_key(batch["id"]),
            f"SET #status = :final, {final.value}_at = :now, results_expires_at = :exp, due_pk = :purge, "
            "due_at = :exp" + "".join(f", #{name} = :set_{name}" for name in more)
            + " ADD failed :never, unstarted :unstarted REMOVE active_pk, active_sk, awaiting_validation",
            vals=vals,
            condition="#status = :old AND in_flight = :zero AND #open = :zero AND attribute_not_exists(deleting) "
                      f"AND {same_stop}")

    @staticmethod
    def begin_finalizing(t: Table, batch: BatchItem, now: int, file_ids: dict[str, str]) -> Op:
        """in progress -> finalizing while its result files are written, under ids chosen once (a writer
        that starts again writes the same files). Fenced on nothing of it running or open."""
        to = batch_transition(batch["status"], BatchStatus.FINALIZING)
        return t.op_update(*batch_key(batch["id"]),
                           "SET #status = :to, finalizing_at = :now, result_file_ids = :ids, "
                           "writing = if_not_exists(writing, :empty)",
                           vals={":to": to.value, ":now": now, ":ids": file_ids, ":old": batch["status"],
                                 ":zero": 0, ":empty": {}},
                           condition="#status = :old AND in_flight = :zero AND #open = :zero "
                                     "AND attribute_not_exists(deleting) AND attribute_not_exists(result_file_ids)")

    @staticmethod
    def reserve_result_files(t: Table, batch: BatchItem, file_ids: dict[str, str]) -> None:
        """Result file ids for a batch that ends without finalizing (cancelled, or failed while validating)."""
        t.update(*batch_key(batch["id"]), "SET result_file_ids = :ids, writing = if_not_exists(writing, :empty)",
                 vals={":ids": file_ids, ":empty": {}}, condition="attribute_not_exists(result_file_ids)")

    @staticmethod
    def prepare_writers(t: Table, batch_id: str) -> None:
        """Room for the cursors of the batch's resumable writers (service.finalize)."""
        t.update(*batch_key(batch_id), "SET writing = if_not_exists(writing, :empty)", vals={":empty": {}})

    @staticmethod
    def save_writer(t: Table, batch_id: str, kind: str, state: dict, previous: dict | None) -> None:
        """Save a writer's cursor, fenced on the cursor it advanced from (ConditionFailed: another run did)."""
        if previous is None:
            condition, vals = "attribute_not_exists(writing.#k)", {":new": state}
        else:
            condition = "writing.#k.#next = :old AND size(writing.#k.parts) = :parts"
            vals = {":new": state, ":old": previous["next"], ":parts": len(previous["parts"])}
        t.update(*batch_key(batch_id), "SET writing.#k = :new", vals=vals, names={"#k": kind},
                 condition=condition + " AND attribute_not_exists(deleting)")

    @staticmethod
    def validated(t: Table, batch_id: str, lanes: dict[str, int], now: int) -> Op:
        """A file batch whose every line is valid: its requests may now be dispatched."""
        return t.op_update(*batch_key(batch_id), "SET #total = :n, lanes = :lanes, validated_at = :now "
                           "REMOVE awaiting_validation",
                           vals={":n": sum(lanes.values()), ":lanes": {m: {"next": 0, "total": n}
                                                                       for m, n in lanes.items()},
                                 ":now": now, ":v": BatchStatus.VALIDATING.value, ":yes": True},
                           condition="#status = :v AND awaiting_validation = :yes AND attribute_not_exists(#stop) "
                                     "AND attribute_not_exists(deleting)")

    @staticmethod
    def mark_deleting(t: Table, batch: BatchItem, now: int, purge_items: bool) -> Op:
        """The batch reads as deleted from now on, stops, leaves `by_active`, and is due for the sweeper's
        purge at once (`by_due` PURGE). Fenced on no request of it holding a slot, on the status it was read
        with (whether its unfinished counts go back depends on it), and on not being marked already.
        `purge_items`: its request items are deleted too (a user's delete; after the retention their TTL does)."""
        return t.op_update(
            *batch_key(batch["id"]),
            "SET deleting = :yes, #stop = if_not_exists(#stop, :cancel), due_pk = :purge, due_at = :now, "
            "purge_items = :items REMOVE active_pk, active_sk",
            vals={":yes": True, ":cancel": Stop.CANCEL.value, ":zero": 0, ":purge": purge_due(batch["id"]), ":now": now,
                  ":items": purge_items, ":seen": batch["status"]},
            condition="attribute_exists(pk) AND in_flight = :zero AND attribute_not_exists(deleting) "
                      "AND #status = :seen")

    @staticmethod
    def not_deleting(t: Table, batch_id: str) -> Op:
        """The check a write for a batch makes when it must not outlive the batch's purge."""
        return t.op_check(*batch_key(batch_id), "attribute_exists(pk) AND attribute_not_exists(deleting)")

    @staticmethod
    def purge_page(t: Table, batch: BatchItem, limit: int) -> list[dict]:
        """Up to `limit` of what lies under the batch's partition but the batch item (its groups and request
        items), with what deleting each needs. Deleted items leave the page, so reading from the start
        again is how a purge resumes."""
        pk, sk = batch_key(batch["id"])
        items, _ = t.query("pk = :pk AND sk > :b", {":pk": pk, ":b": sk}, limit=limit, consistent=True,
                           projection="pk, sk, #state, #token, model")
        return items

    @staticmethod
    def delete(t: Table, batch_id: str) -> None:
        t.delete(*batch_key(batch_id))

    @staticmethod
    def of_owner(t: Table, account_id: str, limit: int, start: dict | None, newest_first: bool = True, *,
                 prefix: str) -> tuple[list[BatchItem], dict | None]:
        """One page of an account's batches of one protocol (`prefix`: its Protocol.owner_prefix), newest
        first (or oldest first)."""
        return t.query("owner_pk = :o AND begins_with(owner_sk, :b)",
                       {":o": owner_partition(account_id), ":b": prefix},
                       index="by_owner", forward=not newest_first, limit=limit,
                       start=start)  # type: ignore[return-value]

    @staticmethod
    def owner_cursor(batch: BatchItem) -> dict:
        """Where a page of `of_owner` after this batch starts."""
        return {"pk": batch["pk"], "sk": batch["sk"], "owner_pk": batch["owner_pk"], "owner_sk": batch["owner_sk"]}

    @staticmethod
    def active(t: Table) -> Iterator[dict]:
        """Unfinished batches (their ids), for the sweeper: shard after shard."""
        for partition in ACTIVE_PARTITIONS:
            yield from t.query_all("active_pk = :a", {":a": partition}, index="by_active")

    @staticmethod
    def due_for_purge(t: Table, now: int, limit: int) -> list[dict]:
        """Batches due for their purge, the most overdue first, from every shard."""
        return due_in(t, PURGE_PARTITIONS, now, limit)


# --- Lane ---------------------------------------------------------------------------------------------

class Lane:
    """The undispatched requests of one batch on one model, under the model's partition: batches take
    turns by their lanes. Exists while the lane has any request left to dispatch."""

    @staticmethod
    def create(t: Table, model_id: str, batch: BatchItem) -> Op:
        pk, sk = lane_key(model_id, batch["created_at"], batch["id"])
        return t.op_put({"pk": pk, "sk": sk, "batch_id": batch["id"], "account_id": batch["account_id"],
                         "model": model_id})

    @staticmethod
    def remove(t: Table, model_id: str, batch: BatchItem) -> Op:
        return t.op_delete(*lane_key(model_id, batch["created_at"], batch["id"]))

    @staticmethod
    def delete(t: Table, model_id: str, batch: BatchItem) -> None:
        t.delete(*lane_key(model_id, batch["created_at"], batch["id"]))

    @staticmethod
    def discard(t: Table, lane: dict) -> None:
        """Remove a lane read from `in_turn` (one left behind by a stopped or deleted batch)."""
        t.delete(lane["pk"], lane["sk"])

    @staticmethod
    def newest(t: Table, model_id: str) -> dict | None:
        pk, prefix = lanes_of(model_id)
        items, _ = t.query("pk = :pk AND begins_with(sk, :l)", {":pk": pk, ":l": prefix}, forward=False, limit=1)
        return items[0] if items else None

    @staticmethod
    def in_turn(t: Table, model_id: str, after: str | None, limit: int) -> tuple[list[dict], bool]:
        """Up to `limit` of the model's lanes in turn: those after the place `after` (a lane's sort key, or
        `lane_turn_at`), then round from the oldest. A claim reads the lanes it can serve, not every batch's
        (two small queries, whatever the number of batches). With True when they are all the model's lanes."""
        pk, prefix = lanes_of(model_id)
        first: list[dict] = []
        if after is not None:  # BETWEEN takes `after` itself too: one more, dropped
            items, _ = t.query("pk = :pk AND sk BETWEEN :a AND :e", {":pk": pk, ":a": after, ":e": LANES_END},
                               limit=limit + 1)
            first = [lane for lane in items if lane["sk"] != after][:limit]
        if len(first) >= limit:
            return first, False
        rest, _ = t.query("pk = :pk AND begins_with(sk, :l)", {":pk": pk, ":l": prefix}, limit=limit - len(first))
        seen = {lane["sk"] for lane in first}
        wrapped = [lane for lane in rest if after is None or lane["sk"] <= after and lane["sk"] not in seen]
        lanes = first + wrapped
        # Fewer than asked for over the whole ring (the round came back to `after`, or ran out): all of them.
        return lanes, len(lanes) < limit or len(wrapped) < len(rest)


# --- Group --------------------------------------------------------------------------------------------

class Group:
    """A lease over first attempts of one batch on one model: one item, one queue message, one start and
    one close for all its members. Under `by_due` (LEASE) until it ends, so the sweeper recovers it if its
    worker dies."""

    @staticmethod
    def new(*, pk: str, sk: str, batch: BatchItem, model_id: str, positions: list[list], running: bool,
            token: str, now: int, lease_ends: int, item_ttl: int, slot_lease: str | None = None,
            budget_shards: dict[int, int] | None = None) -> GroupItem:
        """`slot_lease`: the SlotLease whose slots its members run in (they take none of the budget's);
        without one, `budget_shards` says how many of their slots came from which budget shard."""
        state = request_transition(None, RequestState.RUNNING if running else RequestState.DISPATCHED)
        group: GroupItem = {
            "pk": pk, "sk": sk, "batch_id": batch["id"], "model": model_id, "account_id": batch["account_id"],
            "first": positions[0][0], "positions": positions, "state": state.value, "token": token,
            "due_pk": lease_due(pk, sk), "due_at": lease_ends, "created_at": now, "item_ttl": item_ttl}
        if slot_lease:
            group["slot_lease"] = slot_lease
        elif budget_shards:
            group["budget_shards"] = shards_map(budget_shards)
        return group

    @staticmethod
    def create(t: Table, group: GroupItem) -> Op:
        return t.op_put(group, condition="attribute_not_exists(pk)")

    @staticmethod
    def start(t: Table, group: GroupItem, new_token: str, now: int, lease_ends: int,
              slot_lease: str | None = None) -> Op:
        """dispatched -> running; with `slot_lease`, its members' budget slots become that lease's."""
        to = request_transition(group["state"], RequestState.RUNNING)
        vals = {":running": to.value, ":lease": lease_ends, ":now": now, ":expect": RequestState.DISPATCHED.value,
                ":token": group["token"], ":newtoken": new_token}
        expression = "SET #state = :running, due_at = :lease, started_at = :now, #token = :newtoken"
        if slot_lease:
            expression += ", slot_lease = :sl"
            vals[":sl"] = slot_lease
        return t.op_update(group["pk"], group["sk"], expression, vals=vals,
                           condition="#state = :expect AND #token = :token")

    @staticmethod
    def end(t: Table, group: GroupItem) -> Op:
        """The group goes; fenced by its state and token, so only its lease holder (or the sweeper that
        recovered the lease) ends it, once."""
        return t.op_delete(group["pk"], group["sk"], condition="#state = :s AND #token = :t",
                           vals={":s": group["state"], ":t": group["token"]})

    @staticmethod
    def of_batch(t: Table, batch: BatchItem) -> Iterator[GroupItem]:
        return t.query_all("pk = :pk AND begins_with(sk, :g)", {":pk": batch["pk"], ":g": GROUP_PREFIX},
                           consistent=True)  # type: ignore[return-value]


# --- Request ------------------------------------------------------------------------------------------

class Request:
    """A request's own item: written with a group member's outcome, and by every change of a retry."""

    @staticmethod
    def get(t: Table, batch_id: str, index: int) -> RequestItem | None:
        return t.get(*request_key(batch_id, index))  # type: ignore[return-value]

    @staticmethod
    def put_outcome(t: Table, item: RequestItem) -> None:
        """A group member's outcome: written once (a recovered lease wrote it first otherwise)."""
        t.put(item, condition="attribute_not_exists(pk)")

    @staticmethod
    def create(t: Table, item: RequestItem) -> Op:
        return t.op_put(item, condition="attribute_not_exists(pk)")

    @staticmethod
    def move(t: Table, req: RequestItem, to: RequestState, new_token: str, now: int, *, due: tuple[str, int] | None,
             fields: dict, extra: dict) -> Op:
        """Move a request from its current state (and token) to `to`, setting `fields` (error, response, ...)
        and `extra` attributes. `due`: its new place in `by_due`, or None to leave the index."""
        request_transition(req["state"], to)
        sets = ["#state = :to", "updated_at = :now", "#token = :newtoken"]
        vals: dict = {":to": to.value, ":now": now, ":expect": req["state"], ":token": req["token"],
                      ":newtoken": new_token}
        removes = []
        if due is not None:
            sets += ["due_pk = :due", "due_at = :at"]
            vals[":due"], vals[":at"] = due
        else:
            removes += ["due_pk", "due_at"]
        for name, value in fields.items():
            sets.append(f"#{name} = :{name}")
            vals[f":{name}"] = value
        for name, value in extra.items():
            sets.append(f"{name} = :x_{name}")
            vals[f":x_{name}"] = value
        expression = "SET " + ", ".join(sets) + (" REMOVE " + ", ".join(removes) if removes else "")
        return t.op_update(*request_key(req["batch_id"], req["index"]), expression, vals=vals,
                           names={"#state": "state"}, condition="#state = :expect AND #token = :token")

    @staticmethod
    def start(t: Table, req: RequestItem, running: RequestItem) -> Op:
        """dispatched -> running, with its attempt counted and its lease set (`running` holds the new values)."""
        request_transition(req["state"], RequestState.RUNNING)
        return t.op_update(*request_key(req["batch_id"], req["index"]),
                           "SET #state = :running, attempt = :attempt, due_at = :lease, started_at = :now, "
                           "#token = :newtoken",
                           vals={":running": running["state"], ":attempt": running["attempt"],
                                 ":lease": running["due_at"], ":now": running["started_at"],
                                 ":expect": RequestState.DISPATCHED.value, ":token": req["token"],
                                 ":newtoken": running["token"]},
                           condition="#state = :expect AND #token = :token")

    @staticmethod
    def dispatch_retry(t: Table, req: RequestItem, new_token: str, lease_ends: int,
                       slot_lease: str | None = None, budget_shard: int = 0) -> Op:
        """waiting -> dispatched: from the retry partition of `by_due` to the lease partition (in a
        SlotLease's slots, or in a budget slot of its own, taken from shard `budget_shard`)."""
        to = request_transition(req["state"], RequestState.DISPATCHED)
        vals = {":d": to.value, ":new": new_token, ":lease": lease_due(*request_key(req["batch_id"], req["index"])),
                ":at": lease_ends,
                ":w": RequestState.WAITING.value, ":old": req["token"]}
        expression = "SET #state = :d, #token = :new, due_pk = :lease, due_at = :at"
        if slot_lease:
            expression += ", slot_lease = :sl"
            vals[":sl"] = slot_lease
        else:
            expression += ", budget_shard = :bs REMOVE slot_lease"
            vals[":bs"] = budget_shard
        return t.op_update(*request_key(req["batch_id"], req["index"]), expression, vals=vals,
                           condition="#state = :w AND #token = :old")

    @staticmethod
    def between(t: Table, batch: BatchItem, start: int, end: int) -> Iterator[RequestItem]:
        """The stored requests with index start..end (inclusive)."""
        return t.query_all("pk = :pk AND sk BETWEEN :a AND :b",
                           {":pk": batch["pk"], ":a": request_sk(start), ":b": request_sk(end)},
                           consistent=True)  # type: ignore[return-value]

    @staticmethod
    def waiting_of(t: Table, batch: BatchItem) -> Iterator[RequestItem]:
        return t.query_all("pk = :pk AND begins_with(sk, :r)",
                           {":pk": batch["pk"], ":r": REQUEST_PREFIX, ":w": RequestState.WAITING.value},
                           filter_expression="#state = :w", consistent=True)  # type: ignore[return-value]

    @staticmethod
    def drop_waiting(t: Table, req: dict) -> list[Op]:
        """Delete a request waiting for a retry (its batch is being purged), with its place in the model's
        `waiting` count; fenced on its state and token, so it goes, and the count moves, once."""
        return [t.op_delete(req["pk"], req["sk"], condition="#state = :w AND #token = :t",
                            vals={":w": RequestState.WAITING.value, ":t": req["token"]}),
                t.op_update(*model_budget_key(req["model"], int(req.get("budget_shard", 0))), "ADD waiting :minus",
                            vals={":minus": -1})]

    @staticmethod
    def due_retries(t: Table, model_id: str, now: int, limit: int) -> list[dict]:
        return due_in(t, (retry_due(model_id),), now, limit)

    @staticmethod
    def due_leases(t: Table, now: int, limit: int) -> list[dict]:
        """Requests, groups and leases whose lease ran out, the most overdue first, from every lease
        partition."""
        return due_in(t, LEASE_PARTITIONS, now, limit)


# --- Model budget -------------------------------------------------------------------------------------

class Budget:
    """A model's batch slots in use (`in_flight`), retries waiting, interactive requests running, and the
    adaptive cap the backend's 429s set.

    Split over `shards` items (layout.model_budget_key) so that no one item takes every slot take and
    give-back of a busy model: each shard holds its share of the cap (layout.budget_share), and a take is
    fenced on its shard's share alone. What takes slots remembers where from (a SlotLease's `shards` and a
    group's `budget_shards`: how many from which shard; a retried request's `budget_shard`, an interactive
    lease's `shard`) and gives them back there, so no shard ever holds more than its share of the catalog's
    budget and the shards together never more than the budget. Readers read every shard in one BatchGetItem
    and see the sums (`shards`: each one's counters). The adaptive cap and its clocks live on shard 0."""

    SUMMED = ("in_flight", "waiting", "interactive")

    @staticmethod
    def get(t: Table, model_id: str, consistent: bool = True, shards: int = 1) -> dict:
        """The budget as the sums of its shards' counters (`interactive_at`: the latest), shard 0's adaptive
        cap, and `shards`: each shard's own counters."""
        if shards <= 1:
            items = [t.get(*model_budget_key(model_id), consistent) or {}]
        else:
            keys = [model_budget_key(model_id, k) for k in range(shards)]
            found = t.get_many(keys, consistent)
            items = [found.get(key, {}) for key in keys]
        view = {name: value for name, value in items[0].items() if name not in ("pk", "sk")}
        for name in Budget.SUMMED:
            view[name] = sum(int(item.get(name, 0)) for item in items)
        view["interactive_at"] = max(int(item.get("interactive_at", 0)) for item in items)
        view["shards"] = [{name: int(item.get(name, 0)) for name in ("in_flight", "interactive")} for item in items]
        return view

    @staticmethod
    def take(t: Table, model_id: str, shard: int, k: int, cap: int, interactive_seen: int | None,
             from_waiting: bool) -> Op:
        """k slots of shard `shard`, within `cap` (the shard's share of the model's cap). `interactive_seen`:
        the shard's interactive count the cap was computed from; if interactive load has grown since, the
        claim fails rather than start batch work on a stale cap."""
        vals = {":k": k, ":cap": cap - k}
        condition = "(attribute_not_exists(in_flight) OR in_flight <= :cap)"
        if interactive_seen is not None:
            vals[":seen"] = interactive_seen
            condition += " AND (attribute_not_exists(interactive) OR interactive <= :seen)"
        if from_waiting:
            vals[":w"] = -k
        return t.op_update(*model_budget_key(model_id, shard),
                           "ADD in_flight :k" + (", waiting :w" if from_waiting else ""), vals=vals,
                           condition=condition)

    @staticmethod
    def add(t: Table, model_id: str, counters: dict[str, float], shard: int = 0) -> Op | None:
        return _add_op(t, model_budget_key(model_id, shard), counters)

    @staticmethod
    def track_interactive(t: Table, model_id: str, delta: int, moved_at: int, shard: int = 0) -> None:
        """`moved_at` (ms since the epoch): when the count moved, as every change of it stamps it, so a reader
        that has not watched it can tell whether it stood still over the last moments (`interactive_at`)."""
        t.update(*model_budget_key(model_id, shard), "ADD interactive :d SET interactive_at = :at",
                 vals={":d": delta, ":at": moved_at})

    @staticmethod
    def back_off(t: Table, model_id: str, cap: int, now: int) -> None:
        """Set the adaptive cap, at most once a second. Raises ConditionFailed if another did this second."""
        t.update(*model_budget_key(model_id), "SET adaptive_cap = :cap, throttled_at = :now",
                 vals={":cap": cap, ":now": now},
                 condition="attribute_not_exists(throttled_at) OR throttled_at < :now")

    @staticmethod
    def probe(t: Table, model_id: str, old_cap: int, new_cap: int | None, now: int) -> None:
        """Move the adaptive cap from old_cap to new_cap (None: no cap). Raises ConditionFailed if it moved."""
        if new_cap is None:
            t.update(*model_budget_key(model_id), "REMOVE adaptive_cap SET probed_at = :now",
                     vals={":now": now, ":old": old_cap}, condition="adaptive_cap = :old")
        else:
            t.update(*model_budget_key(model_id), "SET adaptive_cap = :new, probed_at = :now",
                     vals={":new": new_cap, ":now": now, ":old": old_cap}, condition="adaptive_cap = :old")


class InteractiveLease:
    """An interactive request in flight on a model. Beginning one counts it in the budget's `interactive`
    (batch work makes way); ending it takes it off, in one transaction each. Under `by_due` (LEASE) until it
    ends, so a request whose process died is taken off by the sweeper once its lease runs out."""

    @staticmethod
    def begin(t: Table, model_id: str, lease_id: str, account_id: str, now: int, lease_ends: int,
              moved_at: int, shard: int = 0) -> list[Op]:
        """`moved_at`: the time in ms (see `Budget.track_interactive`); `shard`: the budget shard it is counted
        on (it ends there)."""
        pk, sk = interactive_lease_key(model_id, lease_id)
        item = {"pk": pk, "sk": sk, "model": model_id, "interactive": True, "account_id": account_id,
                "started_at": now, "due_pk": lease_due(pk, sk), "due_at": lease_ends, "shard": shard}
        return [t.op_put(item, condition="attribute_not_exists(pk)"),
                t.op_update(*model_budget_key(model_id, shard), "ADD interactive :one SET interactive_at = :at",
                            vals={":one": 1, ":at": moved_at})]

    @staticmethod
    def end(t: Table, model_id: str, lease_id: str, moved_at: int, shard: int = 0) -> list[Op]:
        """Fenced on the lease still existing: a lease the sweeper already recovered is not taken off twice."""
        return [t.op_delete(*interactive_lease_key(model_id, lease_id), condition="attribute_exists(pk)"),
                t.op_update(*model_budget_key(model_id, shard), "ADD interactive :minus SET interactive_at = :at",
                            vals={":minus": -1, ":at": moved_at})]


def lease_shards(lease: dict) -> dict[int, int]:
    """The budget shards a SlotLease's slots came from, and how many of each (a lease from before the shards:
    all of shard 0)."""
    held = lease.get("shards")
    return {0: int(lease["slots"])} if held is None else _held_of(held)


def group_shards(group: dict) -> dict[int, int]:
    """The budget shards a group's members' own slots came from, and how many of each (none in a SlotLease;
    a group from before the shards: all of shard 0)."""
    if group.get("slot_lease"):
        return {}
    held = group.get("budget_shards")
    return {0: len(group["positions"])} if held is None else _held_of(held)


def _shard_name(shard: int) -> str:
    return f"s{shard}"  # the lease's `shards` map is keyed by these (a name, so `#s3` needs no alias)


def shards_map(held: dict[int, int]) -> dict[str, int]:
    """A lease's `shards` (a group's `budget_shards`) attribute from {shard: slots}; `_held_of` reads it back."""
    return {_shard_name(shard): n for shard, n in held.items()}


def _held_of(stored: dict) -> dict[int, int]:
    return {int(name[1:]): int(n) for name, n in stored.items() if int(n) > 0}


class SlotLease:
    """Some of a model's batch slots, taken from its budget once and held by one worker invocation, which
    keeps that many backend calls in flight from requests it claimed (`service.work.SlotPump`). Groups and
    retries claimed under a lease take no budget slots of their own, and give none back when they end: the
    lease's slots go back when it is released, or when the sweeper recovers it once its lease runs out (the
    worker died). Every change is fenced by the lease's token and its slot count. `shards`: how many of its
    slots came from which shard of the budget (they go back there)."""

    @staticmethod
    def new(model_id: str, lease_id: str, held: dict[int, int], token: str, now: int, lease_ends: int) -> dict:
        """`held`: how many slots it starts with from which budget shard."""
        pk, sk = slot_lease_key(model_id, lease_id)
        return {"pk": pk, "sk": sk, "id": lease_id, "model": model_id, "slots": sum(held.values()), "token": token,
                "created_at": now, "due_pk": lease_due(pk, sk), "due_at": lease_ends, "shards": shards_map(held)}

    @staticmethod
    def create(t: Table, lease: dict) -> Op:
        return t.op_put(lease, condition="attribute_not_exists(pk)")

    @staticmethod
    def get(t: Table, model_id: str, lease_id: str) -> dict | None:
        return t.get(*slot_lease_key(model_id, lease_id))

    @staticmethod
    def grow(t: Table, lease: dict, parts: dict[int, int]) -> Op:
        """`parts` (shard -> slots) more slots into the lease; the takes from those budget shards go in the same
        transaction (see `Budget.take`)."""
        key = slot_lease_key(lease["model"], lease["id"])
        vals = {":t": lease["token"], ":held": int(lease["slots"]), ":n": sum(parts.values()), ":zero": 0}
        sets = []
        for shard, n in parts.items():
            name = f"#{_shard_name(shard)}"
            sets.append(f"shards.{name} = if_not_exists(shards.{name}, :zero) + :n{shard}")
            vals[f":n{shard}"] = n
        return t.op_update(*key, "ADD slots :n SET " + ", ".join(sets), vals=vals,
                           condition="#token = :t AND slots = :held")

    @staticmethod
    def give_back(t: Table, lease: dict, parts: dict[int, int]) -> list[Op]:
        """`parts` (shard -> slots) of the lease's slots back to those shards of the model's budget (all of
        them: the lease ends)."""
        key = slot_lease_key(lease["model"], lease["id"])
        n = sum(parts.values())
        vals = {":t": lease["token"], ":held": int(lease["slots"])}
        condition = "#token = :t AND slots = :held"  # fenced on what the last change left
        if n >= int(lease["slots"]):
            release = t.op_delete(*key, condition=condition, vals=vals)
        else:
            sets = []
            for shard, m in parts.items():
                sets.append(f"shards.#{_shard_name(shard)} = shards.#{_shard_name(shard)} - :m{shard}")
                vals[f":m{shard}"] = m
            release = t.op_update(*key, "ADD slots :minus SET " + ", ".join(sets), vals={**vals, ":minus": -n},
                                  condition=condition)
        return [release] + [t.op_update(*model_budget_key(lease["model"], shard), "ADD in_flight :minus",
                                        vals={":minus": -m}) for shard, m in parts.items()]


# --- Account and its day's usage ----------------------------------------------------------------------

class Account:
    """The account's unfinished batches and requests (the 429 limits) and its slots in flight."""

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


# --- File ---------------------------------------------------------------------------------------------

class FileItem(TypedDict, total=False):
    pk: str
    sk: str
    id: str
    account_id: str
    filename: str
    purpose: str  # batch (an upload) or batch_output (a batch's output or error file)
    bytes: int
    sha256: str  # fixed when the file is complete: the ETag of every download
    created_at: int
    expires_at: int | None
    batch_id: str  # for a result file: its batch
    owner_pk: str  # by_owner index
    owner_sk: str
    ttl: int  # DynamoDB forgets the record a day after it expires


class File:
    """A batch file's record; its bytes are one S3 object (layout.file_object)."""

    @staticmethod
    def new(*, file_id: str, account_id: str, filename: str, purpose: str, size: int, sha256: str, now: int,
            expires_at: int | None, owner_created_us: int, batch_id: str | None = None) -> FileItem:
        pk, sk = file_key(file_id)
        item: FileItem = {"pk": pk, "sk": sk, "id": file_id, "account_id": account_id, "filename": filename,
                          "purpose": purpose, "bytes": size, "sha256": sha256, "created_at": now,
                          "expires_at": expires_at, "owner_pk": owner_partition(account_id),
                          "owner_sk": owner_file_sort(owner_created_us, file_id)}
        if batch_id:
            item["batch_id"] = batch_id
        if expires_at:
            item["ttl"] = expires_at + 86400
        return item

    @staticmethod
    def get(t: Table, file_id: str) -> FileItem | None:
        return t.get(*file_key(file_id))  # type: ignore[return-value]

    @staticmethod
    def create(t: Table, item: FileItem) -> Op:
        return t.op_put(item, condition="attribute_not_exists(pk)")

    @staticmethod
    def register_result(t: Table, item: FileItem) -> list[Op]:
        """A batch's output or error file (written again the same by a writer that runs again), only while
        its batch is not being deleted: a file registered after the purge removed its files would outlive it."""
        return [t.op_put(item), Batch.not_deleting(t, item["batch_id"])]

    @staticmethod
    def delete(t: Table, file_id: str) -> None:
        t.delete(*file_key(file_id))

    @staticmethod
    def of_owner(t: Table, account_id: str, limit: int, start: dict | None, newest_first: bool = True,
                 ) -> tuple[list[FileItem], dict | None]:
        return t.query("owner_pk = :o AND begins_with(owner_sk, :f)",
                       {":o": owner_partition(account_id), ":f": OWNER_FILE_PREFIX}, index="by_owner",
                       forward=not newest_first, limit=limit, start=start)  # type: ignore[return-value]

    @staticmethod
    def all_of_owner(t: Table, account_id: str) -> Iterator[FileItem]:
        return t.query_all("owner_pk = :o AND begins_with(owner_sk, :f)",
                           {":o": owner_partition(account_id), ":f": OWNER_FILE_PREFIX},
                           index="by_owner")  # type: ignore[return-value]

    @staticmethod
    def owner_cursor(item: FileItem) -> dict:
        return {"pk": item["pk"], "sk": item["sk"], "owner_pk": item["owner_pk"], "owner_sk": item["owner_sk"]}


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


# --- Idempotency-Key ----------------------------------------------------------------------------------

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
    def remember_until(t: Table, account_id: str, key: str, until: int) -> Op:
        return t.op_update(*idempotency_key(account_id, key), "SET #ttl = :ttl", vals={":ttl": until})

    @staticmethod
    def mark_deleted(t: Table, account_id: str, key: str, until: int) -> None:
        """Raises ConditionFailed when the record is gone already."""
        t.update(*idempotency_key(account_id, key), "SET deleted = :yes, #ttl = :ttl",
                 vals={":yes": True, ":ttl": until}, condition="attribute_exists(pk)")


# --- Upload (a file sent in parts) ----------------------------------------------------------------------

class UploadItem(TypedDict, total=False):
    pk: str
    sk: str
    id: str
    account_id: str
    filename: str
    purpose: str
    mime_type: str
    bytes: int  # declared when created: the parts it is completed from must add up to it
    created_at: int
    expires_at: int  # a pending upload is gone from then on
    status: str  # Upload.PENDING, COMPLETED or CANCELLED
    parts: dict[str, int]  # part id -> its size; its bytes are one S3 object each (layout.upload_part_object)
    received: int  # the sizes of every part added, together
    file_expires_after: int  # the file's own expires_after (seconds), if the create call gave one
    file_id: str  # once completed: the file made of its parts
    part_ids: list[str]  # once completed: the parts it was made of, in order
    ttl: int  # DynamoDB forgets the record a day after it expires


class Upload:
    """A file sent in parts (the Uploads API): pending while parts are added, then completed into a file
    (`File`) or cancelled; each of those is fenced on it still being pending."""

    PENDING, COMPLETED, CANCELLED = "pending", "completed", "cancelled"

    @staticmethod
    def new(*, upload_id: str, account_id: str, filename: str, purpose: str, mime_type: str, size: int, now: int,
            expires_at: int, file_expires_after: int | None) -> UploadItem:
        pk, sk = upload_key(upload_id)
        item: UploadItem = {"pk": pk, "sk": sk, "id": upload_id, "account_id": account_id, "filename": filename,
                            "purpose": purpose, "mime_type": mime_type, "bytes": size, "created_at": now,
                            "expires_at": expires_at, "status": Upload.PENDING, "parts": {}, "received": 0,
                            "ttl": expires_at + 86400}
        if file_expires_after:
            item["file_expires_after"] = file_expires_after
        return item

    @staticmethod
    def get(t: Table, upload_id: str) -> UploadItem | None:
        return t.get(*upload_key(upload_id))  # type: ignore[return-value]

    @staticmethod
    def create(t: Table, item: UploadItem) -> None:
        t.put(item, condition="attribute_not_exists(pk)")

    @staticmethod
    def add_part(t: Table, upload_id: str, part_id: str, size: int, now: int, max_received: int,
                 max_parts: int) -> None:
        """Record a part whose bytes are stored. Fenced on the upload being pending and unexpired, on its
        parts staying within `max_received` bytes together and on fewer than `max_parts` parts (the record
        must stay far below DynamoDB's 400 KB). ConditionFailed otherwise."""
        t.update(*upload_key(upload_id), "SET #parts.#part = :size ADD #received :size", names={"#part": part_id},
                 vals={":size": size, ":pending": Upload.PENDING, ":now": now, ":room": max_received - size,
                       ":most": max_parts},
                 condition="#status = :pending AND expires_at > :now AND #received <= :room "
                           "AND size(#parts) < :most")

    @staticmethod
    def complete(t: Table, upload_id: str, file_id: str, part_ids: list[str], now: int) -> Op:
        """pending -> completed into `file_id` (in one transaction with the file's record). Fenced on it
        being pending and unexpired."""
        return t.op_update(*upload_key(upload_id),
                           "SET #status = :completed, file_id = :file, part_ids = :ids, completed_at = :now",
                           vals={":completed": Upload.COMPLETED, ":file": file_id, ":ids": part_ids, ":now": now,
                                 ":pending": Upload.PENDING},
                           condition="#status = :pending AND expires_at > :now")

    @staticmethod
    def cancel(t: Table, upload_id: str, now: int) -> None:
        """pending -> cancelled. ConditionFailed when it is not pending (any more)."""
        t.update(*upload_key(upload_id), "SET #status = :cancelled, cancelled_at = :now",
                 vals={":cancelled": Upload.CANCELLED, ":now": now, ":pending": Upload.PENDING},
                 condition="#status = :pending")


# --- Webhook (an account's completion webhook) and its events -------------------------------------------

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
