"""A provider job (service.offloading): the record of one job on a provider's batch tier, kept in its batch's
partition, written before the provider's job is made; and the expressions that move requests between a
model's lane, a job and the direct path.

A request is in exactly one place: its lane until a job's fill advances the lane's cursor past it (in the
same transaction its request item is written held by the job: waiting, out of the `by_due` index and out of
the model's `waiting` count, `job` naming the job); then the job's, until its outcome is landed through the
ledger or it is handed back to run directly (due at once, counted as waiting). The batch's `offloaded` counts
the requests held by jobs; a batch does not settle while any is. A request landed from its job has `tier_job`
(it ran at the tier's price) and an empty `job`; one handed back loses `job`."""

from __future__ import annotations

from collections.abc import Iterator

from ..domain import RequestState
from ..layout import REQUEST_PREFIX, batch_key, request_key, retry_due
from ..storage.dynamo import Table
from .expressions import Op, due_in
from .items import BatchItem, RequestItem

JOB_DUE = "PJOB"  # the `by_due` partition of provider jobs, due when they are to be looked at next
JOB_PREFIX = "PJOB#"  # sort keys of a batch's provider jobs


def job_key(batch_id: str, model_id: str, seq: int) -> tuple[str, str]:
    return batch_key(batch_id)[0], f"{JOB_PREFIX}{model_id}#{seq:04d}"


class ProviderJob:
    """state: planned (the record exists, its requests still in the lane) -> filling -> submitting (its
    requests held, the provider's job being made) -> running (the provider's id known) -> collecting (the
    provider's job ended: its answers landed a page at a time) -> handing_back (what it did not finish goes
    to run directly) -> done."""

    @staticmethod
    def new(batch: BatchItem, model_id: str, seq: int, lane_from: int, count: int, now: int) -> dict:
        pk, sk = job_key(batch["id"], model_id, seq)
        return {"pk": pk, "sk": sk, "batch_id": batch["id"], "account_id": batch["account_id"], "model": model_id,
                "endpoint": batch["endpoint"], "state": "planned", "lane_from": lane_from, "count": count,
                "filled": 0, "created_at": now, "due_pk": JOB_DUE, "due_at": now, "version": 0}

    @staticmethod
    def create(t: Table, job: dict) -> Op:
        return t.op_put(job, condition="attribute_not_exists(pk)")

    @staticmethod
    def get(t: Table, pk: str, sk: str) -> dict | None:
        return t.get(pk, sk)

    @staticmethod
    def due(t: Table, now: int, limit: int) -> list[dict]:
        return due_in(t, (JOB_DUE,), now, limit)

    @staticmethod
    def of_batch(t: Table, batch_id: str) -> list[dict]:
        return list(t.query_all("pk = :pk AND begins_with(sk, :j)", {":pk": batch_key(batch_id)[0],
                                                                     ":j": JOB_PREFIX}, consistent=True))

    @staticmethod
    def change(t: Table, job: dict, sets: dict, done: bool = False) -> Op:
        """Set `sets` on the job, fenced on the version it was read at (one writer wins); `done`: out of
        `by_due`, never looked at again."""
        names = {f"#{k}": k for k in sets}
        vals = {f":{k}": v for k, v in sets.items()}
        clause = ", ".join(f"#{k} = :{k}" for k in sets)
        clause = f"SET {clause}, #version = :next" if clause else "SET #version = :next"
        if done:
            clause += " REMOVE due_pk, due_at"
        return t.op_update(job["pk"], job["sk"], clause, names=names or None,
                           vals={**vals, ":next": int(job["version"]) + 1, ":seen": int(job["version"])},
                           condition="#version = :seen")

    @staticmethod
    def claim_lane(t: Table, batch: BatchItem, model_id: str, lane_next: int, k: int, now: int) -> Op:
        """Advance the model's lane by k requests taken into a job (they hold no slot: `open` and `offloaded`
        count them). Fenced on the lane's cursor and on the batch running, as a dispatcher's claim is."""
        return t.op_update(
            *batch_key(batch["id"]),
            "SET lanes.#m.#next = :new, #status = :running, in_progress_at = if_not_exists(in_progress_at, :now) "
            "ADD #open :k, offloaded :k",
            vals={":new": lane_next + k, ":old": lane_next, ":running": "in_progress", ":now": now, ":k": k,
                  ":v": "validating"},
            names={"#m": model_id},
            condition="lanes.#m.#next = :old AND attribute_not_exists(#stop) AND attribute_not_exists(deleting) "
                      "AND attribute_not_exists(paused_at) AND expires_at > :now AND #status IN (:v, :running)")

    @staticmethod
    def held_item(batch: BatchItem, model_id: str, job_sk: str, index: int, custom_id: str, offset: int,
                  length: int, token: str, now: int, ttl: int) -> RequestItem:
        """A request taken into a job: waiting, out of `by_due` and of the model's `waiting` count."""
        pk, sk = request_key(batch["id"], index)
        return {"pk": pk, "sk": sk, "batch_id": batch["id"], "index": index, "custom_id": custom_id,  # type: ignore[typeddict-unknown-key]
                "model": model_id, "account_id": batch["account_id"], "offset": offset, "length": length,
                "state": RequestState.WAITING.value, "token": token, "attempt": 0, "created_at": now,
                "updated_at": now, "ttl": ttl, "uncounted": True, "job": job_sk}

    @staticmethod
    def held(t: Table, job: dict, limit: int | None = None) -> Iterator[RequestItem]:
        """The job's requests still held by it (not landed, not handed back)."""
        items = t.query_all("pk = :pk AND begins_with(sk, :r)",
                            {":pk": job["pk"], ":r": REQUEST_PREFIX, ":j": job["sk"],
                             ":w": RequestState.WAITING.value},
                            filter_expression="#job = :j AND #state = :w", consistent=True)
        for n, item in enumerate(items):
            if limit is not None and n >= limit:
                return
            yield item  # type: ignore[misc]

    @staticmethod
    def hand_back(t: Table, req: RequestItem, now: int, new_token: str, attempt: int, error: dict | None,
                  worst_usd: float | None = None) -> Op:
        """A held request goes to run directly: due at once, in the model's `waiting` count again (the caller
        adds it), out of the job. Fenced on its token. `worst_usd`: in a capped batch, its worst case at the
        model's price, which its claim to run directly commits against the cap."""
        sets = "SET due_pk = :due, due_at = :now, #token = :new, attempt = :a, updated_at = :now"
        vals = {":due": retry_due(req["model"]), ":now": now, ":new": new_token, ":a": attempt,
                ":w": RequestState.WAITING.value, ":t": req["token"], ":j": req["job"]}  # type: ignore[typeddict-item]
        if error is not None:
            sets += ", #error = :e"
            vals[":e"] = error
        if worst_usd is not None:
            sets += ", worst_usd = :worst"
            vals[":worst"] = worst_usd
        return t.op_update(req["pk"], req["sk"], sets + " REMOVE uncounted, #job", vals=vals,
                           condition="#state = :w AND #token = :t AND #job = :j")

    @staticmethod
    def release(t: Table, batch_id: str, n: int, uncommitted_usd: float = 0.0) -> Op:
        """`n` requests leave the jobs' hold (handed back to run directly); `uncommitted_usd`: their worst case
        at the tier's price, given back to the batch's spending cap (their job committed it at its submit)."""
        if uncommitted_usd:
            return t.op_update(*batch_key(batch_id), "ADD offloaded :minus, committed_usd :back",
                               vals={":minus": -n, ":back": -uncommitted_usd})
        return t.op_update(*batch_key(batch_id), "ADD offloaded :minus", vals={":minus": -n})
