"""The sweeper: completion windows, cancel completion, final statuses, retention, lease recovery."""

from __future__ import annotations

import logging

from ..domain import (
    FINAL_BATCH,
    BatchStatus,
    RequestState,
    Stop,
    counts_as_failed_unstarted,
    final_status,
)
from ..layout import (
    LEASE_DUE,
    PURGE_DUE,
    account_key,
    batch_key,
    batch_prefix,
    export_object,
    idempotency_key,
    lane_key,
    request_key,
)
from ..ledger import Settlement, close_group, position_item, settle
from ..runtime import Services
from ..storage.dynamo import ConditionFailed, Throttled

log = logging.getLogger(__name__)

OWNER_UNAUTHORIZED = {"code": "owner_unauthorized",
                      "message": "The API key that created this batch was revoked or has expired, or its "
                                 "account was suspended or deleted."}


def stop_batch(svc: Services, batch: dict, stop: Stop) -> bool:
    """Stop a batch from starting requests. Returns False if it was already stopped or finished."""
    now = svc.now()
    sets = ["#stop = :stop", "stopped_at = :now"]
    vals: dict = {":stop": stop.value, ":now": now, ":v": BatchStatus.VALIDATING.value,
                  ":p": BatchStatus.IN_PROGRESS.value}
    if stop is Stop.CANCEL:
        sets += ["#status = :cancelling", "cancelling_at = :now"]
        vals[":cancelling"] = BatchStatus.CANCELLING.value
    if stop is Stop.FAIL:
        sets.append("#error = :error")
        vals[":error"] = OWNER_UNAUTHORIZED
    # The lanes go in the same transaction, so a stopped batch never keeps a turn at dispatch.
    ops = [svc.table.op_update(*batch_key(batch["id"]), "SET " + ", ".join(sets), vals=vals,
                               condition="attribute_not_exists(#stop) AND #status IN (:v, :p)")]
    ops += [svc.table.op_delete(*lane_key(m, batch["created_at"], batch["id"])) for m in batch["lanes"]]
    try:
        svc.table.transact(ops)
    except ConditionFailed:
        return False
    return True


def _close_waiting(svc: Services, batch: dict, stop: Stop) -> None:
    """Requests waiting to run again when their batch stops: those that never ran become unstarted; those
    that ran keep their last error as their outcome."""
    items = svc.table.query_all("pk = :pk AND begins_with(sk, :r)",
                                {":pk": batch["pk"], ":r": "REQ#", ":w": RequestState.WAITING.value},
                                filter_expression="#state = :w", consistent=True)
    for req in items:
        to = RequestState.UNSTARTED if req.get("attempt", 0) == 0 else RequestState.FAILED
        try:
            settle(svc, req, Settlement(to=to, error=req.get("error") if to is RequestState.FAILED else None),
                   stop=stop)
        except ConditionFailed:
            pass  # a worker or dispatcher moved it first; the next sweep looks again


def settle_batch(svc: Services, batch_id: str) -> dict | None:
    """Give a batch its final status once nothing of it is running or left to start."""
    batch = svc.table.get(*batch_key(batch_id))
    if batch is None or batch["status"] in FINAL_BATCH or batch.get("deleting"):
        return batch
    stop = Stop(batch["stop"]) if batch.get("stop") else None
    if batch.get("in_flight", 0) > 0:
        return batch
    dispatched = sum(lane["next"] for lane in batch["lanes"].values())
    if stop is None and (dispatched < batch["total"] or batch.get("open", 0) > 0):
        return batch
    if stop is not None and batch.get("open", 0) > 0:
        _close_waiting(svc, batch, stop)
        batch = svc.table.get(*batch_key(batch_id))
        if batch.get("open", 0) > 0 or batch.get("in_flight", 0) > 0:
            return batch
    now = svc.now()
    final = final_status(stop)
    export = None
    if batch.get("result_bytes", 0) > svc.settings.export_redirect_bytes:
        # Too large for a Lambda answer: write output.jsonl to S3 now that no result can change.
        from .batches import export_stream

        export = export_object(batch_id)
        svc.blobs.put_stream(export, export_stream(svc, batch), "application/jsonl")
    never_started = batch["total"] - dispatched if counts_as_failed_unstarted(stop) else 0
    expires = now + svc.settings.batch_retention_seconds
    vals = {":final": final.value, ":now": now, ":exp": expires, ":purge": PURGE_DUE, ":never": never_started,
            ":old": batch["status"], ":zero": 0}
    if export:
        vals[":export"] = export
    # The stop must still be the one this decision was made on (a revocation may have just landed).
    if stop is None:
        same_stop = "attribute_not_exists(#stop)"
    else:
        same_stop, vals[":stop"] = "#stop = :stop", stop.value
    ops = [
        svc.table.op_update(
            *batch_key(batch_id),
            f"SET #status = :final, {final.value}_at = :now, results_expires_at = :exp, due_pk = :purge, "
            "due_at = :exp" + (", export_object = :export" if export else "")
            + " ADD failed :never REMOVE active_pk, active_sk",
            vals=vals,
            condition=f"#status = :old AND in_flight = :zero AND #open = :zero AND attribute_not_exists(deleting) "
                      f"AND {same_stop}"),
        svc.table.op_update(*account_key(batch["account_id"]),
                            "ADD unfinished_batches :minus, unfinished_requests :minus_total",
                            vals={":minus": -1, ":minus_total": -batch["total"]}),
    ]
    if batch.get("idempotency_key"):  # the key is remembered until a day after its batch ends
        remember_until = now + svc.settings.idempotency_retention_seconds
        ops.append(svc.table.op_update(*idempotency_key(batch["account_id"], batch["idempotency_key"]),
                                       "SET #ttl = :ttl", vals={":ttl": remember_until}))
    try:
        svc.table.transact(ops)
    except ConditionFailed:
        return svc.table.get(*batch_key(batch_id))
    return svc.table.get(*batch_key(batch_id))


def purge_batch(svc: Services, batch: dict, retention_ended: bool = False) -> None:
    """Delete a batch with its requests and results (by the user, or when its retention ends).
    Raises ConditionFailed while one of its requests holds a slot.

    When the retention ends, the request items are left to their TTL (see ledger._items_ttl): they cannot be
    reached once the batch item is gone, and a TTL delete costs no write units where deleting them here
    would cost one per request."""
    now = svc.now()
    unfinished = batch["status"] not in FINAL_BATCH
    ops = [svc.table.op_update(
        *batch_key(batch["id"]), "SET deleting = :yes, #stop = if_not_exists(#stop, :cancel) REMOVE active_pk",
        vals={":yes": True, ":cancel": Stop.CANCEL.value, ":zero": 0},
        condition="attribute_exists(pk) AND in_flight = :zero AND attribute_not_exists(deleting)")]
    if unfinished:
        ops.append(svc.table.op_update(*account_key(batch["account_id"]),
                                       "ADD unfinished_batches :minus, unfinished_requests :minus_total",
                                       vals={":minus": -1, ":minus_total": -batch["total"]}))
    svc.table.transact(ops)
    for model_id in batch["lanes"]:
        svc.table.delete(*lane_key(model_id, batch["created_at"], batch["id"]))
    if not retention_ended:
        keys = [(i["pk"], i["sk"]) for i in svc.table.query_all("pk = :pk AND begins_with(sk, :r)",
                                                               {":pk": batch["pk"], ":r": "REQ#"}, consistent=True)]
        svc.table.delete_many(keys)
    svc.blobs.delete_prefix(batch_prefix(batch["id"]))
    if batch.get("idempotency_key"):
        try:
            remember_until = now + svc.settings.idempotency_retention_seconds
            svc.table.update(*idempotency_key(batch["account_id"], batch["idempotency_key"]),
                             "SET deleted = :yes, #ttl = :ttl", vals={":yes": True, ":ttl": remember_until},
                             condition="attribute_exists(pk)")
        except ConditionFailed:
            pass
    svc.table.delete(*batch_key(batch["id"]))


LOST = {"code": "timeout", "message": "The worker running this request stopped before it answered."}


def _recover_group(svc: Services, group: dict) -> None:
    """A group whose lease ran out. Members whose outcome was written are counted from their items; the
    others wait to run again, alone. If the group had started, those may have run: their cost is unknown
    and they used up an attempt."""
    now = svc.now()
    started = group["state"] == RequestState.RUNNING.value
    keys = [request_key(group["batch_id"], p[0]) for p in group["positions"]]
    found = svc.table.get_many(keys) if started else {}
    written, new = [], []
    for key, position in zip(keys, group["positions"], strict=True):
        item = found.get(key)
        if item is not None and item.get("group_token") == group["token"]:
            written.append(item)
            continue
        if not started:
            outcome, attempt = Settlement(to=RequestState.WAITING, retry_at=now), 0
        elif svc.settings.max_attempts <= 1:
            outcome, attempt = Settlement(to=RequestState.FAILED, error=LOST, cost_unknown=1), 1
        else:
            outcome, attempt = Settlement(to=RequestState.WAITING, error=LOST, cost_unknown=1, retry_at=now), 1
        new.append(position_item(svc, group, position, outcome, attempt))
    close_group(svc, group, written, new)


def recover_leases(svc: Services, limit: int = 100) -> int:
    """Requests (and groups) whose lease ran out: the message was lost or the worker died. Put them back."""
    now = svc.now()
    items, _ = svc.table.query("due_pk = :d AND due_at <= :now", {":d": LEASE_DUE, ":now": now},
                               index="by_due", limit=limit)
    recovered = 0
    for stale in items:
        req = svc.table.get(stale["pk"], stale["sk"])
        if not req or req.get("due_pk") != LEASE_DUE or req["due_at"] > now:
            continue
        if "positions" in req:
            try:
                _recover_group(svc, req)
                recovered += len(req["positions"])
            except (ConditionFailed, Throttled):
                pass  # ended or written meanwhile, or DynamoDB is busy: the next pass looks again
            continue
        if req["state"] == RequestState.RUNNING.value:
            # The backend may have run it: its cost is unknown, and it used up an attempt.
            if req.get("attempt", 0) >= svc.settings.max_attempts:
                outcome = Settlement(to=RequestState.FAILED, error=req.get("error") or LOST, cost_unknown=1)
            else:
                outcome = Settlement(to=RequestState.WAITING, error=req.get("error") or LOST, cost_unknown=1,
                                     retry_at=now)
        else:
            outcome = Settlement(to=RequestState.WAITING, retry_at=now)
        try:
            settle(svc, req, outcome)
            recovered += 1
        except (ConditionFailed, Throttled):
            continue  # moved on meanwhile, or DynamoDB is busy: the next pass looks again
    return recovered


def sweep_once(svc: Services) -> dict:
    """One pass of the sweeper. Safe to run in several places at once: every change is conditional."""
    now = svc.now()
    try:
        recovered = recover_leases(svc)
    except Throttled:
        recovered = 0
    counts = {"recovered": recovered, "settled": 0, "expired": 0, "purged": 0}
    for item in svc.table.query_all("active_pk = :a", {":a": "ACTIVE"}, index="by_active"):
        try:
            counts_for = _sweep_batch(svc, item["id"], now)
        except Throttled:
            log.warning("throttled while sweeping batch %s; next pass", item["id"])
            continue
        for name in counts_for:
            counts[name] += 1
    due, _ = svc.table.query("due_pk = :d AND due_at <= :now", {":d": PURGE_DUE, ":now": now},
                             index="by_due", limit=50)
    for item in due:
        batch = svc.table.get(item["pk"], item["sk"])
        if batch:
            try:
                purge_batch(svc, batch, retention_ended=True)
                counts["purged"] += 1
            except (ConditionFailed, Throttled):
                log.warning("batch %s could not be purged yet", batch["id"])
    return counts


def _sweep_batch(svc: Services, batch_id: str, now: int) -> list[str]:
    """Settle one unfinished batch; expire it if its window closed with requests not yet started."""
    done: list[str] = []
    after = settle_batch(svc, batch_id)
    if after is None or after["status"] in FINAL_BATCH:
        return ["settled"] if after else []
    dispatched = sum(lane["next"] for lane in after["lanes"].values())
    if not after.get("stop") and now >= after["expires_at"] and dispatched < after["total"]:
        if stop_batch(svc, after, Stop.EXPIRE):
            done.append("expired")
        after = settle_batch(svc, batch_id)
        if after and after["status"] in FINAL_BATCH:
            done.append("settled")
    return done
