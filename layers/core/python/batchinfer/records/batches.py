"""The batch and what its creation leaves: the batch item (status, lanes, counters) and its lanes in the
model's turn (the Idempotency-Key that created it: `records.idempotency`)."""

from __future__ import annotations

from collections.abc import Iterator

from ..domain import (
    FINAL_BATCH,
    PAUSABLE_BATCH,
    STOPPABLE_BATCH,
    UNFINISHED_BATCH,
    BatchStatus,
    IllegalTransition,
    Stop,
    batch_transition,
    batches_that_may_become,
)
from ..layout import (
    ACTIVE_PARTITIONS,
    LANES_END,
    PURGE_PARTITIONS,
    active_partition,
    batch_key,
    lane_key,
    lanes_of,
    owner_partition,
    owner_sort,
    purge_due,
)
from ..spending import EPSILON_USD
from ..storage.dynamo import ConditionFailed, Table
from .expressions import Op, _add_op, _in, due_in
from .items import BatchExtras, BatchItem

# The tally of a batch's consecutive sweep failures (`Batch.count_step_failure`): gone once it ends or runs again.
STEP_FAILURE_FIELDS = ("step_failures", "step_failed", "step_failed_at")


class Batch:
    """The batch item: status, lanes, counters; under `by_owner` always, `by_active` while unfinished and
    `by_due` (PURGE) once its retention clock runs."""

    @staticmethod
    def new(*, batch_id: str, account_id: str, key_hash: str, endpoint: str, now: int, expires_at: int,
            metadata: dict | None, lanes: dict[str, int], owner_created_us: int, idempotency_key: str | None,
            extras: BatchExtras | None = None, rejected: int = 0, status: BatchStatus = BatchStatus.VALIDATING
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
        if extras is not None:
            extras.write_into(item)
        return item

    @staticmethod
    def get(t: Table, batch_id: str) -> BatchItem | None:
        return t.get(*batch_key(batch_id))  # type: ignore[return-value]

    @staticmethod
    def create(t: Table, item: BatchItem) -> Op:
        return t.op_put(item, condition="attribute_not_exists(pk)")

    @staticmethod
    def claim_lane(t: Table, batch: BatchItem, model_id: str, lane_next: int, k: int, now: int,
                   commit_usd: float | None = None) -> Op:
        """Advance the model's lane by k dispatched requests; the batch is in progress from then on.
        Fenced on the lane's position (one claimant wins) and on the batch still running. `commit_usd`: the
        claimed requests' worst case, committed against the batch's spending cap (`_commit`)."""
        status = batch_transition(batch["status"], BatchStatus.IN_PROGRESS)
        # An ended batch runs again only through a retry, never through a claim.
        may, may_vals = _in("status", (batches_that_may_become(status) - FINAL_BATCH) | {status})
        add, fence, vals = Batch._commit(batch, commit_usd)
        return t.op_update(
            *batch_key(batch["id"]),
            "SET lanes.#m.#next = :new, #status = :running, in_progress_at = if_not_exists(in_progress_at, :now) "
            "ADD in_flight :k, #open :k" + add,
            vals={":new": lane_next + k, ":old": lane_next, ":running": status.value, ":now": now, ":k": k,
                  **may_vals, **vals},
            names={"#m": model_id},
            condition="lanes.#m.#next = :old AND attribute_not_exists(#stop) AND attribute_not_exists(deleting) "
                      f"AND attribute_not_exists(paused_at) AND expires_at > :now AND {may}" + fence)

    @staticmethod
    def _commit(batch: BatchItem, worst_usd: float | None) -> tuple[str, str, dict]:
        """(ADD clause, condition, values) that commit `worst_usd` against the batch's spending cap: fenced on
        `committed_usd <= cap - worst_usd` (a condition cannot add attributes) and on the cap it was computed
        from (a raise since then only means the claimer asks again)."""
        if worst_usd is None or batch.get("max_cost_usd") is None:
            return "", "", {}
        cap = float(batch["max_cost_usd"])
        return (", committed_usd :worst", " AND max_cost_usd = :cap AND committed_usd <= :limit",
                {":worst": worst_usd, ":cap": cap, ":limit": cap - worst_usd - EPSILON_USD})

    @staticmethod
    def commit(t: Table, batch: BatchItem, worst_usd: float) -> Op:
        """Commit `worst_usd` against the batch's spending cap on its own (a provider job's worst case before it
        is submitted), fenced as a claim's commit is and on the batch not stopped."""
        add, fence, vals = Batch._commit(batch, worst_usd)
        return t.op_update(*batch_key(batch["id"]), "ADD" + add.removeprefix(","), vals=vals,
                           condition="attribute_not_exists(#stop) AND attribute_not_exists(deleting)" + fence)

    @staticmethod
    def set_cap(t: Table, batch_id: str, cap: float) -> None:
        """Raise (or set) the batch's spending cap: what a retry of its failed requests with a higher cap
        does before it queues them. Never below what it has committed already."""
        t.update(*batch_key(batch_id), "SET max_cost_usd = :cap, committed_usd = if_not_exists(committed_usd, :zero)",
                 vals={":cap": cap, ":zero": 0.0},
                 condition="attribute_exists(pk) AND (attribute_not_exists(committed_usd) OR committed_usd <= :cap)")

    @staticmethod
    def set_priority(t: Table, batch_id: str, priority: str, seen: BatchItem | None = None) -> Op:
        """The batch's priority within its account, while it has not ended (nor is being deleted). `seen`: the
        batch as read, whose lane items the same transaction changes: fenced on its lanes being as it was
        then (still awaiting validation or not, paused or not), so that lanes made meanwhile are not missed."""
        final, vals = _in("status", FINAL_BATCH)
        condition = f"attribute_exists(pk) AND attribute_not_exists(deleting) AND NOT {final}"
        if seen is not None:
            condition += " AND " + ("awaiting_validation = :yes" if seen.get("awaiting_validation")
                                    else "attribute_not_exists(awaiting_validation)")
            if seen.get("paused_at"):
                condition += " AND paused_at = :paused"
                vals[":paused"] = seen["paused_at"]
            else:
                condition += " AND attribute_not_exists(paused_at)"
            if seen.get("awaiting_validation"):
                vals[":yes"] = True
        return t.op_update(*batch_key(batch_id), "SET #priority = :p", vals={":p": priority, **vals},
                           condition=condition)

    @staticmethod
    def _same_priority(seen: BatchItem) -> tuple[str, dict]:
        """A condition that the batch's priority is still the one `seen` read: what makes lanes from it (a
        validation, a resume) carries it to them, so a change committed meanwhile must refuse the write."""
        if seen.get("priority"):
            return " AND #priority = :seen_priority", {":seen_priority": seen["priority"]}
        return " AND attribute_not_exists(#priority)", {}

    @staticmethod
    def may_start(t: Table, batch_id: str, now: int, first_attempt: bool) -> Op:
        """The check a start makes on its batch: not stopped, not paused, not being deleted, and for a first
        attempt the window still open (the window only stops requests from starting)."""
        if first_attempt:
            return t.op_check(*batch_key(batch_id), "attribute_not_exists(#stop) AND attribute_not_exists("
                              "deleting) AND attribute_not_exists(paused_at) AND expires_at > :now", vals={":now": now})
        return t.op_check(*batch_key(batch_id), "attribute_not_exists(#stop) AND attribute_not_exists(deleting) "
                          "AND attribute_not_exists(paused_at)")

    @staticmethod
    def take_retry_slot(t: Table, batch_id: str, capped: BatchItem | None = None, worst_usd: float | None = None,
                        k: int = 1, window_open_at: int | None = None) -> Op:
        """`k` retries' slots on their batch; `capped`: its batch as read, whose spending cap `worst_usd` (theirs
        together) is committed against (see `claim_lane`); `window_open_at`: retries started in their claim,
        one of which never ran, are fenced on the window still open then, as a first attempt's start is."""
        add, fence, vals = Batch._commit(capped, worst_usd) if capped else ("", "", {})
        if window_open_at is not None:
            fence += " AND expires_at > :now"
            vals[":now"] = window_open_at
        return t.op_update(*batch_key(batch_id), "ADD in_flight :k" + add, vals={":k": k, **vals},
                           condition="attribute_not_exists(#stop) AND attribute_not_exists(deleting) "
                                     "AND attribute_not_exists(paused_at)" + fence)

    @staticmethod
    def pause(t: Table, batch_id: str, now: int, walk: dict | None = None) -> Op:
        """Pause a batch: it starts no request until resumed. Fenced on it not being paused, stopped or
        deleted, and on a status that may still start requests (pausing is a flag, not a status). `walk`: the
        walk over its waiting requests it starts (`pause_walk`, service.steering.pausing)."""
        pausable, vals = _in("status", PAUSABLE_BATCH)
        return t.op_update(*batch_key(batch_id), "SET paused_at = :now, pause_walk = :walk",
                           vals={**vals, ":now": now, ":walk": walk or {}},
                           condition="attribute_not_exists(paused_at) AND attribute_not_exists(#stop) "
                                     f"AND attribute_not_exists(deleting) AND {pausable}")

    @staticmethod
    def resume(t: Table, batch_id: str, paused_at: int, walk: dict | None = None, seen: BatchItem | None = None
               ) -> Op:
        """Resume the batch paused at `paused_at` (fenced on that pause, and on it not stopped or deleted);
        `walk`: the walk over its waiting requests it starts, in place of the pause's; `seen`: the batch as
        read, whose lanes the same transaction makes again (fenced on its priority)."""
        same, vals = Batch._same_priority(seen) if seen is not None else ("", {})
        return t.op_update(*batch_key(batch_id), "SET pause_walk = :walk REMOVE paused_at",
                           vals={":at": paused_at, ":walk": walk or {}, **vals},
                           condition="paused_at = :at AND attribute_not_exists(#stop) "
                                     "AND attribute_not_exists(deleting)" + same)

    @staticmethod
    def pause_walk_step(t: Table, batch_id: str, walk_id: str, cursor: str | None, new_cursor: str | None) -> Op:
        """One step of a pause's (or resume's) walk over the batch's waiting requests: its cursor moved past
        what it read (`new_cursor`; None: the walk is over and goes). Fenced on the walk (a pause or resume
        since starts another) and its cursor (two walkers move one step once), and on the batch being neither
        stopped nor deleted."""
        vals: dict = {":w": walk_id}
        if new_cursor is None:
            expression = "REMOVE pause_walk"
        else:
            expression, vals[":new"] = "SET pause_walk.#cursor = :new", new_cursor
        if cursor is None:
            at = "attribute_not_exists(pause_walk.#cursor)"
        else:
            at, vals[":at"] = "pause_walk.#cursor = :at", cursor
        return t.op_update(*batch_key(batch_id), expression, vals=vals,
                           condition=f"pause_walk.#id = :w AND {at} AND attribute_not_exists(#stop) "
                                     "AND attribute_not_exists(deleting)")

    @staticmethod
    def end_pause_walk(t: Table, batch_id: str, walk_id: str) -> None:
        """A pause's walk ends early: its batch stopped, ended or is being deleted (what still waits is closed
        with the batch)."""
        t.update(*batch_key(batch_id), "REMOVE pause_walk", vals={":w": walk_id}, condition="pause_walk.#id = :w")

    @staticmethod
    def still_paused(t: Table, batch_id: str) -> Op:
        """The check a write made because the batch is paused makes: it still is."""
        return t.op_check(*batch_key(batch_id), Batch.STILL_PAUSED)

    # The same check, as the condition of a write to the batch in that transaction (one op per item).
    STILL_PAUSED = "attribute_exists(paused_at) AND attribute_not_exists(#stop)"

    @staticmethod
    def add(t: Table, batch_id: str, counters: dict[str, float]) -> Op | None:
        return _add_op(t, batch_key(batch_id), counters)

    @staticmethod
    def stop(t: Table, batch_id: str, stop: Stop, now: int, error: dict | None = None, listed: bool = False) -> Op:
        """Stop a batch from starting requests; a cancel also makes it cancelling. Fenced on it being
        stoppable and not stopped yet. `listed`: the error goes in its `errors` list too (the OpenAI batch
        object's list), for a failure of the whole batch that is no one line's."""
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
        if error is not None and listed:
            sets.append("#errors = :errors")
            vals[":errors"] = {"object": "list", "data": [{**error, "param": None, "line": None}]}
        return t.op_update(*batch_key(batch_id), "SET " + ", ".join(sets), vals=vals,
                           condition=f"attribute_not_exists(#stop) AND {stoppable}")

    @staticmethod
    def finalize(t: Table, batch: BatchItem, final: BatchStatus, stop: Stop | None, now: int,
                 retention_ends: int, never_started_failed: int, export: str | None,
                 sets: dict | None = None, never_started: int = 0) -> Op:
        """Give the batch its final status, start its retention clock (`by_due` PURGE) and leave
        `by_active`. Fenced on the status, the stop and the run (retry count) the decision was made on, and on
        nothing of it running or open. `sets`: more fields the ending gives it (result files, validation
        errors).

        An ending adds the never-started requests to the counts and gives the account its unfinished batch
        back, so it happens once per run: `batch` must be read before it ended (IllegalTransition otherwise).
        A settle that reads the batch again after another settler ended it would, fenced on the ended status
        it read, match and count everything a second time; fenced on the retry count, a settle decided before
        a retry in place cannot end the run the retry started."""
        if BatchStatus(batch["status"]) in FINAL_BATCH:
            raise IllegalTransition(f"batch {batch['id']} has ended already ({batch['status']})")
        final = batch_transition(batch["status"], final)
        seen = int(batch.get("retry_count", 0))
        vals = {":final": final.value, ":now": now, ":exp": retention_ends, ":purge": purge_due(batch["id"]),
                ":never": never_started_failed, ":unstarted": never_started, ":old": batch["status"], ":zero": 0}
        if seen:
            same_run, vals[":seen"] = "retry_count = :seen", seen
        else:
            same_run = "attribute_not_exists(retry_count)"
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
            + " ADD failed :never, unstarted :unstarted REMOVE active_pk, active_sk, awaiting_validation, "
            + ", ".join(STEP_FAILURE_FIELDS),
            vals=vals,
            condition="#status = :old AND in_flight = :zero AND #open = :zero AND attribute_not_exists(deleting) "
                      f"AND {same_stop} AND {same_run}")

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
        """Room for the cursors of the batch's resumable writers (service.background.finalize)."""
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
    def validated(t: Table, batch_id: str, lanes: dict[str, int], now: int, paused: bool = False,
                  seen: BatchItem | None = None, ordered: bool = False) -> Op:
        """A file batch whose every line is valid: its requests may now be dispatched. Fenced on it being
        paused or not as `paused` says (a paused one gets its lanes when it is resumed), and on the priority
        of `seen` (the batch as read, from which the same transaction makes its lanes). `ordered`: its lanes
        are in prefix order (`lane_ordered`: their lane objects say the order)."""
        same, vals = Batch._same_priority(seen) if seen is not None else ("", {})
        if ordered:
            vals = {**vals, ":ordered": True}
        return t.op_update(*batch_key(batch_id), "SET #total = :n, lanes = :lanes, validated_at = :now"
                           + (", lane_ordered = :ordered" if ordered else "") + " REMOVE awaiting_validation",
                           vals={":n": sum(lanes.values()), ":lanes": {m: {"next": 0, "total": n}
                                                                       for m, n in lanes.items()},
                                 ":now": now, ":v": BatchStatus.VALIDATING.value, ":yes": True, **vals},
                           condition="#status = :v AND awaiting_validation = :yes AND attribute_not_exists(#stop) "
                                     "AND attribute_not_exists(deleting) AND "
                                     + ("attribute_exists(paused_at)" if paused else "attribute_not_exists(paused_at)")
                                     + same)

    @staticmethod
    def retry(t: Table, batch: BatchItem, *, now: int, expires_at: int, window_seconds: int, keep_until: int,
              retrying: dict,
              uncount: dict[str, int], parked: str | None, forget_idempotency_key: bool,
              cap: float | None = None) -> Op:
        """An ended batch runs again (retry in place, service.steering.retry): in progress with a new window, back in
        `by_active`, its ending undone (ending times, retention clock, stop, result files and export no longer
        named) and `retrying` holding the walk that re-queues its requests. `uncount`: what the never-dispatched
        requests re-queued with their lanes leave (failed, unstarted); `parked`: the stop under which the
        never-dispatched requests that stay as they are ended (None: none stay); `keep_until`: the latest its
        retention may end (its first request items' TTL, less a day). Fenced on the status and retry count it
        was decided from, and on nothing of it open."""
        to = batch_transition(batch["status"], BatchStatus.IN_PROGRESS)
        removes = ["#stop", "stopped_at", "paused_at", "cancelling_at", "finalizing_at", "results_expires_at", "due_pk",
                   "due_at", "#error", "export_object", "output_file_id", "error_file_id", "result_file_ids",
                   "writing", "pause_walk", "unstarted_by", *sorted(f"{s.value}_at" for s in FINAL_BATCH),
                   *STEP_FAILURE_FIELDS]
        if any(e.get("code") == "internal_error" for e in (batch.get("errors") or {}).get("data") or []):
            removes.append("#errors")  # the failure of its last run, not of its lines: it runs again
        sets = ["#status = :to", "expires_at = :exp", "active_pk = :apk", "active_sk = :id",
                "retrying = :retrying", "retry_count = if_not_exists(retry_count, :zero) + :one",
                "keep_until = if_not_exists(keep_until, :keep)",
                "window_seconds = if_not_exists(window_seconds, :window)", "retried_at = :now"]
        vals = {":to": to.value, ":exp": expires_at, ":apk": active_partition(batch["id"]), ":id": batch["id"],
                ":retrying": retrying, ":zero": 0, ":one": 1, ":keep": keep_until,
                ":window": window_seconds, ":now": now, ":old": batch["status"],
                ":seen": int(batch.get("retry_count", 0)), ":failed": -uncount.get("failed", 0),
                ":unstarted": -uncount.get("unstarted", 0)}
        if parked is None:
            removes.append("parked")
        else:
            sets.append("parked = :parked")
            vals[":parked"] = parked
        if cap is not None:  # a raised spending cap (service.steering.retry checks it is not below what was spent)
            sets.append("max_cost_usd = :cap")
            vals[":cap"] = cap
        if forget_idempotency_key:  # its record is gone: the next ending must not write one back
            removes.append("idempotency_key")
        return t.op_update(
            *batch_key(batch["id"]),
            "SET " + ", ".join(sets) + " ADD failed :failed, unstarted :unstarted REMOVE " + ", ".join(removes),
            vals=vals,
            condition="#status = :old AND in_flight = :zero AND #open = :zero AND attribute_not_exists(deleting) "
                      "AND attribute_not_exists(retrying) AND "
                      + ("retry_count = :seen" if vals[":seen"] else "attribute_not_exists(retry_count)"))

    @staticmethod
    def requeue_step(t: Table, batch_id: str, retry: int, cursor: str | None, new_cursor: str | None,
                     counters: dict[str, int]) -> Op:
        """One step of a retry's walk over the batch's request items: its cursor moved past the items read
        (`new_cursor`; None: the walk is over and `retrying` goes), with the counters the requests it re-queued
        move. Fenced on the walk and its cursor (two walkers move one step once) and on the batch being neither
        stopped nor deleted meanwhile (a stopped batch re-queues nothing more)."""
        vals: dict = {":n": retry, **{f":{k.lstrip('#')}": v for k, v in counters.items()}}
        adds = [f"{k} :{k.lstrip('#')}" for k in counters]
        if new_cursor is None:
            expression = "REMOVE retrying"
        else:
            expression, vals[":new"] = "SET retrying.#cursor = :new", new_cursor
        if adds:
            expression += " ADD " + ", ".join(adds)
        if cursor is None:
            at = "attribute_not_exists(retrying.#cursor)"
        else:
            at, vals[":at"] = "retrying.#cursor = :at", cursor
        return t.op_update(*batch_key(batch_id), expression, vals=vals,
                           condition=f"retrying.#n = :n AND {at} AND attribute_not_exists(#stop) "
                                     "AND attribute_not_exists(deleting)")

    @staticmethod
    def file_never_dispatched(t: Table, batch: BatchItem, model_id: str, lane_next: int, new_next: int) -> Op:
        """An ended batch's lane moves past never-dispatched requests filed as request items (in the same
        transaction: service.steering.never_dispatched). Fenced on the lane's cursor, on the status it ended
        with, and on the batch being neither retried nor deleted meanwhile."""
        return t.op_update(*batch_key(batch["id"]), "SET lanes.#m.#next = :new",
                           vals={":new": new_next, ":old": lane_next, ":status": batch["status"]},
                           names={"#m": model_id},
                           condition="lanes.#m.#next = :old AND #status = :status AND attribute_not_exists(retrying) "
                                     "AND attribute_not_exists(deleting)")

    @staticmethod
    def end_requeue(t: Table, batch_id: str, retry: int) -> None:
        """A retry's walk ends early: its batch was stopped (or is being deleted) meanwhile."""
        t.update(*batch_key(batch_id), "REMOVE retrying", vals={":n": retry}, condition="retrying.#n = :n")

    @staticmethod
    def count_step_failure(t: Table, batch_id: str, step: str, now: int) -> int:
        """One more consecutive failure of the sweeper's work on an unfinished batch (`step`: where it raised),
        counted on the batch itself, so every sweeper counts the same tally. Returns the tally; 0 when the batch
        is gone, ended or being deleted."""
        unfinished, vals = _in("status", UNFINISHED_BATCH)
        vals.update({":one": 1, ":step": step, ":now": now})
        try:
            after = t.update(*batch_key(batch_id), "SET step_failed = :step, step_failed_at = :now "
                             "ADD step_failures :one", vals=vals, return_new=True,
                             condition=f"attribute_exists(pk) AND attribute_not_exists(deleting) AND {unfinished}")
        except ConditionFailed:
            return 0
        return int((after or {}).get("step_failures", 0))

    @staticmethod
    def clear_step_failures(t: Table, batch_id: str) -> None:
        """The sweeper's work on the batch went through: its tally of consecutive failures starts again."""
        try:
            t.update(*batch_key(batch_id), "REMOVE " + ", ".join(STEP_FAILURE_FIELDS),
                     condition="attribute_exists(step_failures)")
        except ConditionFailed:
            pass  # cleared by another sweeper

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
                           projection="pk, sk, #state, #token, model, uncounted")
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
    def unfinished_of_owner(t: Table, account_id: str) -> list[dict]:
        """An account's unfinished batches, every protocol's."""
        return list(t.query_all("owner_pk = :o", {":o": owner_partition(account_id)}, index="by_owner",
                                filter_expression="attribute_exists(active_pk)"))

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
                         "model": model_id, **({"priority": batch["priority"]} if batch.get("priority") else {})})

    @staticmethod
    def set_priority(t: Table, model_id: str, batch: BatchItem, priority: str) -> Op:
        """The lane's priority within its account (its batch's), fenced on the lane still being there."""
        return t.op_update(*lane_key(model_id, batch["created_at"], batch["id"]), "SET #priority = :p",
                           vals={":p": priority}, condition="attribute_exists(pk)")

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
