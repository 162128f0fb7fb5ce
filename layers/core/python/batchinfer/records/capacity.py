"""A model's capacity: its budget of batch slots (split over shards), the interactive requests counted on it,
and the slot leases workers hold; with what reads which shards a holder's slots came from."""

from __future__ import annotations

from ..layout import interactive_lease_key, lease_due, model_budget_key, slot_lease_key
from ..storage.dynamo import Table
from .expressions import Op, _add_op
from .items import GroupItem


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
    def note_latency(t: Table, model_id: str, call_seconds: float, now: int) -> None:
        """The mean duration of the model's recent backend calls (shard 0; `call_seconds_at`: when noted)."""
        t.update(*model_budget_key(model_id), "SET call_seconds = :s, call_seconds_at = :at",
                 vals={":s": round(call_seconds, 4), ":at": now})

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


def group_shards(group: GroupItem) -> dict[int, int]:
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
    keeps that many backend calls in flight from requests it claimed (`scheduling.pump.SlotPump`). Groups and
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
