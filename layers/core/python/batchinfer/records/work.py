"""A batch's dispatched work: groups (a lease over up to 25 first attempts) and the request items written
with an outcome or for a retry."""

from __future__ import annotations

from collections.abc import Iterator

from ..domain import RequestState, request_transition
from ..layout import (
    GROUP_PREFIX,
    LEASE_PARTITIONS,
    REQUEST_PREFIX,
    lease_due,
    model_budget_key,
    request_key,
    request_sk,
    retry_due,
)
from ..storage.dynamo import Table
from .capacity import shards_map
from .expressions import Op, due_in
from .items import BatchItem, GroupItem, RequestItem


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
    def get_many(t: Table, batch_id: str, indexes: list[int]) -> dict[int, RequestItem]:
        """The batch's request items at `indexes` that exist, by index: strongly consistent reads of up to 100
        at a time (BatchGetItem's most)."""
        keys = [request_key(batch_id, index) for index in dict.fromkeys(indexes)]
        found: dict[int, RequestItem] = {}
        for at in range(0, len(keys), 100):
            for item in t.get_many(keys[at:at + 100]).values():
                found[int(item["sk"][len(REQUEST_PREFIX):])] = item  # type: ignore[assignment]
        return found

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
        # Out of waiting, out of the paused ones' place outside the model's `waiting` count (`put_off`).
        removes = [] if to is RequestState.WAITING else ["uncounted"]
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
            expression += ", slot_lease = :sl REMOVE uncounted"
            vals[":sl"] = slot_lease
        else:
            expression += ", budget_shard = :bs REMOVE slot_lease, uncounted"
            vals[":bs"] = budget_shard
        return t.op_update(*request_key(req["batch_id"], req["index"]), expression, vals=vals,
                           condition="#state = :w AND #token = :old")

    @staticmethod
    def claim_running(t: Table, req: RequestItem, running: RequestItem) -> Op:
        """waiting -> running in a SlotLease's slots: a retry claimed by the pump that runs it at once (its
        start in its claim, as a group's), from the retry partition of `by_due` to the lease partition, its
        attempt counted (`running` holds the new values)."""
        request_transition(req["state"], RequestState.RUNNING)
        return t.op_update(*request_key(req["batch_id"], req["index"]),
                           "SET #state = :running, #token = :new, due_pk = :lease, due_at = :at, attempt = :attempt, "
                           "started_at = :now, slot_lease = :sl REMOVE uncounted",
                           vals={":running": running["state"], ":new": running["token"], ":lease": running["due_pk"],
                                 ":at": running["due_at"], ":attempt": running["attempt"],
                                 ":now": running["started_at"], ":sl": running["slot_lease"],
                                 ":w": RequestState.WAITING.value, ":old": req["token"]},
                           condition="#state = :w AND #token = :old")

    @staticmethod
    def defer(t: Table, req: RequestItem, due_at: int) -> Op:
        """Move a waiting request's due time (its batch was paused or resumed); fenced on its state and
        token, so a claim made meanwhile wins. Not a state change: it keeps its token."""
        return t.op_update(*request_key(req["batch_id"], req["index"]), "SET due_at = :at",
                           vals={":at": due_at, ":w": RequestState.WAITING.value, ":t": req["token"]},
                           condition="#state = :w AND #token = :t")

    @staticmethod
    def put_off(t: Table, req: RequestItem, due_at: int, new_token: str) -> Op:
        """A waiting request of a paused batch: due at `due_at` (its window's end) and out of its model's
        `waiting` count until its batch resumes (`uncounted`; the caller moves the count in the same
        transaction). A new token: a write decided from the request as read before (a claim, a stop's close, a
        purge) is refused and decides again from what it is now, so the count moves once."""
        return t.op_update(*request_key(req["batch_id"], req["index"]),
                           "SET due_at = :at, uncounted = :yes, #token = :new",
                           vals={":at": due_at, ":yes": True, ":new": new_token, ":w": RequestState.WAITING.value,
                                 ":t": req["token"]},
                           condition="#state = :w AND #token = :t AND attribute_not_exists(uncounted)")

    @staticmethod
    def bring_back(t: Table, req: RequestItem, now: int, new_token: str) -> Op:
        """A waiting request a pause put off: due now, and in its model's `waiting` count again (the caller
        moves the count when it was `uncounted`). Fenced on its state and token."""
        return t.op_update(*request_key(req["batch_id"], req["index"]),
                           "SET due_at = :now, #token = :new REMOVE uncounted",
                           vals={":now": now, ":new": new_token, ":w": RequestState.WAITING.value,
                                 ":t": req["token"]},
                           condition="#state = :w AND #token = :t")

    @staticmethod
    def requeue(t: Table, req: RequestItem, new_token: str, now: int) -> Op:
        """A failed or never-started request of a retried batch waits to run again, due at once: its attempts
        count afresh (those it used stay in `earlier_attempts`), and its last error goes, so that it reads as
        queued until its new outcome. Fenced on its state and token."""
        to = request_transition(req["state"], RequestState.WAITING)
        return t.op_update(
            *request_key(req["batch_id"], req["index"]),
            "SET #state = :to, #token = :new, updated_at = :now, due_pk = :due, due_at = :now, attempt = :zero, "
            "earlier_attempts = if_not_exists(earlier_attempts, :zero) + :used "
            "REMOVE #error, slot_lease, budget_shard",
            vals={":to": to.value, ":new": new_token, ":now": now, ":due": retry_due(req["model"]), ":zero": 0,
                  ":used": int(req.get("attempt", 0)), ":expect": req["state"], ":token": req["token"]},
            condition="#state = :expect AND #token = :token")

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
    def drop_waiting(t: Table, req: RequestItem) -> list[Op]:
        """Delete a request waiting for a retry (its batch is being purged), with its place in the model's
        `waiting` count (unless a pause took it out: `uncounted`); fenced on its state and token, so it goes,
        and the count moves, once."""
        drop = t.op_delete(req["pk"], req["sk"], condition="#state = :w AND #token = :t",
                           vals={":w": RequestState.WAITING.value, ":t": req["token"]})
        if req.get("uncounted"):
            return [drop]
        return [drop, t.op_update(*model_budget_key(req["model"], int(req.get("budget_shard", 0))),
                                  "ADD waiting :minus", vals={":minus": -1})]

    @staticmethod
    def waiting_later(t: Table, model_id: str, after: int, until: int) -> Iterator[dict]:
        """The keys (pk, sk, due_at) of the model's waiting requests due after `after` and by `until`."""
        return t.query_all("due_pk = :d AND due_at BETWEEN :a AND :u",
                           {":d": retry_due(model_id), ":a": after + 1, ":u": until}, index="by_due")

    @staticmethod
    def redate(t: Table, key: dict, now: int) -> None:
        """A waiting request due now rather than when it was (ConditionFailed: it moved on meanwhile)."""
        t.update(key["pk"], key["sk"], "SET due_at = :now", vals={":now": now, ":w": RequestState.WAITING.value,
                                                                 ":old": key["due_at"]},
                 names={"#state": "state"}, condition="#state = :w AND due_at = :old")

    @staticmethod
    def due_retries(t: Table, model_id: str, now: int, limit: int) -> list[dict]:
        return due_in(t, (retry_due(model_id),), now, limit)

    @staticmethod
    def due_leases(t: Table, now: int, limit: int) -> list[dict]:
        """Requests, groups and leases whose lease ran out, the most overdue first, from every lease
        partition."""
        return due_in(t, LEASE_PARTITIONS, now, limit)
