"""The provider job runner: each job record (records.provider_jobs) is looked at when due, by the sweeper,
one step at a time, every step fenced on the record's version so that two sweepers never both do one.

  planned/filling  its requests are taken from the model's lane into the job, a transaction per FILL_STEP
                   (the lane's cursor, the request items held by the job, the job's `filled`)
  submitting       the provider's job is looked up by the job's key (a worker that died after creating it
                   left it there) and made only if none is found; its id recorded
  running          looked at every `poll_seconds`; at the guard's moment (the window's end less the larger of
                   `guard_seconds` and the forecast of running its rest directly), or once its batch stopped,
                   cancelled at the provider
  collecting       the provider's job ended: its output and error files read a page at a time (the page's
                   place kept on the record), each answer landed through the ledger as a direct call's is
  handing_back     what it did not finish (never run, expired, cancelled, retryable errors) goes to run
                   directly, due at once; the lane's rest too, once no job of the model is left to fill

A job whose look raises `sweep_failures_to_fail` times in a row is given up (`_give_up`): handed back, or, if
handing back is what raises, abandoned with its batch failed. Once its batch stopped or past its guard's moment
(`_late`), a provider that does not answer counts so too, each try RETRY_SECONDS apart (before: only put off).
"""

from __future__ import annotations

import json
import logging
import math
import time
from dataclasses import replace

from ... import protocols
from ...catalog import Model
from ...domain import FINAL_BATCH, RequestState, Stop, new_token, utc_day
from ...layout import INDEX_CHUNK, IndexEntry, index_object, lane_object
from ...ledger import SETTLE_MAX, Settlement, settle_many
from ...observability import Bulkhead
from ...providers import as_asked, translates
from ...providers.batch_tiers import (
    LineAnswer,
    Staging,
    TierError,
    forget,
    min_requests,
    tier_of,
    within_job,
)
from ...providers.batch_tiers import as_asked as tier_as_asked
from ...records import Account, Batch, BatchItem, Budget, Lane, Request, RequestItem, key_account_and_usage
from ...records.provider_jobs import ProviderJob
from ...runtime import Services
from ...spending import fits, settled_delta, worst_usd
from ...storage.dynamo import ConditionFailed
from ..accounts import key_problem
from ..creating.forecast import read_queue, seconds_to_finish
from ..lifecycle import fail_batch, internal_error, stop_batch
from ..running import request_file
from ..running.backend_call import backend_key
from ..running.run_request import answered_outcome
from .execution import carried

log = logging.getLogger(__name__)

FILL_STEP = 80  # requests one transaction takes into a job (with the batch and the job: below DynamoDB's 100)
RESULT_PAGE = 200  # answers one step lands at most (a 50,000-line output: 250 steps, each resumable)
HAND_BACK_STEP = 80  # held requests one transaction hands back to run directly
STEPS_PER_LOOK = 50  # steps one look at a job takes at most (a look ends early at its deadline)
JOBS_PER_RUN = 50  # due jobs one sweeper run looks at at most
# A job's step that failed (the provider did not answer, a write lost a race) is tried again this much later.
RETRY_SECONDS = 5


# A job whose look raised is put off this long, doubled at each failure in a row, up to FAILED_MOST_SECONDS:
# jobs that always raise (one account's, say) then never fill a run's JOBS_PER_RUN ahead of the others.
FAILED_MOST_SECONDS = 900


def run_due(svc: Services, deadline: float | None = None) -> int:
    """Look at every provider job that is due, each in a bulkhead: one that raises is logged, put off
    (`put_off_after_failure`) and passed over, and the others go on. Returns how many were looked at."""
    looked = 0
    for key in ProviderJob.due(svc.table, svc.now(), JOBS_PER_RUN):
        if deadline is not None and time.monotonic() >= deadline:
            break
        with Bulkhead("provider jobs", f"{key['pk']}/{key['sk']}", "look") as guard:
            look(svc, key["pk"], key["sk"], deadline, guard)
            looked += 1
        if guard.error is not None:
            with Bulkhead("provider jobs", f"{key['pk']}/{key['sk']}", "putting off after a failure"):
                put_off_after_failure(svc, key["pk"], key["sk"])
    return looked


def put_off_after_failure(svc: Services, pk: str, sk: str, wait: int | None = None) -> None:
    """A job whose look raised is looked at again RETRY_SECONDS later (or `wait`), twice that after a second
    failure in a row, and so on up to FAILED_MOST_SECONDS; a step that goes through starts the count again."""
    job = ProviderJob.get(svc.table, pk, sk)
    if job is None or job["state"] == "done":
        return
    failures = int(job.get("failures", 0)) + 1
    wait = wait or min(RETRY_SECONDS * 2 ** (failures - 1), FAILED_MOST_SECONDS)
    svc.table.transact([ProviderJob.change(svc.table, job, {"failures": failures, "due_at": svc.now() + wait})])
    if failures >= svc.settings.sweep_failures_to_fail:
        _give_up(svc, pk, sk, failures)


def _give_up(svc: Services, pk: str, sk: str, times: int) -> None:
    """A job whose look failed `sweep_failures_to_fail` times in a row (as a batch's sweep step that keeps
    raising fails its batch): before handing back, the provider is given up (its job cancelled, best effort)
    and the held requests go to run directly (what it finished and was not landed runs again: only landed
    answers are charged); while handing back, the job is abandoned (`_abandon`). Should this raise too, the
    next failure tries again."""
    job = ProviderJob.get(svc.table, pk, sk)
    if job is None or job["state"] == "done":
        return
    if job["state"] == "handing_back":
        _abandon(svc, job, times)
        return
    log.error("provider job %s of batch %s: its %s step failed %d times in a row; its requests run directly",
              sk, job["batch_id"], job["state"], times)
    with Bulkhead("provider jobs", f"{pk}/{sk}", "cancelling at the provider, given up"):
        _cancel_given_up(svc, job)
    _state(svc, job, "handing_back")


def _cancel_given_up(svc: Services, job: dict) -> None:
    """Cancel the provider's job of a job given up while it may still run there: running, or being submitted
    (a create that went through but was never recorded is found by the job's key, as `_submit` finds it)."""
    model = svc.catalog.lookup(job["model"])
    if model is None or model.provider_batch is None or job["state"] not in ("submitting", "running", "cancelling"):
        return
    tier, key = tier_of(model), backend_key(svc, model)
    provider_id = job.get("provider_id")
    if provider_id is None and job.get("submit_tried_at") is not None:
        found = tier.find(model, key, _job_key(job), count=int(job.get("submit_count", job["count"])),
                          since=job.get("submit_tried_at"))
        provider_id = found.provider_id if found is not None else None
    if provider_id:
        tier.cancel(model, key, provider_id)


def _abandon(svc: Services, job: dict, times: int) -> None:
    """A job whose hand-back keeps failing: its batch fails with `internal_error` (stopped first, so that it
    settles once the hold is released), the job ends and the batch's `offloaded` lets go of the requests it
    still holds; the batch's settle closes them (still waiting) as its stop says."""
    log.error("provider job %s of batch %s: handing back failed %d times in a row; failing the batch",
              job["sk"], job["batch_id"], times)
    error = internal_error("provider job", times)
    fail_batch(svc, job["batch_id"], error)  # stopped; it waits on the job's hold
    held = list(ProviderJob.held(svc.table, job))
    batch = Batch.get(svc.table, job["batch_id"])
    ops = [ProviderJob.change(svc.table, job, {"state": "done"}, done=True)]
    if held and batch is not None:
        ops.append(ProviderJob.release(svc.table, job["batch_id"], len(held), _uncommitted(svc, job, batch, held)))
    svc.table.transact(ops)
    _forget(svc, job)
    fail_batch(svc, job["batch_id"], error)  # its still-waiting requests closed, it ends failed


def _uncommitted(svc: Services, job: dict, batch: BatchItem, held: list[RequestItem]) -> float:
    """What the job committed against its batch's cap for `held` (0 if nothing, or if it cannot be read)."""
    if job.get("committed_usd") is None:
        return 0.0
    try:
        return sum(_worst(svc, batch, held, job["committed_price"]))
    except Exception:  # noqa: BLE001 - the batch is failing: its cap no longer starts anything
        log.warning("provider job %s: its commitment could not be read", job["sk"], exc_info=True)
        return 0.0


def look(svc: Services, pk: str, sk: str, deadline: float | None = None, guard: Bulkhead | None = None) -> dict | None:
    """Take the job's steps until it waits on its provider, is done, or the deadline comes."""
    job = ProviderJob.get(svc.table, pk, sk)
    for _ in range(STEPS_PER_LOOK):
        if job is None or job["state"] == "done" or int(job.get("due_at", 0)) > svc.now():
            return job
        if deadline is not None and time.monotonic() >= deadline:
            return job
        if guard is not None:
            guard.step = job["state"]
        try:
            changed = _step(svc, job)
        except (ConditionFailed, TierError) as error:  # raced, or the provider did not answer: a bit later
            if isinstance(error, TierError) and _late(svc, job):  # the window is at stake: each try counts
                log.warning("provider job %s/%s: %s step, past its guard: %s", pk, sk, job["state"], error)
                with Bulkhead("provider jobs", f"{pk}/{sk}", "counting a failure"):
                    put_off_after_failure(svc, pk, sk, RETRY_SECONDS)
                return ProviderJob.get(svc.table, pk, sk)
            log.warning("provider job %s/%s: %s step put off: %s", pk, sk, job["state"], error)
            current = ProviderJob.get(svc.table, pk, sk)
            if current is not None and current["version"] == job["version"] and current["state"] != "done":
                svc.table.transact([ProviderJob.change(svc.table, current, {"due_at": svc.now() + RETRY_SECONDS})])
            return ProviderJob.get(svc.table, pk, sk)
        job = ProviderJob.get(svc.table, pk, sk)
        if not changed:  # it waits on its provider (or its batch's resume) until its next look
            return job
    return job


def _step(svc: Services, job: dict) -> bool:
    batch = Batch.get(svc.table, job["batch_id"])
    model = svc.catalog.lookup(job["model"])
    if batch is None or model is None or model.provider_batch is None:
        # The batch is gone (purged with its items), or the catalog no longer offers the tier: its requests
        # are handed back (if any is still held) and the job ends.
        if batch is not None and job["state"] == "handing_back":
            return _hand_back(svc, job, batch, model)
        return _state(svc, job, "handing_back" if batch is not None and job["state"] != "planned" else "done")
    state = job["state"]
    if state in ("planned", "filling"):
        return _fill(svc, job, batch, model)
    if state == "submitting":
        return _submit(svc, job, batch, model)
    if state in ("running", "cancelling"):
        return _poll(svc, job, batch, model)
    if state == "collecting":
        return _collect(svc, job, batch, model)
    if state == "handing_back":
        return _hand_back(svc, job, batch, model)
    raise ValueError(f"provider job in an unknown state {state!r}")


def _state(svc: Services, job: dict, state: str, **sets: object) -> bool:
    done = state == "done"
    if job.get("failures"):  # a step went through: a later failure is put off from RETRY_SECONDS again
        sets = {"failures": 0, **sets}
    svc.table.transact([ProviderJob.change(svc.table, job, {"state": state, **({} if done else {"due_at": svc.now()}),
                                                            **sets}, done=done)])
    if done:
        _forget(svc, job)
    return True


def _forget(svc: Services, job: dict) -> None:
    """What the tier kept of a done job in the service's bucket (Bedrock's input and output) is deleted; a
    failure is only logged (the bucket's lifecycle rule deletes it later)."""
    model = svc.catalog.lookup(job["model"])
    if model is None or job.get("submit_tried_at") is None or model.provider_batch is None:
        return
    try:
        forget(model, _job_key(job), _staging(svc))
    except Exception:  # noqa: BLE001 - the job is done either way
        log.warning("provider job %s/%s: its objects could not be deleted", job["pk"], job["sk"], exc_info=True)


def _stopped(svc: Services, batch: BatchItem) -> bool:
    return bool(batch.get("stop") or batch.get("deleting") or batch["status"] in FINAL_BATCH)


def _late(svc: Services, job: dict) -> bool:
    """The job's provider must answer now: its batch stopped, or the guard's moment for what it holds passed
    (a job cancelling is so by now): a provider that does not answer then counts toward giving it up."""
    batch, model = Batch.get(svc.table, job["batch_id"]), svc.catalog.lookup(job["model"])
    if batch is None or model is None or model.provider_batch is None:
        return False
    held = sum(1 for _ in ProviderJob.held(svc.table, job))
    return job["state"] == "cancelling" or _stopped(svc, batch) or svc.now() >= guard_at(svc, batch, model, held)


def guard_at(svc: Services, batch: BatchItem, model: Model, unfinished: int) -> int:
    """When the job's unfinished part comes back to run directly: the window's end less the larger of the
    tier's `guard_seconds` and the estimate's forecast of running that part directly."""
    tier = model.provider_batch
    assert tier is not None
    forecast = 0.0
    try:
        account = Account.get(svc.table, batch["account_id"]) or {}
        own_limit = svc.settings.tier_limits.get(account.get("tier", "free"), 0)
        forecast = seconds_to_finish(read_queue(svc, model), batch["account_id"], own_limit, unfinished)
    except Exception:  # a forecast that cannot be read leaves the guard's own margin
        log.exception("provider job: no forecast for %s", model.id)
    margin = tier.guard_seconds if math.isinf(forecast) else max(tier.guard_seconds, forecast)
    return int(batch["expires_at"]) - math.ceil(margin)


# --- filling ---------------------------------------------------------------------------------------------

def _fill(svc: Services, job: dict, batch: BatchItem, model: Model) -> bool:
    lane = batch["lanes"][job["model"]]
    at = int(job["lane_from"]) + int(job["filled"])
    now = svc.now()
    late = now >= guard_at(svc, batch, model, int(job["count"]))
    taken_elsewhere = int(lane["next"]) != at
    if batch.get("paused_at") and not taken_elsewhere and not late:  # a paused batch's part waits for its resume
        return _later(svc, job, model)
    if late or _stopped(svc, batch) or taken_elsewhere or int(job["filled"]) >= int(job["count"]):
        if int(job["filled"]) == 0:
            _state(svc, job, "done")
            _lane_rest_to_direct(svc, job["batch_id"])
            return True
        return _state(svc, job, "submitting" if not (late or _stopped(svc, batch)) else "handing_back",
                      count=int(job["filled"]))
    k = min(FILL_STEP, int(job["count"]) - int(job["filled"]))
    entries = _Entries(svc, batch)
    indexes = entries.lane(job["model"], at, at + k)
    ttl = int(batch["expires_at"]) + svc.settings.batch_retention_seconds + 86400
    t = svc.table
    ops = [ProviderJob.claim_lane(t, batch, job["model"], at, len(indexes), now),
           ProviderJob.change(t, job, {"state": "filling", "filled": int(job["filled"]) + len(indexes)})]
    for index in indexes:
        entry = entries.entry(index)
        ops.append(Request.create(t, ProviderJob.held_item(batch, job["model"], job["sk"], index, entry.custom_id,
                                                           entry.offset, entry.length, new_token(), now, ttl)))
    t.transact(ops)
    return True


class _Entries:
    """The batch's request index and lanes as stored at intake (S3), read a chunk at a time."""

    def __init__(self, svc: Services, batch: BatchItem) -> None:
        self.svc, self.batch = svc, batch
        self.chunks: dict[int, list] = {}

    def lane(self, model_id: str, start: int, end: int) -> list[int]:
        if len(self.batch["lanes"]) == 1 and not self.batch.get("rejected"):  # its one lane is simply 0..n-1
            return list(range(start, end))
        return json.loads(self.svc.blobs.get(lane_object(self.batch["id"], model_id)) or b"[]")[start:end]

    def entry(self, index: int) -> IndexEntry:
        chunk = index // INDEX_CHUNK
        if chunk not in self.chunks:
            self.chunks[chunk] = json.loads(self.svc.blobs.get(index_object(self.batch["id"], chunk)) or b"[]")
        return IndexEntry.read(self.chunks[chunk][index - chunk * INDEX_CHUNK])


def _lane_rest_to_direct(svc: Services, batch_id: str) -> None:
    """A model's requests no job will take any more run directly: its lane is made, once no job of the
    model is left to fill (the lane's cursor fences every claim, so none is taken twice)."""
    batch = Batch.get(svc.table, batch_id)
    if batch is None or _stopped(svc, batch) or batch.get("paused_at"):
        return  # stopped: its never-dispatched requests end with it; paused: its resume makes its lanes
    jobs = ProviderJob.of_batch(svc.table, batch_id)
    for model_id, lane in batch.get("lanes", {}).items():
        filling = [j for j in jobs if j["model"] == model_id and j["state"] in ("planned", "filling")]
        held = any(j["model"] == model_id for j in jobs)
        if held and not filling and int(lane["next"]) < int(lane["total"]):
            svc.table.transact([Lane.create(svc.table, model_id, batch)])


# --- submitting and polling --------------------------------------------------------------------------------

def _staging(svc: Services) -> Staging:
    """The service's bucket and Bedrock's service role, for a tier whose jobs read and write the bucket."""
    return Staging(svc.blobs, svc.settings.bedrock_batch_role_arn)


def _job_key(job: dict) -> str:
    return f"{job['batch_id']}:{job['sk']}"


def _owner(svc: Services, batch: BatchItem) -> str:
    """The checks a direct request gets before each attempt, for a job's requests: "ok"; "fail" when the key
    was revoked or the account suspended (the batch is failed here, as a worker fails it); "wait" while the
    account has no batch access or its day's quota is used up."""
    now = svc.now()
    key_item, account, usage = key_account_and_usage(svc.table, batch["key_hash"], batch["account_id"], utc_day(now))
    if key_problem(svc, key_item, account):
        stop_batch(svc, batch, Stop.FAIL)
        return "fail"
    if not account.get("batch_access") or (
            float((usage or {}).get("cost_usd", 0)) >= float(account.get("daily_quota_usd", 0))):
        return "wait"
    return "ok"


def _later(svc: Services, job: dict, model: Model) -> bool:
    """Looked at again at its next poll; the step went through, so a later failure counts from 0 again."""
    svc.table.transact([ProviderJob.change(svc.table, job, {**({"failures": 0} if job.get("failures") else {}),
        "due_at": svc.now() + math.ceil(model.provider_batch.poll_seconds)})])  # type: ignore[union-attr]
    return False


def _submit(svc: Services, job: dict, batch: BatchItem, model: Model) -> bool:
    if _stopped(svc, batch) or svc.now() >= guard_at(svc, batch, model, int(job["count"])):
        return _state(svc, job, "handing_back")
    owner = _owner(svc, batch)
    if owner != "ok":  # failed: handed back and closed with the batch; waiting: looked at again later
        return _state(svc, job, "handing_back") if owner == "fail" else _later(svc, job, model)
    tier, key = tier_of(model), backend_key(svc, model)
    # Made already, by a worker that died before recording it (`since`: when the last create was tried).
    found = tier.find(model, key, _job_key(job), count=int(job.get("submit_count", job["count"])),
                      since=job.get("submit_tried_at"))
    if found is None:
        held = list(ProviderJob.held(svc.table, job))
        endpoint, lines = _as_sent(model, job["endpoint"], held, _bodies(svc, held))
        if len(lines) < min_requests(model):
            # Too few can be sent (their translation refuses them, or the tier does not carry them; or fewer
            # than one of its jobs takes): they run directly (and fail there, if they fail).
            return _state(svc, job, "handing_back")
        # Recorded before the create: a later find knows where to look, and for how many requests.
        tried: dict = {"submit_tried_at": svc.now(), "submit_count": len(lines)}
        ops = []
        if batch.get("max_cost_usd") is not None and job.get("committed_usd") is None:
            # A spending cap counts the job's worst case at the tier's price before the provider's job is made;
            # one that does not fit beside what the batch has committed runs directly, claim by claim.
            price = [model.provider_batch.price.input_per_mtok, model.provider_batch.price.output_per_mtok]  # type: ignore[union-attr]
            worst = sum(_worst(svc, batch, held, price))
            if not fits(float(batch.get("committed_usd", 0)), float(batch["max_cost_usd"]), worst):
                return _state(svc, job, "handing_back")
            tried.update(committed_usd=worst, committed_price=price)
            ops.append(Batch.commit(svc.table, batch, worst))
        svc.table.transact([ProviderJob.change(svc.table, job, tried), *ops])
        job = {**job, **tried, "version": int(job["version"]) + 1}
        try:
            found = tier.submit(model, key, _job_key(job), endpoint, lines, staging=_staging(svc),
                                **protocols.of_batch(batch).backend_options(batch))
        except TierError:  # tried again a bit later (the record's version moved: `look` cannot put it off)
            svc.table.transact([ProviderJob.change(svc.table, job, {"due_at": svc.now() + RETRY_SECONDS})])
            raise
    return _state(svc, job, "running", provider_id=found.provider_id,
                  due_at=svc.now() + math.ceil(model.provider_batch.poll_seconds))  # type: ignore[union-attr]


def _as_sent(model: Model, endpoint: str, held: list[RequestItem], bodies: list[dict]
             ) -> tuple[str, list[tuple[str, dict]]]:
    """The job's lines as a direct call sends each request (a Messages request to an `openai` model: its chat
    completion); one its translation refuses, or the tier does not carry (`takes_request`: Bedrock's jobs
    take no tools) or does not fit in one job beside the others (`within_job`: OpenAI's 50,000 embedding
    inputs), is left out (never answered: it runs directly)."""
    sent_endpoint, lines = endpoint, []
    for req, body in zip(held, bodies, strict=True):
        sent = carried(model, endpoint, body)
        if sent is not None:
            sent_endpoint = sent[0]
            lines.append((str(req["index"]), sent[1]))
    return sent_endpoint, within_job(model, sent_endpoint, lines)


def _worst(svc: Services, batch: BatchItem, reqs: list[RequestItem], price: list | None = None,
           model: Model | None = None) -> list[float]:
    """Each request's worst case (`spending`: its line's bytes as input, its output bound as output), at a
    job's committed tier price `[input, output]` per million tokens, or at the model's own; infinite for a
    request without an output bound."""
    entries, worst = _Entries(svc, batch), []
    for req in reqs:
        bound = entries.entry(int(req["index"])).output_bound
        if bound is None:
            worst.append(math.inf)
        elif price is not None:
            worst.append((int(req["length"]) * float(price[0]) + bound * float(price[1])) / 1e6)
        else:
            assert model is not None
            worst.append(worst_usd(model, int(req["length"]), bound))
    return worst


def _bodies(svc: Services, reqs: list[RequestItem]) -> list[dict]:
    return request_file.bodies(svc, reqs[0]["batch_id"], [(int(r["offset"]), int(r["length"])) for r in reqs]) \
        if reqs else []


def _poll(svc: Services, job: dict, batch: BatchItem, model: Model) -> bool:
    # The owner's checks come before the provider's answer: a key revoked while the provider does not answer
    # fails the batch at this look, as a worker would, and the job's looks count toward giving it up from now
    # (`_late`), not from the guard's moment hours later.
    if job["state"] == "running" and not _stopped(svc, batch) and _owner(svc, batch) == "fail":
        batch = Batch.get(svc.table, job["batch_id"]) or batch
    tier, key = tier_of(model), backend_key(svc, model)
    view = tier.look(model, key, job["provider_id"])
    if view.ended:
        if view.failed:
            log.warning("provider job %s failed as a whole: %s", job["provider_id"], view.message)
        return _state(svc, job, "collecting", provider_status=view.status, output_file=view.output_file,
                      error_file=view.error_file, cursor_output=0, cursor_error=0)
    unfinished = sum(1 for _ in ProviderJob.held(svc.table, job))
    if job["state"] == "running" and (_stopped(svc, batch) or svc.now() >= guard_at(svc, batch, model, unfinished)):
        tier.cancel(model, key, job["provider_id"])  # what it finished is taken once it has ended
        return _state(svc, job, "cancelling")
    return _later(svc, job, model)


# --- collecting and handing back ---------------------------------------------------------------------------

def _collect(svc: Services, job: dict, batch: BatchItem, model: Model) -> bool:
    for kind in ("output", "error"):
        cursor = job.get(f"cursor_{kind}")
        if job.get(f"{kind}_file") and cursor is not None:
            page = tier_of(model).results(model, backend_key(svc, model), job[f"{kind}_file"], int(cursor),
                                          RESULT_PAGE, staging=_staging(svc))
            _land(svc, job, batch, model, page.answers)
            return _state(svc, job, "collecting", **{f"cursor_{kind}": page.next})
    return _state(svc, job, "handing_back")


def _land(svc: Services, job: dict, batch: BatchItem, model: Model, answers: list[LineAnswer]) -> None:
    """Each answer of a page lands as a direct call's would: a success or a final error through the ledger
    (results, counts, finished-order log, analytics, usage), at the tier's price; a retryable error or a
    request never run is handed back to run directly. An answer whose request has left the job already (a
    step run again after a worker died) is passed over: nothing lands twice."""
    tier = model.provider_batch
    assert tier is not None
    settled: list[tuple[RequestItem, Settlement]] = []
    back: list[tuple[RequestItem, int, dict | None]] = []
    shows_its_own = hasattr(tier_of(model), "as_asked")
    held = Request.get_many(svc.table, job["batch_id"], [int(a.key) for a in answers if a.key.isdigit()])
    taken: list[tuple[LineAnswer, RequestItem]] = []
    for answer in answers:
        req = held.get(int(answer.key)) if answer.key.isdigit() else None
        if req is not None and req.get("job") == job["sk"] and req["state"] == RequestState.WAITING.value:  # type: ignore[typeddict-item]
            taken.append((answer, req))
    translated = translates(model, job["endpoint"])
    bodies: dict[int, dict] = {}
    if translated or shows_its_own:  # shown in the shape asked for: the page's bodies, read together
        answered = [req for answer, req in taken if answer.attempt is not None]
        bodies = dict(zip([int(req["index"]) for req in answered], _bodies(svc, answered), strict=True))
    for answer, req in taken:
        if answer.attempt is None:
            back.append((req, 0, None))
            continue
        attempt = answer.attempt
        if translated:  # back in the shape asked for, as a direct call's answer is
            attempt = as_asked(model, job["endpoint"], bodies[int(req["index"])], attempt)
        elif shows_its_own:  # a tier answering in its own shape (Bedrock: Converse's), shown as a direct call's
            attempt = tier_as_asked(model, job["endpoint"], bodies[int(req["index"])], attempt)
        outcome = answered_outcome(svc, {**req, "attempt": 1}, job["batch_id"], model, attempt)
        if outcome.to is RequestState.WAITING:
            back.append((req, 1, outcome.error))
            continue
        at_tier = tier.cost_usd(outcome.input_tokens, outcome.output_tokens) if not outcome.cost_unknown else 0.0
        # Out of the job's hold (`job` emptied: a retry in place later runs it as any other), marked as run there.
        settled.append((req, replace(outcome, cost_usd=at_tier, saved_usd=outcome.cost_usd - at_tier, offloaded=-1,
                                     extra={**outcome.extra, "job": "", "tier_job": job["sk"]})))
    if job.get("committed_usd") is not None:  # its worst case was committed: each landed request gives back
        worst = _worst(svc, batch, [req for req, _ in settled], job["committed_price"])  # what it did not spend
        settled = [(req, replace(outcome, committed_usd=settled_delta(w, True, outcome.cost_usd,
                                                                      not outcome.cost_unknown)))
                   for (req, outcome), w in zip(settled, worst, strict=True)]
    for at in range(0, len(settled), SETTLE_MAX):
        _settle(svc, settled[at:at + SETTLE_MAX])
    for at in range(0, len(back), HAND_BACK_STEP):
        _give_back(svc, job, back[at:at + HAND_BACK_STEP], batch, model)


def _settle(svc: Services, chunk: list[tuple[RequestItem, Settlement]]) -> None:
    try:
        settle_many(svc, chunk)
    except ConditionFailed:  # one of them landed meanwhile: each on its own, so the others still land
        for req, outcome in chunk:
            try:
                settle_many(svc, [(req, outcome)])
            except ConditionFailed:
                pass


def _give_back(svc: Services, job: dict, chunk: list[tuple[RequestItem, int, dict | None]], batch: BatchItem,
               model: Model | None) -> None:
    """Hand requests back to run directly. In a capped batch each carries its worst case at the model's price
    (its claim commits it), and what the job committed for them at the tier's price is given back."""
    t, now = svc.table, svc.now()
    reqs = [req for req, _, _ in chunk]
    capped = batch.get("max_cost_usd") is not None and model is not None
    direct: list = _worst(svc, batch, reqs, model=model) if capped else [None] * len(chunk)
    back = sum(_worst(svc, batch, reqs, job["committed_price"])) if job.get("committed_usd") is not None else 0.0
    ops = [ProviderJob.hand_back(t, req, now, new_token(), attempt, error,
                                 worst if worst is None or math.isfinite(worst) else None)
           for (req, attempt, error), worst in zip(chunk, direct, strict=True)]
    ops += [ProviderJob.release(t, job["batch_id"], len(chunk), back)]
    ops += [op for op in [Budget.add(t, job["model"], {"waiting": len(chunk)})] if op is not None]
    try:
        t.transact(ops)
    except ConditionFailed:  # one moved meanwhile: each on its own
        if len(chunk) > 1:
            for one in chunk:
                _give_back(svc, job, [one], batch, model)


def _hand_back(svc: Services, job: dict, batch: BatchItem, model: Model | None) -> bool:
    held = list(ProviderJob.held(svc.table, job, limit=HAND_BACK_STEP))
    if held:
        _give_back(svc, job, [(req, int(req.get("attempt", 0)), None) for req in held], batch, model)
        return True
    _state(svc, job, "done")
    _lane_rest_to_direct(svc, job["batch_id"])
    return True
