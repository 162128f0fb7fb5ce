"""The fault suite: backend errors, duplicate deliveries, dying workers, racing dispatchers and sweepers,
DynamoDB throttling, expiry, cancellation and revoked owners. Every scenario ends with the shared ledger
checker (tests/invariants.py)."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import random
import threading
import time
from collections import Counter

import pytest
from botocore.exceptions import ClientError

from batchinfer.catalog import Catalog
from batchinfer.errors import ApiError
from batchinfer.layout import (
    GROUP_PREFIX,
    LEASE_DUE,
    LEASE_PARTITIONS,
    account_key,
    batch_key,
    budget_share,
    model_budget_key,
)
from batchinfer.ledger import queue_message
from batchinfer.protocols.openai import batches
from batchinfer.providers import openai_compat
from batchinfer.records import group_shards, lease_shards
from batchinfer.scheduling import dispatcher as claim_pass
from batchinfer.scheduling import lanes
from batchinfer.scheduling import pump as slot_pump
from batchinfer.scheduling.config import scheduler_config
from batchinfer.scheduling.dispatcher import Dispatcher
from batchinfer.service import accounts, lifecycle, run_request
from batchinfer.service.accounts import authenticate
from batchinfer.service.run_request import process, process_and_pull
from batchinfer.service.sweep import sweep_once
from batchinfer.storage.dynamo import ConditionFailed
from local.lambda_runtime import invoke, sqs_event
from local.servers import free_port
from tests.helpers import chat_request, new_key
from tests.invariants import assert_ledger_consistent, budget_of, stored_requests

GLM, QWEN = "glm-5.3-flash", "qwen3.6-35b"
FINAL = ("completed", "failed", "expired", "cancelled")


# --- Harness -----------------------------------------------------------------------------------------

class Serialized:
    """Applies each call of a moto client atomically, as the real service does.

    In-process moto is not thread-safe: a transaction that is cancelled restores a deep copy of the whole
    table taken when it began, wiping writes other threads made meanwhile, and it checks conditions and
    applies writes without a lock. The code under test runs DynamoDB calls from several threads (the
    worker runs records concurrently), so each call is made atomic here; interleavings between calls,
    which is what the service must survive, are untouched.
    """

    def __init__(self, inner, lock: threading.RLock) -> None:
        self._inner = inner
        self._lock = lock

    def __getattr__(self, name: str):
        attr = getattr(self._inner, name)
        if not callable(attr):
            return attr

        def call(*args, **kwargs):
            with self._lock:
                return attr(*args, **kwargs)

        return call


class Clock:
    """The services' clock: real time plus an offset tests move forward."""

    def __init__(self) -> None:
        self.offset = 0.0

    def __call__(self) -> float:
        return time.time() + self.offset

    def advance(self, seconds: float) -> None:
        self.offset += seconds


@pytest.fixture
def svc(svc):
    lock = threading.RLock()
    svc.table.client = Serialized(svc.table.client, lock)
    svc.queues.sqs = Serialized(svc.queues.sqs, lock)
    svc.clock = Clock()
    return svc


def configure(svc, **settings) -> None:
    svc.settings = svc.settings.model_copy(update=settings)


def set_budgets(svc, budgets: dict[str, int]) -> None:
    svc.catalog = Catalog(models=[m.model_copy(update={"batch_budget": budgets[m.id], "batch_floor": 1})
                                  if m.id in budgets else m for m in svc.catalog.models])


def sim_config(sim_control, **config) -> None:
    answer = sim_control.put("/_sim/config", json=config)
    assert answer.status_code == 200, answer.text


def sim_stats(sim_control, settle: bool = False) -> dict:
    """The simulator's counters; settle=True waits until no request of it is still in flight."""
    deadline = time.monotonic() + 5
    while True:
        stats = sim_control.get("/_sim/stats").json()
        if not settle or stats["in_flight"] == 0 or time.monotonic() > deadline:
            return stats
        time.sleep(0.05)


def submit(svc, who, requests: list[dict]) -> str:
    obj, created = batches.create_batch(svc, who, json.dumps({"requests": requests}).encode(), None)
    assert created and obj["status"] == "validating"
    return obj["id"]


def get_batch(svc, batch_id: str) -> dict:
    return svc.table.get(*batch_key(batch_id))


def requests_by_custom_id(svc, batch_id: str) -> dict[str, dict]:
    return {r["custom_id"]: r for r in stored_requests(svc, batch_id)}


def results_by_custom_id(svc, who, batch_id: str) -> dict[str, dict]:
    return {r["custom_id"]: r for r in batches.results_page(svc, who, batch_id, 1000, None)["data"]}


def receive(svc, model: str, n: int = 10) -> list[dict]:
    answer = svc.queues.sqs.receive_message(QueueUrl=svc.queues.urls[model], MaxNumberOfMessages=n,
                                            WaitTimeSeconds=0)
    return answer.get("Messages", [])


def run_messages(svc, model: str, messages: list[dict]) -> dict:
    """One worker invocation on these SQS messages, as the event source mapping makes it: records reported
    as failed (or all of them, when the handler raises) stay on the queue; the rest are deleted."""
    if not messages:
        return {"failed": [], "raised": None}
    url = svc.queues.urls[model]
    event = sqs_event("arn:aws:sqs:us-east-1:000000000000:" + url.rsplit("/", 1)[-1], messages)
    try:
        failed = {f["itemIdentifier"] for f in invoke("worker", event).get("batchItemFailures", [])}
        raised = None
    except Exception as error:  # the whole invocation failed: every record comes back later
        failed, raised = {m["MessageId"] for m in messages}, error
    handles = list(dict.fromkeys(m["ReceiptHandle"] for m in messages if m["MessageId"] not in failed))
    done = [{"Id": str(i), "ReceiptHandle": h} for i, h in enumerate(handles)]
    if done:
        svc.queues.sqs.delete_message_batch(QueueUrl=url, Entries=done)
    return {"failed": sorted(failed), "raised": raised}


def run_queued(svc, models=None) -> list[dict]:
    """Poll every model queue until it is empty; one worker invocation per poll."""
    reports = []
    for model in models or list(svc.queues.urls):
        while messages := receive(svc, model):
            reports.append(run_messages(svc, model, messages))
    return reports


def pump(svc, batch_id: str, clock_step: float = 0.0, tolerate: bool = False, rounds: int = 300,
         errors: list | None = None) -> dict:
    """Dispatch, run, sweep until the batch is final. With tolerate=True, an exception a scheduled
    handler lets escape is recorded and the next round goes on, as the next scheduled call would."""
    dispatcher = Dispatcher(svc)
    errors = [] if errors is None else errors

    def work() -> None:
        failed = [r for r in run_queued(svc) if r["failed"]]
        if failed:  # a record the worker could not process (it stays on the queue)
            raise AssertionError(f"worker records failed: {failed}")

    for _ in range(rounds):
        for stage in (dispatcher.pass_once, work, lambda: invoke("sweeper", {})):
            try:
                stage()
            except Exception as error:
                if not tolerate:
                    raise
                errors.append(error)
        batch = get_batch(svc, batch_id)
        if batch["status"] in FINAL:
            return batch
        svc.clock.advance(clock_step)
    raise AssertionError(f"batch {batch_id} not final after {rounds} rounds: {get_batch(svc, batch_id)}")


def account_counters(svc, account_id: str) -> dict:
    item = svc.table.get(*account_key(account_id))
    return {k: item.get(k, 0) for k in ("unfinished_batches", "unfinished_requests", "in_flight")}


# --- 1-3: backend errors ------------------------------------------------------------------------------

def test_transient_backend_errors_are_retried_until_they_pass(svc, sim_control):
    configure(svc, backend_timeout_seconds=0.5)
    sim_config(sim_control, timeout_sleep_seconds=1)
    _, key = new_key(svc)
    who = authenticate(svc, key)
    requests = [chat_request("r429", "[[sim:flaky:2:429]] alpha"), chat_request("r500", "[[sim:flaky:3:500]] beta"),
                chat_request("rtimeout", "[[sim:flaky:1:timeout]] gamma"), chat_request("plain", "delta")]
    batch_id = submit(svc, who, requests)

    final = pump(svc, batch_id, clock_step=2)

    assert final["status"] == "completed"
    assert_ledger_consistent(svc, batch_id, who, [r["custom_id"] for r in requests])
    stored = requests_by_custom_id(svc, batch_id)
    assert {c: r["state"] for c, r in stored.items()} == dict.fromkeys(stored, "completed")
    assert {c: r["attempt"] for c, r in stored.items()} == {"r429": 3, "r500": 4, "rtimeout": 2, "plain": 1}
    assert final["completed"] == 4 and final["failed"] == 0
    # Only the timed-out attempt may have run without us knowing its cost; 429s and 500s were refused.
    assert final["cost_unknown_attempts"] == 1
    stats = sim_stats(sim_control, settle=True)
    assert stats["total_requests"] == 10
    assert stats["by_status"].get("429") == 2 and stats["by_status"].get("500") == 3
    assert stats["by_status"].get("200") == 4


def test_request_failing_every_attempt_fails_after_eight(svc, sim_control):
    _, key = new_key(svc)
    who = authenticate(svc, key)
    requests = [chat_request("ok-1", "one"), chat_request("bad", "[[sim:fail-always]] two"),
                chat_request("ok-2", "three")]
    batch_id = submit(svc, who, requests)

    final = pump(svc, batch_id, clock_step=2)

    assert final["status"] == "completed"  # a batch completes even when some of its requests failed
    assert_ledger_consistent(svc, batch_id, who, [r["custom_id"] for r in requests])
    stored = requests_by_custom_id(svc, batch_id)
    assert stored["bad"]["state"] == "failed" and stored["bad"]["attempt"] == 8
    results = results_by_custom_id(svc, who, batch_id)
    assert results["bad"]["status"] == "failed"
    assert results["bad"]["error"]["code"] == "upstream_error" and results["bad"]["error"]["status"] == 500
    for ok in ("ok-1", "ok-2"):
        assert stored[ok]["attempt"] == 1 and results[ok]["status"] == "completed"
    assert final["completed"] == 2 and final["failed"] == 1 and final["cost_unknown_attempts"] == 0
    stats = sim_stats(sim_control)
    assert stats["by_status"].get("500") == 8 and stats["total_requests"] == 10


def test_invalid_request_fails_at_once(svc, sim_control):
    _, key = new_key(svc)
    who = authenticate(svc, key)
    requests = [chat_request("bad", "[[sim:400]] nope"), chat_request("ok", "fine")]
    batch_id = submit(svc, who, requests)

    final = pump(svc, batch_id, clock_step=2)

    assert_ledger_consistent(svc, batch_id, who, ["bad", "ok"])
    stored = requests_by_custom_id(svc, batch_id)
    assert stored["bad"]["state"] == "failed" and stored["bad"]["attempt"] == 1
    error = results_by_custom_id(svc, who, batch_id)["bad"]["error"]
    assert error["code"] == "invalid_request" and error["status"] == 400
    assert final["completed"] == 1 and final["failed"] == 1 and final["cost_unknown_attempts"] == 0
    assert sim_stats(sim_control)["by_status"] == {"200": 1, "400": 1}


def with_backend_url(svc, model_id: str, base_url: str) -> None:
    svc.catalog = Catalog(models=[m.model_copy(update={"backend": m.backend.model_copy(update={"base_url": base_url})})
                                  if m.id == model_id else m for m in svc.catalog.models])


def test_a_backend_that_refuses_connections_costs_nothing_and_fails_as_unavailable(svc, sim_control):
    """A connection the backend refused never carried the request: its attempts are retried at no cost, none
    counts as cost unknown, and the request ends `service_unavailable` once its attempts run out."""
    configure(svc, max_attempts=3)
    with_backend_url(svc, GLM, f"http://127.0.0.1:{free_port()}/v1")  # nothing listens there
    _, key = new_key(svc)
    who = authenticate(svc, key)
    requests = [chat_request("refused", "one"), chat_request("other", "two", model=QWEN)]
    batch_id = submit(svc, who, requests)

    final = pump(svc, batch_id, clock_step=2)

    assert final["status"] == "completed"
    assert_ledger_consistent(svc, batch_id, who, [r["custom_id"] for r in requests])
    assert requests_by_custom_id(svc, batch_id)["refused"]["attempt"] == 3
    result = results_by_custom_id(svc, who, batch_id)["refused"]
    assert result["status"] == "failed" and result["response"] is None
    assert result["error"]["code"] == "service_unavailable" and "status" not in result["error"]
    assert "connect" in result["error"]["message"]
    assert final["completed"] == 1 and final["failed"] == 1
    assert final["cost_unknown_attempts"] == 0 and float(final["cost_usd"]) > 0  # the other request's cost


# --- 4: duplicate delivery ----------------------------------------------------------------------------

def test_duplicate_deliveries_run_a_request_once(svc, sim_control):
    _, key = new_key(svc)
    who = authenticate(svc, key)
    requests = [chat_request(f"d-{i}", f"duplicate me {i}") for i in range(3)]
    batch_id = submit(svc, who, requests)
    assert dispatch_in_groups(svc, GLM, [1, 2]) == [1, 2]
    messages = receive(svc, GLM)
    assert len(messages) == 2  # one message per group
    # SQS hands out a second copy of every message (at-least-once delivery) ...
    for m in messages:
        svc.queues.sqs.send_message(QueueUrl=svc.queues.urls[GLM], MessageBody=m["Body"])
    # ... one message arrives twice in the same worker invocation (its records run concurrently) ...
    first = run_messages(svc, GLM, [messages[0], messages[0], *messages[1:]])
    assert first == {"failed": [], "raised": None}
    # ... the whole invocation is delivered again (the delete was lost) ...
    url = svc.queues.urls[GLM]
    event = sqs_event("arn:aws:sqs:us-east-1:000000000000:" + url.rsplit("/", 1)[-1], messages)
    assert invoke("worker", event) == {"batchItemFailures": []}
    # ... and the second copies arrive later still.
    assert run_queued(svc) == [{"failed": [], "raised": None}]

    assert sim_stats(sim_control)["total_requests"] == 3
    final = pump(svc, batch_id)
    assert final["status"] == "completed" and final["completed"] == 3 and final["failed"] == 0
    assert_ledger_consistent(svc, batch_id, who, [r["custom_id"] for r in requests])
    assert [r["attempt"] for r in stored_requests(svc, batch_id)] == [1, 1, 1]
    assert sim_stats(sim_control)["total_requests"] == 3


def test_the_sweeper_looks_for_leases_that_ran_out_at_most_every_lease_scan_seconds(svc, sim_control):
    """A look for leases that ran out reads every lease shard of the index, and leases run for minutes: a
    process looks at most every `lease_scan_seconds`. A lease that runs out just after a look is recovered by
    the first run that long after it; nothing is lost or run twice meanwhile."""
    configure(svc, lease_seconds=60, lease_scan_seconds=10)
    _, key = new_key(svc)
    who = authenticate(svc, key)
    requests = [chat_request(f"l-{i}", f"lost {i}") for i in range(2)]
    batch_id = submit(svc, who, requests)
    assert Dispatcher(svc).pass_once() == 2
    receive(svc, GLM)  # the worker that took the message dies before running it

    svc.clock.advance(55)
    assert sweep_once(svc)["recovered"] == 0  # a look: nothing has run out yet
    svc.clock.advance(6)  # now the lease has run out, 6 s after the look
    assert sweep_once(svc)["recovered"] == 0  # no look this run
    def groups() -> list[str]:
        return [g["state"] for g in svc.table.query_all("pk = :p AND begins_with(sk, :g)",
                                                        {":p": f"BATCH#{batch_id}", ":g": GROUP_PREFIX})]

    assert groups() == ["dispatched"]  # its group still waits for a look
    svc.clock.advance(4)  # 10 s after the last look
    assert sweep_once(svc)["recovered"] == 2 and groups() == []  # both of its requests

    final = pump(svc, batch_id, clock_step=2)
    assert final["status"] == "completed" and final["completed"] == 2
    assert_ledger_consistent(svc, batch_id, who, [r["custom_id"] for r in requests])
    assert sim_stats(sim_control)["total_requests"] == 2


# --- 5: a worker dies between the answer and the record ---------------------------------------------

def test_worker_dying_before_recording_is_recovered_by_lease(svc, sim_control, monkeypatch):
    configure(svc, lease_seconds=60)
    _, key = new_key(svc)
    who = authenticate(svc, key)
    requests = [chat_request("dies", "the worker dies after this answer"), chat_request("fine", "all good")]
    batch_id = submit(svc, who, requests)

    real_record = run_request.record_position
    died = []

    def dying_record(svc_, item):
        if item["custom_id"] == "dies" and not died:
            died.append(item["state"])
            raise RuntimeError("worker process died")  # the backend answered; the outcome is never written
        return real_record(svc_, item)

    monkeypatch.setattr(run_request, "record_position", dying_record)
    assert Dispatcher(svc).pass_once() == 2
    messages = receive(svc, GLM)
    assert len(messages) == 1  # both requests in one group
    report = run_messages(svc, GLM, messages)
    assert died == ["completed"]
    assert report["failed"] == [messages[0]["MessageId"]]  # the record is reported failed and stays on the queue
    stored = requests_by_custom_id(svc, batch_id)
    assert "dies" not in stored and stored["fine"]["state"] == "completed"
    assert results_by_custom_id(svc, who, batch_id)["dies"]["status"] == "running"

    # Before its lease runs out nothing touches it (the redelivered message is stale); the batch waits.
    sweep_once(svc)
    run_queued(svc)
    assert results_by_custom_id(svc, who, batch_id)["dies"]["status"] == "running"
    assert get_batch(svc, batch_id)["status"] == "in_progress"

    svc.clock.advance(61)
    final = pump(svc, batch_id, clock_step=2)

    assert final["status"] == "completed" and final["completed"] == 2 and final["failed"] == 0
    assert_ledger_consistent(svc, batch_id, who, ["dies", "fine"])
    stored = requests_by_custom_id(svc, batch_id)
    assert stored["dies"]["state"] == "completed" and stored["dies"]["attempt"] == 2
    assert stored["fine"]["attempt"] == 1
    assert final["cost_unknown_attempts"] == 1  # the lost first answer may have been billed by the backend
    assert sim_stats(sim_control)["total_requests"] == 3


def test_leases_spread_over_index_shards_and_one_from_before_the_shards_is_still_recovered(svc, sim_control):
    """Leases go to one of 16 `by_due` partitions (no one index partition for the whole deployment); the
    sweeper reads every shard, and the single LEASE partition that items written before the shards are in."""
    configure(svc, lease_seconds=60)
    _, key = new_key(svc)
    who = authenticate(svc, key)
    batch_ids = [submit(svc, who, [chat_request(f"b{b}-{i}", f"lease {b} {i}") for i in range(2)]) for b in range(6)]
    Dispatcher(svc).pass_once()  # claimed, never run: the messages are lost with their worker
    receive(svc, GLM)
    groups = [g for b in batch_ids for g in svc.table.query_all(
        "pk = :pk AND begins_with(sk, :g)", {":pk": f"BATCH#{b}", ":g": GROUP_PREFIX}, consistent=True)]
    assert len(groups) == 6 and all(g["due_pk"] in LEASE_PARTITIONS[1:] for g in groups)
    assert len({g["due_pk"] for g in groups}) > 1  # spread by a hash of the item's key
    legacy = groups[0]
    svc.table.put({**legacy, "due_pk": LEASE_DUE})  # as a deployment from before the shards wrote it
    svc.clock.advance(61)
    for batch_id in batch_ids:
        final = pump(svc, batch_id, clock_step=2)
        assert final["status"] == "completed" and final["completed"] == 2, final
        assert_ledger_consistent(svc, batch_id, who, [f"b{batch_ids.index(batch_id)}-{i}" for i in range(2)])


def test_batches_spread_over_index_shards_and_ones_from_before_the_shards_are_still_swept(svc, sim_control):
    """`by_active` entries and the purge's `by_due` entries go to one of a few shards by the batch id (not
    one index partition for every batch of the deployment); the sweeper reads every shard, and the old
    partitions, where entries written before the shards are."""
    from batchinfer.layout import ACTIVE_PARTITION, ACTIVE_PARTITIONS, PURGE_DUE, PURGE_PARTITIONS
    from batchinfer.records import Batch

    who = authenticate(svc, new_key(svc, tier="internal")[1])
    ids = [submit(svc, who, [chat_request(f"s{b}", f"shard {b}")]) for b in range(8)]
    items = [svc.table.get(*batch_key(b)) for b in ids]
    assert all(i["active_pk"] in ACTIVE_PARTITIONS[1:] for i in items) and len({i["active_pk"] for i in items}) > 1
    svc.table.put({**items[0], "active_pk": ACTIVE_PARTITION})  # as a deployment from before the shards wrote it
    assert sorted(i["id"] for i in Batch.active(svc.table)) == sorted(ids)  # what the sweeper walks
    for b, batch_id in enumerate(ids):
        final = pump(svc, batch_id)
        assert final["status"] == "completed" and final["completed"] == 1
        assert_ledger_consistent(svc, batch_id, who, [f"s{b}"])
    assert list(Batch.active(svc.table)) == []
    for batch_id in ids:
        batches.delete_batch(svc, who, batch_id)
    marked = [svc.table.get(*batch_key(b)) for b in ids]
    assert all(i["due_pk"] in PURGE_PARTITIONS[1:] for i in marked) and len({i["due_pk"] for i in marked}) > 1
    svc.table.put({**marked[1], "due_pk": PURGE_DUE})
    purged = sum(sweep_once(svc)["purged"] for _ in range(3))
    assert purged == 8 and all(svc.table.get(*batch_key(b)) is None for b in ids)


def test_with_more_lanes_than_free_slots_lanes_take_turns_a_quantum_at_a_time(svc, sim_control):
    """Twelve small batches of four, eight free slots: a claim serves two lanes, a quantum each or all a lane
    has (two groups of four, not eight groups of one), and the next claims go on from the lane after the last
    one served, so every batch gets its turn; every request still ends once."""
    set_budgets(svc, {GLM: 8})
    owners = [authenticate(svc, new_key(svc)[1]) for _ in range(2)]  # at most 10 unfinished batches each
    batch_ids = [submit(svc, owners[b % 2], [chat_request(f"q{b}-{i}", f"quantum {b} {i}") for i in range(4)])
                 for b in range(12)]
    dispatcher = Dispatcher(svc)
    served = []
    for _ in range(6):
        units = dispatcher.claim(svc.catalog.get(GLM), limit=8)
        assert sorted(len(u["positions"]) for u in units) == [4, 4]  # a quantum each, or all the lane has
        served += [u["batch_id"] for u in units]
        assert not svc.queues.send(GLM, [queue_message(u) for u in units])
        run_queued(svc)  # the slots come back before the next claim
    assert sorted(served) == sorted(batch_ids)  # every lane once in six claims, none twice
    for b, batch_id in enumerate(batch_ids):
        final = pump(svc, batch_id)
        assert final["status"] == "completed" and final["completed"] == 4
        assert_ledger_consistent(svc, batch_id, owners[b % 2], [f"q{b}-{i}" for i in range(4)])


def test_a_batch_that_arrives_takes_freed_slots_until_it_holds_as_many_as_the_others(svc, sim_control,
                                                                                    monkeypatch):
    """Batch A holds 8 slots when B arrives: the next claim of 8 gives all of them to B (8 and 8), not half
    (12 and 4, which leaves B a round of calls behind); a lane with less work takes what it has, the rest
    going to the others in turn; every request still ends once."""
    monkeypatch.setattr(lanes, "scheduler_config",  # so three lanes are all read by a claim of 12
                        lambda settings: dataclasses.replace(scheduler_config(settings), lane_quantum=4))
    set_budgets(svc, {GLM: 32})
    who = authenticate(svc, new_key(svc, tier="internal")[1])
    a = submit(svc, who, [chat_request(f"a-{i}", f"older {i}") for i in range(40)])
    dispatcher = Dispatcher(svc)
    glm = svc.catalog.get(GLM)
    claimed = dispatcher.claim(glm, limit=8)
    assert sum(len(u["positions"]) for u in claimed) == 8
    b = submit(svc, who, [chat_request(f"b-{i}", f"newer {i}") for i in range(20)])
    units = dispatcher.claim(glm, limit=8)
    assert Counter(u["batch_id"] for u in units for _ in u["positions"]) == {b: 8}
    c = submit(svc, who, [chat_request(f"c-{i}", f"short {i}") for i in range(3)])
    units += (more := dispatcher.claim(glm, limit=12))  # C has 3 to give; A and B share the rest in turn
    assert Counter(u["batch_id"] for u in more for _ in u["positions"]) == {c: 3, a: 5, b: 4}
    assert not svc.queues.send(GLM, [queue_message(u) for u in claimed + units])
    run_queued(svc)
    for batch_id, prefix, n in ((a, "a", 40), (b, "b", 20), (c, "c", 3)):
        final = pump(svc, batch_id)
        assert final["status"] == "completed" and final["completed"] == n
        assert_ledger_consistent(svc, batch_id, who, [f"{prefix}-{i}" for i in range(n)])


def test_a_claim_reads_the_lanes_it_serves_not_every_batchs_and_new_dispatchers_start_anywhere(
        svc, sim_control, monkeypatch):
    """Thirty batches, eight free slots: each claim reads a few lane items from where the last one ended
    (not thirty), the claims still go round every lane once, and fresh dispatchers (workers pulling work)
    start at different places in the ring rather than all at the oldest batch."""
    set_budgets(svc, {GLM: 8})
    owners = [authenticate(svc, new_key(svc)[1]) for _ in range(3)]  # at most 10 unfinished batches each
    batch_ids = [submit(svc, owners[b % 3], [chat_request(f"r{b}-{i}", f"ring {b} {i}") for i in range(4)])
                 for b in range(30)]
    lane_items_read = []
    query = svc.table.query

    def counting(key_condition, vals, **kwargs):
        items, last = query(key_condition, vals, **kwargs)
        lane_items_read.extend(i for i in items if i["sk"].startswith("LANE#"))
        return items, last

    monkeypatch.setattr(svc.table, "query", counting)
    firsts = {Dispatcher(svc).lanes.in_turn(GLM, 3)[0][0]["batch_id"] for _ in range(20)}
    assert len(firsts) >= 3, firsts
    lane_items_read.clear()
    dispatcher = Dispatcher(svc)
    served = []
    for _ in range(15):
        before = len(lane_items_read)
        units = dispatcher.claim(svc.catalog.get(GLM), limit=8)
        assert sorted(len(u["positions"]) for u in units) == [4, 4]  # a quantum each, or all the lane has
        assert len(lane_items_read) - before <= 8, "a claim read more lanes than it could serve"
        served += [u["batch_id"] for u in units]
        assert not svc.queues.send(GLM, [queue_message(u) for u in units])
        run_queued(svc)
    assert sorted(served) == sorted(batch_ids)  # every lane once in fifteen claims, none twice


def test_worker_dying_after_recording_every_outcome_counts_them_once(svc, sim_control, monkeypatch):
    """Every outcome of the group was written, then the worker died before closing the group: the sweeper
    counts the outcomes from their items when the lease runs out, and nothing runs again."""
    configure(svc, lease_seconds=60)
    _, key = new_key(svc)
    who = authenticate(svc, key)
    requests = [chat_request(f"o-{i}", f"outcome {i}" + (" [[sim:flaky:1:500]]" if i == 1 else "")) for i in range(3)]
    batch_id = submit(svc, who, requests)

    def dying_close(*args, **kwargs):
        raise RuntimeError("worker process died")

    monkeypatch.setattr(run_request, "close_group", dying_close)
    assert Dispatcher(svc).pass_once() == 3
    report = run_messages(svc, GLM, receive(svc, GLM))
    assert report["failed"]
    monkeypatch.undo()
    stored = requests_by_custom_id(svc, batch_id)
    assert {c: r["state"] for c, r in stored.items()} == {"o-0": "completed", "o-1": "waiting", "o-2": "completed"}
    assert get_batch(svc, batch_id)["completed"] == 0  # not counted yet: the group still holds its slots

    svc.clock.advance(61)
    final = pump(svc, batch_id, clock_step=2)

    assert final["status"] == "completed" and final["completed"] == 3 and final["failed"] == 0
    assert_ledger_consistent(svc, batch_id, who, [r["custom_id"] for r in requests])
    assert final["cost_unknown_attempts"] == 0  # every attempt's outcome was recorded
    assert [r["attempt"] for r in stored_requests(svc, batch_id)] == [1, 2, 1]
    assert sim_stats(sim_control)["total_requests"] == 4


# --- 6: two dispatchers at once ----------------------------------------------------------------------

@pytest.mark.parametrize("pull,shard_slots", [(False, 64), (True, 64), (False, 2), (True, 2)],
                         ids=["queue-only", "workers-pull", "queue-only-sharded", "workers-pull-sharded"])
def test_two_dispatchers_never_double_dispatch_nor_pass_budgets(svc, sim_control, monkeypatch, pull, shard_slots):
    """Two dispatchers race for the same lanes; with `pull`, workers also claim their next request
    themselves (a third and fourth claimant). Nothing runs twice and no budget is passed: with the budgets
    split into shards of 2 slots (3 each) too, where every claimant picks a shard and gives back to it."""
    configure(svc, worker_pull=pull, budget_shard_slots=shard_slots)
    budgets = {GLM: 5, QWEN: 5}
    tier_limit = svc.settings.tier_limits["free"]
    assert tier_limit == 8
    set_budgets(svc, budgets)
    sim_config(sim_control, latency_seconds=0.3)
    account, key = new_key(svc, tier="free")
    who = authenticate(svc, key)
    requests = [chat_request(f"c-{i}", f"prompt {i}", model=GLM if i % 2 == 0 else QWEN) for i in range(60)]
    batch_id = submit(svc, who, requests)

    sent: Counter = Counter()
    sent_lock = threading.Lock()
    real_send = svc.queues.send

    def counting_send(model, messages):
        with sent_lock:
            sent.update((m["batch_id"], m.get("index", m.get("group"))) for m in messages)
        return real_send(model, messages)

    monkeypatch.setattr(svc.queues, "send", counting_send)
    lost: Counter = Counter()  # claims that lost a conditional write to the other dispatcher (or a budget)

    claimed: Counter = Counter()  # request index -> times claimed for a first attempt

    def watched(claim):
        def call(*args, **kwargs):
            try:
                units = claim(*args, **kwargs)
            except ConditionFailed:
                lost[claim.__name__] += 1
                raise
            if claim.__name__ == "claim_from_lane":
                with sent_lock:
                    claimed.update(p[0] for group in units for p in group["positions"])
            return units
        return call

    monkeypatch.setattr(lanes, "claim_from_lane", watched(lanes.claim_from_lane))
    monkeypatch.setattr(claim_pass, "claim_retry", watched(claim_pass.claim_retry))
    stop = threading.Event()
    errors: list[BaseException] = []
    peaks: Counter = Counter()

    def dispatcher_loop() -> None:
        dispatcher = Dispatcher(svc)
        while not stop.is_set():
            try:
                dispatcher.pass_once()
            except Exception as error:
                errors.append(error)
            time.sleep(0.05)

    async def run_all(messages: list[dict]) -> list:
        if pull:
            runs = [process_and_pull(svc, json.loads(m["Body"]), 60.0) for m in messages]
        else:
            runs = [process(svc, json.loads(m["Body"])) for m in messages]
        return await asyncio.gather(*runs, return_exceptions=True)

    def worker_loop(model: str) -> None:
        loop = asyncio.new_event_loop()  # one loop per worker, kept like a warm Lambda container keeps it
        try:
            while not stop.is_set():
                messages = receive(svc, model)
                if not messages:
                    time.sleep(0.01)
                    continue
                outcomes = loop.run_until_complete(run_all(messages))
                errors.extend(o for o in outcomes if isinstance(o, BaseException))
                svc.queues.sqs.delete_message_batch(QueueUrl=svc.queues.urls[model], Entries=[
                    {"Id": str(i), "ReceiptHandle": m["ReceiptHandle"]} for i, m in enumerate(messages)])
        finally:
            loop.close()

    def sampler() -> None:  # the budget counters, as often as the table allows
        while not stop.is_set():
            for model in budgets:
                budget = budget_of(svc, model)
                peaks[f"counter:{model}"] = max(peaks[f"counter:{model}"], budget.get("in_flight", 0))
                for k, shard in enumerate(budget["shards"]):
                    peaks[f"shard:{model}:{k}"] = max(peaks[f"shard:{model}:{k}"], shard["in_flight"])
            peaks["counter:account"] = max(peaks["counter:account"], account_counters(svc, account["id"])["in_flight"])
            time.sleep(0.05)

    # What really runs at once: every backend call of the worker, per model and in all.
    calling: Counter = Counter()
    real_call = openai_compat.call

    async def counted_call(model, *args, **kwargs):
        with sent_lock:
            calling[model.id] += 1
            calling["all"] += 1
            for name in (model.id, "all"):
                peaks[f"calling:{name}"] = max(peaks[f"calling:{name}"], calling[name])
        try:
            return await real_call(model, *args, **kwargs)
        finally:
            with sent_lock:
                calling[model.id] -= 1
                calling["all"] -= 1

    monkeypatch.setattr(openai_compat, "call", counted_call)

    # A worker loop per model runs one receive's messages at a time. With shards a dispatcher's claim takes one
    # shard's slots, so a model's slots travel in several messages: a poller per shard then (an event source
    # mapping runs as many invocations at once as the model's budget).
    pollers = -(-max(budgets.values()) // shard_slots)
    threads = [threading.Thread(target=dispatcher_loop), threading.Thread(target=dispatcher_loop),
               *(threading.Thread(target=worker_loop, args=(model,)) for model in (GLM, QWEN) for _ in range(pollers)),
               threading.Thread(target=sampler)]
    for thread in threads:
        thread.start()
    try:
        deadline = time.monotonic() + 40
        while time.monotonic() < deadline and get_batch(svc, batch_id)["completed"] < 60:
            time.sleep(0.1)
    finally:
        stop.set()
        for thread in threads:
            thread.join(timeout=10)
    sweep_once(svc)

    assert errors == []  # no ConditionFailed (or anything else) leaked out of a dispatcher or worker
    assert lost["claim_from_lane"] > 0, "the claimants never raced for a lane"
    assert sorted(claimed) == list(range(60)) and set(claimed.values()) == {1}, claimed
    assert set(sent.values()) == {1}, sent  # no group was sent twice
    if pull:  # pulled groups never go through the queue
        assert len(sent) < len(claimed), sent
    assert get_batch(svc, batch_id)["status"] == "completed"
    assert_ledger_consistent(svc, batch_id, who, [r["custom_id"] for r in requests])
    assert [r["attempt"] for r in stored_requests(svc, batch_id)] == [1] * 60
    for model, budget in budgets.items():
        assert 0 < peaks[f"counter:{model}"] <= budget, peaks
        assert 0 < peaks[f"calling:{model}"] <= budget, peaks
        shards = -(-budget // shard_slots)
        for k in range(shards):  # no shard ever held more than its share of the budget
            assert peaks[f"shard:{model}:{k}"] <= budget_share(budget, k, shards), peaks
        if shards > 1:  # and the claims really spread over them
            assert sum(peaks[f"shard:{model}:{k}"] > 0 for k in range(shards)) >= 2, peaks
    assert 0 < peaks["counter:account"] <= tier_limit and peaks["calling:all"] <= tier_limit, peaks
    stats = sim_stats(sim_control)
    assert stats["total_requests"] == 60
    assert stats["max_in_flight"] <= tier_limit, stats  # both models' budgets together (10) exceed the tier's 8
    assert stats["max_in_flight"] > max(budgets.values()), stats  # both models really ran at the same time


# --- 7: two sweepers at once --------------------------------------------------------------------------

class Rendezvous:
    """Holds back calls matching `match` until `parties` threads have made one (or `timeout` passes), so
    that racing sweepers really reach the same conditional write together."""

    def __init__(self, inner, match, parties: int = 2, timeout: float = 3.0) -> None:
        self._inner = inner
        self._match = match
        self._barrier = threading.Barrier(parties, timeout=timeout)
        self.arrived = 0

    def __getattr__(self, name: str):
        attr = getattr(self._inner, name)
        if not callable(attr):
            return attr

        def call(*args, **kwargs):
            if self._match(name, kwargs):
                self.arrived += 1
                try:
                    self._barrier.wait()
                except threading.BrokenBarrierError:
                    pass
            return attr(*args, **kwargs)

        return call


def _finalizes(name: str, kwargs: dict) -> bool:
    """The final transaction of settle_batch: it gives the account its unfinished batch back."""
    return name == "transact_write_items" and any(
        "unfinished_batches" in op.get("Update", {}).get("UpdateExpression", "") for op in kwargs["TransactItems"])


def _stops(name: str, kwargs: dict) -> bool:
    """The transaction that stops a batch (and removes its lanes)."""
    return name == "transact_write_items" and any(
        "#stop = :stop" in op.get("Update", {}).get("UpdateExpression", "") for op in kwargs["TransactItems"])


def race_sweepers(svc, match) -> tuple[Rendezvous, list]:
    real = svc.table.client
    gate = Rendezvous(real, match)
    svc.table.client = gate
    outcomes: list = []

    def sweeper() -> None:
        try:
            outcomes.append(sweep_once(svc))
        except Exception as error:
            outcomes.append(error)

    threads = [threading.Thread(target=sweeper) for _ in range(2)]
    try:
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=20)
    finally:
        svc.table.client = real
    return gate, outcomes


def test_two_sweepers_finish_a_batch_once(svc, sim_control):
    account, key = new_key(svc)
    who = authenticate(svc, key)
    requests = [chat_request(f"s-{i}", f"sweep {i}") for i in range(4)]
    batch_id = submit(svc, who, requests)
    Dispatcher(svc).pass_once()
    run_queued(svc)
    assert get_batch(svc, batch_id)["status"] == "in_progress"  # every request done, not yet settled
    assert account_counters(svc, account["id"])["unfinished_batches"] == 1

    gate, outcomes = race_sweepers(svc, _finalizes)

    assert gate.arrived == 2, "both sweepers should have reached the final transaction"
    assert not [o for o in outcomes if isinstance(o, BaseException)], outcomes
    assert sum(o["settled"] for o in outcomes) >= 1
    assert account_counters(svc, account["id"]) == {"unfinished_batches": 0, "unfinished_requests": 0,
                                                     "in_flight": 0}
    final = assert_ledger_consistent(svc, batch_id, who, [r["custom_id"] for r in requests])
    assert final["status"] == "completed" and final["completed"] == 4


def test_a_run_that_writes_into_a_result_file_another_run_just_finished_stops_quietly(svc, sim_control):
    """The worker and the sweeper may both finish a file batch: both pass the writer's check, the first writes
    the output file's part, completes the upload and saves; the second's part then goes into an upload that no
    longer exists (S3: NoSuchUpload). It stops as a run that lost the race does, the batch ends once, and its
    output file holds each result once."""
    configure(svc, file_batches_enabled=True)
    who = authenticate(svc, new_key(svc)[1])
    requests = [chat_request(f"w-{i}", f"written once {i}") for i in range(4)]
    batch_id = submit_file(svc, who, requests)
    sweep_once(svc)  # validated
    Dispatcher(svc).pass_once()
    run_queued(svc)
    # A run cut off right after it started the output file's upload: both runs below go on from there.
    deadline = time.monotonic() + 2
    real_start = svc.blobs.start_multipart

    def start_multipart(*args):
        upload_id = real_start(*args)
        time.sleep(max(0.0, deadline - time.monotonic()))
        return upload_id

    svc.blobs.start_multipart = start_multipart
    lifecycle.settle_batch(svc, batch_id, deadline=deadline)
    svc.blobs.start_multipart = real_start
    assert get_batch(svc, batch_id)["status"] == "finalizing"
    assert get_batch(svc, batch_id)["writing"]["output"]["upload_id"]

    both_in = threading.Barrier(2, timeout=10)
    first_done = threading.Event()
    real_put_part = svc.blobs.put_part
    arrivals = []

    def put_part(*args):
        arrivals.append(threading.current_thread().name)
        both_in.wait()  # both runs passed the writer's check
        if threading.current_thread().name == "second":
            first_done.wait(10)
        return real_put_part(*args)

    svc.blobs.put_part = put_part
    outcomes = {}

    def finish(name: str) -> None:
        try:
            outcomes[name] = lifecycle.settle_batch(svc, batch_id)
        except Exception as error:  # what a scheduled run would die of
            outcomes[name] = error
        finally:
            if name == "first":
                first_done.set()

    threads = [threading.Thread(target=finish, args=(name,), name=name) for name in ("first", "second")]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    svc.blobs.put_part = real_put_part

    assert sorted(arrivals) == ["first", "second"]
    assert not [o for o in outcomes.values() if isinstance(o, BaseException)], outcomes
    final = assert_ledger_consistent(svc, batch_id, who, [r["custom_id"] for r in requests])
    assert final["status"] == "completed" and final["completed"] == 4
    lines = [json.loads(x) for x in svc.blobs.get(f"files/{final['output_file_id']}/content").splitlines()]
    assert sorted(line["custom_id"] for line in lines) == [f"w-{i}" for i in range(4)]


def test_two_sweepers_expire_a_batch_once(svc, sim_control):
    set_budgets(svc, {GLM: 2})
    account, key = new_key(svc)
    who = authenticate(svc, key)
    requests = [chat_request(f"e-{i}", f"expire {i}") for i in range(6)]
    batch_id = submit(svc, who, requests)
    Dispatcher(svc).pass_once()
    run_queued(svc)  # two completed, four never dispatched
    svc.clock.advance(svc.settings.batch_completion_window_seconds + 1)

    gate, outcomes = race_sweepers(svc, lambda name, kw: _stops(name, kw) or _finalizes(name, kw))

    assert not [o for o in outcomes if isinstance(o, BaseException)], outcomes
    assert gate.arrived == 4, "both sweepers should have tried to stop, then to finish, the batch"
    assert sum(o["expired"] for o in outcomes) == 1
    assert account_counters(svc, account["id"]) == {"unfinished_batches": 0, "unfinished_requests": 0,
                                                     "in_flight": 0}
    final = assert_ledger_consistent(svc, batch_id, who, [r["custom_id"] for r in requests])
    assert final["status"] == "expired" and final["completed"] == 2 and final["failed"] == 4


# --- 8: DynamoDB throttling ---------------------------------------------------------------------------

class Throttling:
    """Refuses a third of the writes for capacity (a seeded, so repeatable, draw per write; a strict
    every-third-call pattern can lock step with a three-write cycle of the pipeline and starve one request
    for ever), alternating the two forms DynamoDB uses."""

    WRITES = ("transact_write_items", "update_item")

    def __init__(self, inner, rate: float = 1 / 3, seed: int = 3) -> None:
        self._inner = inner
        self.rate = rate
        self.rng = random.Random(seed)
        self.lock = threading.Lock()  # the worker writes from several threads
        self.throttled: Counter = Counter()
        self.enabled = True

    def __getattr__(self, name: str):
        attr = getattr(self._inner, name)
        if name not in self.WRITES:
            return attr

        def call(*args, **kwargs):
            with self.lock:
                throttle = self.enabled and self.rng.random() < self.rate
                if throttle:
                    self.throttled[name] += 1
                    cancelled = name == "transact_write_items" and self.throttled[name] % 2 == 0
            if throttle:
                if cancelled:
                    items = kwargs.get("TransactItems", [])
                    raise ClientError({"Error": {"Code": "TransactionCanceledException",
                                                 "Message": "Transaction cancelled [ThrottlingError]"},
                                       "CancellationReasons": [{"Code": "ThrottlingError"}] +
                                       [{"Code": "None"}] * (len(items) - 1)}, "TransactWriteItems")
                raise ClientError({"Error": {"Code": "ProvisionedThroughputExceededException",
                                             "Message": "Throughput exceeds the current capacity"}},
                                  "TransactWriteItems" if name == "transact_write_items" else "UpdateItem")
            return attr(*args, **kwargs)

        return call


def test_throttled_writes_do_not_break_the_ledger(svc, sim_control):
    configure(svc, lease_seconds=30)
    set_budgets(svc, {GLM: 4, QWEN: 4})
    _, key = new_key(svc)
    who = authenticate(svc, key)
    requests = [chat_request(f"t-{i}", f"throttle {i}" + (" [[sim:flaky:1:500]]" if i % 5 == 0 else ""),
                             model=GLM if i % 3 else QWEN) for i in range(30)]
    batch_id = submit(svc, who, requests)
    throttling = Throttling(svc.table.client)
    svc.table.client = throttling
    escaped: list = []

    # Leases run out while throttled outcomes wait to be recovered: the clock moves past them each round.
    final = pump(svc, batch_id, clock_step=31, tolerate=True, errors=escaped)

    throttling.enabled = False
    assert sum(throttling.throttled.values()) > 10, throttling.throttled
    assert final["status"] == "completed"
    assert_ledger_consistent(svc, batch_id, who, [r["custom_id"] for r in requests])
    stored = stored_requests(svc, batch_id)
    assert all(r["state"] == "completed" for r in stored)
    # Every backend call made is either the recorded successful one or a counted attempt.
    stats = sim_stats(sim_control)
    assert stats["total_requests"] == sum(r["attempt"] for r in stored)


class ThrottleOnce:
    """Throttles the `nth` write matching `match` and the `times - 1` matching writes after it (the storage
    layer tries a throttled write again a few times, so a persistent throttle needs `times` > 6)."""

    def __init__(self, inner, match, nth: int = 1, times: int = 1) -> None:
        self._inner = inner
        self._match = match
        self._left = nth
        self._times = times
        self.fired = False

    def __getattr__(self, name: str):
        attr = getattr(self._inner, name)
        if not callable(attr):
            return attr

        def call(*args, **kwargs):
            if self._times > 0 and self._match(name, kwargs):
                self._left -= 1
                if self._left <= 0:
                    self.fired = True
                    self._times -= 1
                    raise ClientError({"Error": {"Code": "ProvisionedThroughputExceededException",
                                                 "Message": "Throughput exceeds the current capacity"}}, name)
            return attr(*args, **kwargs)

        return call


def _claims(name: str, kwargs: dict) -> bool:
    """A dispatcher's claim on a lane: a transaction that creates groups."""
    return name == "transact_write_items" and any(op.get("Put", {}).get("Item", {}).get("sk", {}).get("S", "")
                                                  .startswith("GRP#") for op in kwargs["TransactItems"])


def live_groups(svc, batch_id: str) -> list[dict]:
    return list(svc.table.query_all("pk = :pk AND begins_with(sk, :g)", {":pk": f"BATCH#{batch_id}", ":g": "GRP#"},
                                    consistent=True))


def queued_messages(svc, model: str) -> int:
    attributes = svc.queues.sqs.get_queue_attributes(
        QueueUrl=svc.queues.urls[model], AttributeNames=["ApproximateNumberOfMessages"])["Attributes"]
    return int(attributes["ApproximateNumberOfMessages"])


def test_throttled_claim_does_not_strand_requests_claimed_before_it(svc, sim_control):
    """A pass that claims two lanes and is throttled on the second must still send the first lane's
    requests: they hold model and account slots, and with no message they wait out a whole lease."""
    configure(svc, lease_seconds=300)
    _, key = new_key(svc)
    who = authenticate(svc, key)
    first = submit(svc, who, [chat_request(f"a-{i}", f"first {i}") for i in range(3)])
    second = submit(svc, who, [chat_request(f"b-{i}", f"second {i}") for i in range(3)])
    real = svc.table.client
    gate = ThrottleOnce(real, _claims, nth=2, times=10)  # the second claim stays throttled past its retries
    svc.table.client = gate
    Dispatcher(svc).pass_once()  # Throttled is caught inside pass_once
    svc.table.client = real
    assert gate.fired
    dispatched = [g for b in (first, second) for g in live_groups(svc, b) if g["state"] == "dispatched"]
    assert sum(len(g["positions"]) for g in dispatched) == 3  # one lane was claimed: its requests hold slots
    stranded = len(dispatched) - queued_messages(svc, GLM)

    # The ledger still recovers them, one lease later.
    for batch_id in (first, second):
        assert pump(svc, batch_id, clock_step=301)["status"] == "completed"
    for batch_id in (first, second):
        assert_ledger_consistent(svc, batch_id, who)
    assert stranded == 0, f"{stranded} claimed requests were never sent to their queue"


def _records_outcome(name: str, kwargs: dict) -> bool:
    """The worker's write of a group's outcome: the transaction ending a `running` group."""
    return name == "transact_write_items" and any(
        op.get("Delete", {}).get("ExpressionAttributeValues", {}).get(":s") == {"S": "running"}
        for op in kwargs["TransactItems"])


def test_throttled_outcome_write_does_not_run_the_request_again(svc, sim_control):
    """The backend answered and the worker still holds the lease; a throttled write of that answer should be
    tried again rather than dropped, which makes the request run (and be billed) a second time."""
    configure(svc, lease_seconds=60)
    _, key = new_key(svc)
    who = authenticate(svc, key)
    batch_id = submit(svc, who, [chat_request("once", "answer me once")])
    real = svc.table.client
    gate = ThrottleOnce(real, _records_outcome)
    svc.table.client = gate

    final = pump(svc, batch_id, clock_step=61, tolerate=True)

    svc.table.client = real
    assert gate.fired
    assert final["status"] == "completed"
    assert_ledger_consistent(svc, batch_id, who)
    assert sim_stats(sim_control)["total_requests"] == 1, "the request ran twice"
    assert stored_requests(svc, batch_id)[0]["attempt"] == 1
    assert final["cost_unknown_attempts"] == 0


def test_throttled_stop_leaves_no_dead_lane(svc, sim_control):
    """The sweeper stops an expiring batch and is throttled doing so. The lanes go in the same transaction
    as the stop, so either both happen or neither; the batch still ends, no lane of it stays behind (a dead
    lane would take a share of every dispatcher pass for ever), and one throttled batch does not abort the
    sweep."""
    configure(svc, batch_completion_window_seconds=600, lease_seconds=3600)
    set_budgets(svc, {GLM: 4})
    _, key = new_key(svc)
    who = authenticate(svc, key)
    expiring = submit(svc, who, [chat_request(f"l-{i}", f"lane {i}") for i in range(8)])
    Dispatcher(svc).pass_once()
    run_queued(svc)  # four completed, four never dispatched
    svc.clock.advance(601)
    real = svc.table.client
    gate = ThrottleOnce(real, _stops, times=10)
    svc.table.client = gate
    sweep_once(svc)  # the throttled batch is left for the next pass; nothing escapes
    svc.table.client = real
    assert gate.fired and not get_batch(svc, expiring).get("stop")
    final = pump(svc, expiring)
    assert final["status"] == "expired"

    # A new batch on the same model: one pass should fill the model's four free slots with it.
    _, other_key = new_key(svc)
    other_who = authenticate(svc, other_key)
    fresh = submit(svc, other_who, [chat_request(f"f-{i}", f"fresh {i}") for i in range(4)])
    first_pass = Dispatcher(svc).pass_once()
    assert pump(svc, fresh)["status"] == "completed"
    assert_ledger_consistent(svc, fresh, other_who)
    assert_ledger_consistent(svc, expiring, who)
    assert first_pass == 4, f"the dead lane took {4 - first_pass} of 4 free slots"


# --- 9: a backend that fails 30 % of the time ---------------------------------------------------------

def test_noisy_backend_every_request_ends_and_adds_up(svc, sim_control, monkeypatch):
    configure(svc, backend_timeout_seconds=0.3)
    sim_config(sim_control, rate_429=0.1, rate_500=0.1, rate_timeout=0.1, timeout_sleep_seconds=1, seed=7)
    _, key = new_key(svc)
    who = authenticate(svc, key)
    requests = [chat_request(f"n-{i}", f"noisy {i}", model=GLM if i % 2 else QWEN) for i in range(40)]
    batch_id = submit(svc, who, requests)
    unanswered = []  # attempts the worker saw no answer to (the simulator may still have answered late)
    real_call = openai_compat.call

    async def watched_call(*args, **kwargs):
        attempt = await real_call(*args, **kwargs)
        if attempt.status_code is None:
            unanswered.append(attempt)
        return attempt

    monkeypatch.setattr(openai_compat, "call", watched_call)

    final = pump(svc, batch_id, clock_step=2)

    assert final["status"] == "completed"
    assert_ledger_consistent(svc, batch_id, who, [r["custom_id"] for r in requests])
    stored = stored_requests(svc, batch_id)
    results = batches.results_page(svc, who, batch_id, 1000, None)["data"]
    for item, result in zip(stored, results, strict=True):
        assert item["state"] in ("completed", "failed")
        assert 1 <= item["attempt"] <= 8
        if item["state"] == "failed":  # only retryable errors happen here: they fail after every attempt
            assert item["attempt"] == 8 and result["error"]["code"] in ("rate_limited", "upstream_error", "timeout")
    stats = sim_stats(sim_control, settle=True)
    attempts = sum(r["attempt"] for r in stored)
    # Every answered attempt reached the backend and nothing else did; an attempt that timed out on a busy
    # machine may have given up before its request arrived.
    assert attempts - len(unanswered) <= stats["total_requests"] <= attempts
    assert sum(r["attempt"] > 1 for r in stored) >= 5, "the faults should have forced retries"
    timed_out = stats["total_requests"] - sum(stats["by_status"].get(code, 0) for code in ("200", "429", "500"))
    # Of those, the ones sent are of unknown cost; a connection that was never made (a connect timing out on a
    # busy machine) carried nothing, and costs nothing.
    sent = [a for a in unanswered if a.sent]
    assert final["cost_unknown_attempts"] == len(sent) >= timed_out > 0, (final, stats)


def submit_file(svc, who, requests: list[dict]) -> str:
    """A batch from an uploaded file of these requests (as the OpenAI SDK creates one)."""
    from batchinfer.protocols.openai import files

    data = b"".join(json.dumps({"method": "POST", "url": "/v1/chat/completions", **r}).encode() + b"\n"
                    for r in requests)
    upload = files.upload(svc, who, filename="in.jsonl", purpose="batch", data=data, expires_after=None)
    body = {"input_file_id": upload["id"], "endpoint": "/v1/chat/completions", "completion_window": "24h"}
    obj, created = batches.create_batch(svc, who, json.dumps(body).encode(), None)
    assert created and obj["status"] == "validating"
    return obj["id"]


def test_noisy_backend_file_batch_writes_one_line_per_request(svc, sim_control):
    """Retries, final failures and timeouts in a batch from a file: its result files hold each request once,
    successes in the output file and every other request in the error file, as /results shows them."""
    configure(svc, backend_timeout_seconds=0.3, file_batches_enabled=True, max_attempts=2)
    sim_config(sim_control, rate_429=0.15, rate_500=0.15, rate_timeout=0.1, timeout_sleep_seconds=1, seed=11)
    _, key = new_key(svc)
    who = authenticate(svc, key)
    requests = [chat_request(f"f-{i}", f"noisy file {i}", model=GLM) for i in range(30)]
    requests[5] = chat_request("f-5", "[[sim:400]] refuse this", model=GLM)
    batch_id = submit_file(svc, who, requests)
    final = pump(svc, batch_id, clock_step=2)
    assert final["status"] == "completed" and final["output_file_id"] and final["error_file_id"]
    assert_ledger_consistent(svc, batch_id, who, [r["custom_id"] for r in requests])
    assert final["failed"] >= 2  # the invalid request, and at least one that failed both attempts


def test_cancelled_file_batch_lists_unstarted_requests_in_its_error_file(svc, sim_control):
    configure(svc, file_batches_enabled=True)
    _, key = new_key(svc)
    who = authenticate(svc, key)
    requests = [chat_request(f"c-{i}", f"cancel me {i}", model=GLM) for i in range(60)]
    batch_id = submit_file(svc, who, requests)
    sweep_once(svc)  # validated: its requests may now run
    dispatch_in_groups(svc, GLM, [3])
    batches.cancel_batch(svc, who, batch_id)
    final = pump(svc, batch_id)
    assert final["status"] == "cancelled"
    assert_ledger_consistent(svc, batch_id, who, [r["custom_id"] for r in requests])
    errors = [json.loads(x) for x in svc.blobs.get(f"files/{final['error_file_id']}/content").splitlines()]
    assert sum(e["error"] == {"code": "batch_cancelled", "message": "Not run: the batch was cancelled."}
               for e in errors) >= 57


# --- 10: expiry and cancellation ----------------------------------------------------------------------

def dispatch_in_groups(svc, model: str, sizes: list[int]) -> list[int]:
    """Claim and send the model's next requests as groups of these sizes (a dispatcher pass would make one
    group of them all); returns the sizes claimed."""
    dispatcher = Dispatcher(svc)
    claimed = []
    for size in sizes:
        units = dispatcher.claim(svc.catalog.get(model), limit=size)
        assert not svc.queues.send(model, [queue_message(u) for u in units])
        claimed.append(sum(len(u.get("positions", [u])) for u in units))
    return claimed


def start_one_running(svc, sim_control, model: str = GLM) -> tuple[threading.Thread, int]:
    """Receive one queued message (a group of one) and run it in a worker thread until the backend holds it."""
    messages = receive(svc, model, n=1)
    assert len(messages) == 1
    body = json.loads(messages[0]["Body"])
    index = body.get("index", body.get("group"))
    thread = threading.Thread(target=run_messages, args=(svc, model, messages))
    thread.start()
    deadline = time.monotonic() + 5
    while sim_stats(sim_control)["in_flight"] < 1:
        assert time.monotonic() < deadline, "the request never reached the backend"
        time.sleep(0.01)
    return thread, index


def test_completion_window_closing_expires_unstarted_requests(svc, sim_control):
    # x-0's retry must not fall due while the test runs (the clock moves with real time too).
    configure(svc, batch_completion_window_seconds=600, lease_seconds=3600, retry_base_seconds=60,
              retry_max_seconds=120)
    set_budgets(svc, {GLM: 3})
    _, key = new_key(svc)
    who = authenticate(svc, key)
    requests = [chat_request(f"x-{i}", f"expiry {i}" + (" [[sim:flaky:1:500]]" if i == 0 else ""))
                for i in range(10)]
    batch_id = submit(svc, who, requests)
    dispatcher = Dispatcher(svc)
    assert dispatcher.pass_once() == 3
    run_queued(svc)  # x-0 failed once and waits for its retry; x-1, x-2 completed
    assert dispatch_in_groups(svc, GLM, [1, 1, 1]) == [1, 1, 1]  # x-3..x-5 on the queue; x-0 not due yet
    sim_config(sim_control, latency_seconds=0.5)
    running, running_index = start_one_running(svc, sim_control)

    svc.clock.advance(601)  # the completion window closes while one request runs and two are queued
    sweep_once(svc)
    batch = get_batch(svc, batch_id)
    assert batch["stop"] == "expire" and batch["status"] == "in_progress"
    running.join(timeout=10)
    sim_config(sim_control, latency_seconds=0)
    final = pump(svc, batch_id)

    assert final["status"] == "expired"
    assert_ledger_consistent(svc, batch_id, who, [r["custom_id"] for r in requests])
    results = batches.results_page(svc, who, batch_id, 1000, None)["data"]
    statuses = {r["custom_id"]: r["status"] for r in results}
    assert statuses.pop(f"x-{running_index}") == "completed"  # running when the window closed: it finishes
    assert statuses.pop("x-1") == statuses.pop("x-2") == "completed"
    assert statuses.pop("x-0") == "failed"  # it had started: it keeps its last error
    assert set(statuses.values()) == {"expired"} and len(statuses) == 6
    for r in results:
        if r["status"] == "expired":
            assert r["error"]["code"] == "batch_expired" and r["response"] is None
    assert final["completed"] == 3 and final["failed"] == 7
    assert sim_stats(sim_control)["total_requests"] == 4  # nothing started after the window closed


def test_cancel_while_requests_are_queued_and_running(svc, sim_control):
    configure(svc, lease_seconds=3600)
    set_budgets(svc, {GLM: 3})
    _, key = new_key(svc)
    who = authenticate(svc, key)
    requests = [chat_request(f"k-{i}", f"cancel {i}") for i in range(10)]
    batch_id = submit(svc, who, requests)
    dispatcher = Dispatcher(svc)
    dispatcher.pass_once()
    run_queued(svc)  # k-0..k-2 completed
    assert dispatch_in_groups(svc, GLM, [1, 1, 1]) == [1, 1, 1]
    sim_config(sim_control, latency_seconds=0.5)
    running, running_index = start_one_running(svc, sim_control)

    cancelling = batches.cancel_batch(svc, who, batch_id)
    assert cancelling["status"] == "cancelling"
    assert dispatcher.pass_once() == 0
    running.join(timeout=10)
    sim_config(sim_control, latency_seconds=0)
    final = pump(svc, batch_id)

    assert final["status"] == "cancelled"
    assert_ledger_consistent(svc, batch_id, who, [r["custom_id"] for r in requests])
    statuses = {r["custom_id"]: r["status"] for r in batches.results_page(svc, who, batch_id, 1000, None)["data"]}
    completed = {"k-0", "k-1", "k-2", f"k-{running_index}"}
    assert {c for c, s in statuses.items() if s == "completed"} == completed
    assert {c for c, s in statuses.items() if s != "completed"} == set(statuses) - completed
    assert {s for c, s in statuses.items() if c not in completed} == {"cancelled"}
    assert final["completed"] == 4 and final["failed"] == 0  # cancelled requests count nowhere
    assert sim_stats(sim_control)["total_requests"] == 4
    assert batches.cancel_batch(svc, who, batch_id)["status"] == "cancelled"  # cancelling again changes nothing


def test_batch_finished_before_its_window_closed_is_completed_not_expired(svc, sim_control):
    """Every request ran (and finished) inside the window; only the sweep came after it closed."""
    configure(svc, batch_completion_window_seconds=600, lease_seconds=3600)
    _, key = new_key(svc)
    who = authenticate(svc, key)
    batch_id = submit(svc, who, [chat_request(f"w-{i}", f"in time {i}") for i in range(3)])
    Dispatcher(svc).pass_once()
    run_queued(svc)
    assert all(r["state"] == "completed" for r in stored_requests(svc, batch_id))
    svc.clock.advance(601)

    final = pump(svc, batch_id)

    assert_ledger_consistent(svc, batch_id, who)
    assert final["completed"] == 3 and final["failed"] == 0
    assert final["status"] == "completed", "no request was left unstarted when the window closed"


def test_no_request_starts_after_the_window_closed(svc, sim_control):
    """The window closes between two dispatcher passes, before the sweeper's next run: nothing may start."""
    configure(svc, batch_completion_window_seconds=600, lease_seconds=3600)
    set_budgets(svc, {GLM: 2})
    _, key = new_key(svc)
    who = authenticate(svc, key)
    batch_id = submit(svc, who, [chat_request(f"late-{i}", f"late {i}") for i in range(6)])
    Dispatcher(svc).pass_once()
    run_queued(svc)  # two ran inside the window
    svc.clock.advance(601)

    final = pump(svc, batch_id)  # dispatcher, worker, then sweeper, as scheduled

    assert final["status"] == "expired"
    assert_ledger_consistent(svc, batch_id, who)
    started_late = sim_stats(sim_control)["total_requests"] - 2
    assert started_late == 0, f"{started_late} requests started after the completion window closed"
    assert final["completed"] == 2 and final["failed"] == 4


# --- 11: the owner's key is revoked mid-batch ---------------------------------------------------------

def test_revoked_owner_fails_the_batch(svc, sim_control):
    # A long backoff keeps the flaky request waiting through the revocation.
    configure(svc, retry_base_seconds=30.0, retry_max_seconds=60.0)
    set_budgets(svc, {GLM: 3})
    _, key = new_key(svc)
    who = authenticate(svc, key)
    requests = [chat_request(f"v-{i}", f"revoke {i}" + (" [[sim:flaky:1:500]]" if i == 3 else ""))
                for i in range(12)]
    batch_id = submit(svc, who, requests)
    dispatcher = Dispatcher(svc)
    for _ in range(2):
        assert dispatcher.pass_once() == 3
        run_queued(svc)
    assert requests_by_custom_id(svc, batch_id)["v-3"]["state"] == "waiting"
    assert dispatcher.pass_once() == 3  # v-6..v-8 queued

    accounts.revoke_key(svc, key)
    final = pump(svc, batch_id)

    assert final["status"] == "failed"
    assert final["error"]["code"] == "owner_unauthorized"
    assert_ledger_consistent(svc, batch_id, who, [r["custom_id"] for r in requests])
    results = results_by_custom_id(svc, who, batch_id)
    assert {c for c, r in results.items() if r["status"] == "completed"} == {"v-0", "v-1", "v-2", "v-4", "v-5"}
    assert results["v-3"]["status"] == "failed" and results["v-3"]["error"]["code"] == "upstream_error"
    for i in range(6, 12):
        assert results[f"v-{i}"]["status"] == "failed" and results[f"v-{i}"]["error"]["code"] == "batch_failed"
    assert final["completed"] == 5 and final["failed"] == 7
    assert batches.batch_object(final)["error"]["code"] == "owner_unauthorized"
    assert sim_stats(sim_control)["total_requests"] == 6  # nothing ran after the key was revoked


def test_revocation_racing_a_cancel_does_not_count_a_cancelled_request_as_failed(svc, sim_control, monkeypatch):
    """The user cancels (with another key) between the worker's read of the batch and its key check; the
    worker then finds the creating key revoked. The cancel won, so the request is cancelled, not failed."""
    set_budgets(svc, {GLM: 1})
    account, key = new_key(svc)
    who = authenticate(svc, key)
    accounts.create_key(svc, account["id"])  # the account keeps a valid key to manage its batches with
    batch_id = submit(svc, who, [chat_request(f"rc-{i}", f"race {i}") for i in range(3)])
    assert Dispatcher(svc).pass_once() == 1
    accounts.revoke_key(svc, key)
    real_key_problem = run_request.key_problem
    cancelled = []

    def key_problem_after_cancel(*args, **kwargs):
        if not cancelled:
            cancelled.append(batches.cancel_batch(svc, who, batch_id)["status"])
        return real_key_problem(*args, **kwargs)

    monkeypatch.setattr(run_request, "key_problem", key_problem_after_cancel)
    final = pump(svc, batch_id)

    assert cancelled == ["cancelling"]
    assert final["status"] == "cancelled" and final["stop"] == "cancel"
    assert sim_stats(sim_control)["total_requests"] == 0
    assert_ledger_consistent(svc, batch_id, who)
    assert final["completed"] == 0 and final["failed"] == 0


# --- 12: retention --------------------------------------------------------------------------------------

def _objects(svc, batch_id: str) -> list[str]:
    listed = svc.blobs.s3.list_objects_v2(Bucket=svc.blobs.bucket, Prefix=f"batches/{batch_id}/")
    return [o["Key"] for o in listed.get("Contents", [])]


def test_retention_end_removes_the_batch_and_leaves_its_request_items_to_ttl(svc, sim_control):
    """When a finished batch's retention ends, the sweeper deletes the batch record and its objects; its
    request items, unreachable from then on, carry a TTL a little later (DynamoDB deletes them for free)."""
    configure(svc, batch_retention_seconds=3600)
    _, key = new_key(svc)
    who = authenticate(svc, key)
    batch_id = submit(svc, who, [chat_request(f"r-{i}", f"retain {i}") for i in range(3)])
    final = pump(svc, batch_id)
    assert final["status"] == "completed" and _objects(svc, batch_id)
    items = stored_requests(svc, batch_id)
    assert len(items) == 3
    for item in items:  # after the results go, and at most a day plus the window later
        assert final["results_expires_at"] < item["ttl"] <= final["expires_at"] + 3600 + 86400

    # The clock runs with real time too: move it to just before the retention ends, whenever pump finished.
    svc.clock.advance(final["results_expires_at"] - svc.clock() - 1)
    sweep_once(svc)
    assert get_batch(svc, batch_id) is not None  # not before its retention ends
    svc.clock.advance(2)
    assert sweep_once(svc)["purged"] == 1
    assert get_batch(svc, batch_id) is None and _objects(svc, batch_id) == []
    with pytest.raises(ApiError) as gone:
        batches.results_page(svc, who, batch_id, 10, None)
    assert gone.value.status == 404


def test_deleting_a_batch_deletes_its_request_items_in_the_next_sweep(svc, sim_control):
    _, key = new_key(svc)
    who = authenticate(svc, key)
    batch_id = submit(svc, who, [chat_request(f"d-{i}", f"delete {i}") for i in range(3)])
    pump(svc, batch_id)
    assert len(stored_requests(svc, batch_id)) == 3
    assert batches.delete_batch(svc, who, batch_id)["deleted"] is True  # at once: marked, not yet removed
    assert sweep_once(svc)["purged"] == 1
    assert stored_requests(svc, batch_id) == [] and _objects(svc, batch_id) == []
    assert get_batch(svc, batch_id) is None


# --- Message Batches: the same scheduler, the same invariants --------------------------------------------

def message_entry(custom_id: str, content: str, model: str = GLM, **params) -> dict:
    return {"custom_id": custom_id, "params": {"model": model, "max_tokens": 32,
                                               "messages": [{"role": "user", "content": content}], **params}}


def submit_messages(svc, who, entries: list[dict], version: str = "2026-10-21") -> str:
    from batchinfer.protocols.anthropic import message_batches

    configure(svc, message_batches_enabled=True)
    item, created = message_batches.create(svc, who, json.dumps({"requests": entries}).encode(), None, version)
    assert created and item["status"] == "in_progress"
    return item["id"]


def test_noisy_backend_message_batch_every_request_ends_and_adds_up(svc, sim_control):
    configure(svc, backend_timeout_seconds=0.3)
    sim_config(sim_control, rate_429=0.1, rate_500=0.1, rate_timeout=0.1, timeout_sleep_seconds=1, seed=11)
    _, key = new_key(svc)
    who = authenticate(svc, key)
    entries = [message_entry(f"m-{i}", f"noisy message {i}", model=GLM if i % 2 else QWEN) for i in range(30)]
    entries[4] = message_entry("m-4", "x", thinking={"type": "enabled", "budget_tokens": 1024})  # errors at intake
    entries[9] = message_entry("m-9", "x", model="no-such-model")
    batch_id = submit_messages(svc, who, entries)

    final = pump(svc, batch_id, clock_step=2)

    assert final["status"] == "completed" and final["rejected"] == 2
    assert_ledger_consistent(svc, batch_id, who, [e["custom_id"] for e in entries])
    assert len(stored_requests(svc, batch_id)) == 28  # the two rejected ones never got a request item
    assert sum(r["attempt"] > 1 for r in stored_requests(svc, batch_id)) >= 3, "the faults should force retries"


def test_worker_dying_holding_a_message_batch_group_is_recovered(svc, sim_control, monkeypatch):
    configure(svc, lease_seconds=60)
    _, key = new_key(svc)
    who = authenticate(svc, key)
    entries = [message_entry("dies", "the worker dies after this answer"), message_entry("bad", "x", model="nope"),
               message_entry("fine", "all good")]
    batch_id = submit_messages(svc, who, entries, version="2023-06-01")
    real_record = run_request.record_position
    died = []

    def dying_record(svc_, item):
        if item["custom_id"] == "dies" and not died:
            died.append(item["state"])
            raise RuntimeError("worker process died")
        return real_record(svc_, item)

    monkeypatch.setattr(run_request, "record_position", dying_record)
    assert Dispatcher(svc).pass_once() == 2  # the rejected request joins no lane
    report = run_messages(svc, GLM, receive(svc, GLM))
    assert died == ["completed"] and report["failed"]
    svc.clock.advance(61)
    final = pump(svc, batch_id, clock_step=2)

    assert final["status"] == "completed" and final["completed"] == 2 and final["failed"] == 1
    assert_ledger_consistent(svc, batch_id, who, ["dies", "bad", "fine"])
    assert final["cost_unknown_attempts"] == 1
    assert sim_stats(sim_control)["total_requests"] == 3


def test_message_batch_cancelled_while_queued_and_running(svc, sim_control):
    from batchinfer.protocols.anthropic import message_batches

    configure(svc, lease_seconds=3600)
    set_budgets(svc, {GLM: 3})
    _, key = new_key(svc)
    who = authenticate(svc, key)
    entries = [message_entry(f"k-{i}", f"cancel {i}") for i in range(8)] + [message_entry("bad", "x", model="nope")]
    batch_id = submit_messages(svc, who, entries)
    dispatcher = Dispatcher(svc)
    dispatcher.pass_once()
    run_queued(svc)  # k-0..k-2 succeeded
    assert dispatch_in_groups(svc, GLM, [1, 1, 1]) == [1, 1, 1]
    sim_config(sim_control, latency_seconds=0.5)
    running, running_index = start_one_running(svc, sim_control)

    canceling = message_batches.message_batch_object(message_batches.cancel(svc, who, batch_id), "")
    assert canceling["processing_status"] == "canceling"
    running.join(timeout=10)
    sim_config(sim_control, latency_seconds=0)
    final = pump(svc, batch_id)

    assert final["status"] == "cancelled"
    assert_ledger_consistent(svc, batch_id, who, [e["custom_id"] for e in entries])
    assert message_batches.request_counts(final) == {"processing": 0, "succeeded": 4, "errored": 1,
                                                     "canceled": 4, "expired": 0}
    assert sim_stats(sim_control)["total_requests"] == 4


def test_message_batch_window_closing_expires_unstarted_requests(svc, sim_control):
    from batchinfer.protocols.anthropic import message_batches

    configure(svc, lease_seconds=3600)
    set_budgets(svc, {GLM: 2})
    _, key = new_key(svc)
    who = authenticate(svc, key)
    entries = [message_entry(f"x-{i}", f"expiry {i}") for i in range(6)] + [message_entry("bad", "x", model="nope")]
    batch_id = submit_messages(svc, who, entries)
    Dispatcher(svc).pass_once()
    run_queued(svc)  # x-0, x-1 succeeded
    assert dispatch_in_groups(svc, GLM, [1]) == [1]  # x-2 queued when the window closes: it never starts

    svc.clock.advance(24 * 3600 + 1)  # a Message Batch's window is always 24 hours
    final = pump(svc, batch_id)

    assert final["status"] == "expired"
    assert_ledger_consistent(svc, batch_id, who, [e["custom_id"] for e in entries])
    assert message_batches.request_counts(final) == {"processing": 0, "succeeded": 2, "errored": 1,
                                                     "canceled": 0, "expired": 4}
    assert sim_stats(sim_control)["total_requests"] == 2


# --- The slot pump: a worker holding slots and claims ahead (scheduling.pump.SlotPump) ---------------------

def budget_in_flight(svc, model: str = GLM) -> int:
    return int((svc.table.get(*model_budget_key(model)) or {}).get("in_flight", 0))


def slot_leases(svc, model: str = GLM) -> list[dict]:
    return list(svc.table.query_all("pk = :pk AND begins_with(sk, :s)", {":pk": f"MODEL#{model}", ":s": "SLOTS#"},
                                    consistent=True))


def run_pump(svc, slots: int, seconds: float = 30.0) -> Counter:
    """One worker invocation's pump on GLM, as process_and_pull runs it after its message."""
    deadline = time.monotonic() + seconds
    return asyncio.run(run_request.slot_pump(svc, svc.catalog.get(GLM), deadline).run(slots))


def test_pump_runs_a_batch_within_its_slots_and_gives_them_back(svc, sim_control):
    set_budgets(svc, {GLM: 4})
    sim_config(sim_control, latency_seconds=0.05)
    _, key = new_key(svc)
    who = authenticate(svc, key)
    requests = [chat_request(f"p-{i}", f"pumped {i}" + (" [[sim:flaky:1:500]]" if i == 5 else "")) for i in range(30)]
    batch_id = submit(svc, who, requests)

    outcome = run_pump(svc, slots=10)

    assert outcome["completed"] >= 29, outcome
    assert sim_stats(sim_control, settle=True)["max_in_flight"] <= 4  # the budget's 4, not the 10 asked for
    assert budget_in_flight(svc) == 0 and slot_leases(svc) == []
    final = pump(svc, batch_id)
    assert final["status"] == "completed" and final["completed"] == 30
    assert_ledger_consistent(svc, batch_id, who, [r["custom_id"] for r in requests])


def test_a_pump_with_few_slots_claims_whole_quanta_and_leaves_no_lane_a_stub(svc, sim_control, monkeypatch):
    """A pump of 2 slots over three batches of 20: each claim gives a lane a whole quantum (8) however few the
    pump wants, and a lane with at most half a quantum more gives all it has (12), so each batch runs in two
    groups, 8 and 12, rather than groups of what the pump wanted and stubs (each pays a claim and a close);
    the budget is never passed and every request ends once."""
    set_budgets(svc, {GLM: 2})
    sim_config(sim_control, latency_seconds=0.02)
    who = authenticate(svc, new_key(svc, tier="internal")[1])
    requests = {b: [chat_request(f"s{b}-{i}", f"stub {b} {i}") for i in range(20)] for b in range(3)}
    batch_ids = {submit(svc, who, rs): b for b, rs in requests.items()}
    sizes = []
    real_claim = lanes.claim_from_lane

    def claim_from_lane(svc, batch, model_id, positions, *args, **kwargs):
        sizes.append((batch["id"], len(positions)))
        return real_claim(svc, batch, model_id, positions, *args, **kwargs)

    monkeypatch.setattr(lanes, "claim_from_lane", claim_from_lane)
    outcome = run_pump(svc, slots=2)

    assert outcome["completed"] == 60, outcome
    assert sorted(n for _, n in sizes) == [8, 8, 8, 12, 12, 12], sizes
    assert {batch_id for batch_id, n in sizes if n == 12} == set(batch_ids)
    assert sim_stats(sim_control, settle=True)["max_in_flight"] <= 2
    assert budget_in_flight(svc) == 0 and slot_leases(svc) == []
    for batch_id, b in batch_ids.items():
        final = pump(svc, batch_id)
        assert final["status"] == "completed" and final["completed"] == 20
        assert_ledger_consistent(svc, batch_id, who, [r["custom_id"] for r in requests[b]])


def test_a_pump_near_its_deadline_claims_only_what_its_slots_can_start_before_it(svc, sim_control):
    """A pump of 2 slots with 1.5 s left and calls of 0.5 s: it claims what its slots can start by then,
    not a whole quantum, so nothing it claimed is handed back at the deadline (each handed-back request
    would wait as a retry, claimed and written alone); the rest of the batch runs later, once."""
    set_budgets(svc, {GLM: 2})
    sim_config(sim_control, latency_seconds=0.5)
    who = authenticate(svc, new_key(svc, tier="internal")[1])
    requests = [chat_request(f"t-{i}", f"in time {i}") for i in range(20)]
    batch_id = submit(svc, who, requests)

    outcome = run_pump(svc, slots=2, seconds=1.5)

    assert outcome["handed_back"] == 0 and outcome["completed"] >= 1, outcome
    assert budget_in_flight(svc) == 0 and slot_leases(svc) == []
    final = pump(svc, batch_id)
    assert final["status"] == "completed" and final["completed"] == 20
    assert_ledger_consistent(svc, batch_id, who, [r["custom_id"] for r in requests])


@pytest.mark.parametrize("slots", [1, 3])
def test_a_pump_whose_claims_are_only_retries_runs_them_at_once(svc, sim_control, slots):
    """After a backend outage the work left is retries: a pump that claims only retries runs them on its idle
    slots at once, rather than leaving its runners asleep beside them until its deadline."""
    set_budgets(svc, {GLM: slots})
    configure(svc, retry_base_seconds=30.0)  # the first pump ends before any retry is due
    sim_config(sim_control, latency_seconds=0.02)
    who = authenticate(svc, new_key(svc, tier="internal")[1])
    requests = [chat_request(f"r-{i}", f"retried {i} [[sim:flaky:1:500]]") for i in range(6)]
    batch_id = submit(svc, who, requests)
    first = run_pump(svc, slots=slots, seconds=10)
    assert first["waiting"] == 6, first  # each failed once and waits for its retry
    svc.clock.advance(120)  # every retry is due

    started = time.monotonic()
    outcome = run_pump(svc, slots=slots, seconds=60)
    took = time.monotonic() - started

    assert outcome["completed"] == 6, outcome
    assert took < 10, f"the retries took {took:.1f} s of a 60 s pump"
    assert budget_in_flight(svc) == 0 and slot_leases(svc) == []
    final = pump(svc, batch_id)
    assert final["status"] == "completed" and final["completed"] == 6
    assert_ledger_consistent(svc, batch_id, who, [r["custom_id"] for r in requests])


def test_worker_dying_while_pumping_is_recovered_by_the_leases(svc, sim_control, monkeypatch):
    configure(svc, lease_seconds=60)
    set_budgets(svc, {GLM: 4})
    _, key = new_key(svc)
    who = authenticate(svc, key)
    requests = [chat_request(f"d-{i}", f"dies pumping {i}") for i in range(12)]
    batch_id = submit(svc, who, requests)
    calls = []
    real_attempt = run_request._attempt

    async def attempt_then_die(*args, **kwargs):
        calls.append(1)
        if len(calls) > 3:  # the process dies: nothing it does from here on reaches the table
            raise SystemExit("worker process died")
        return await real_attempt(*args, **kwargs)

    monkeypatch.setattr(run_request, "_attempt", attempt_then_die)
    for module, name in ((run_request, "close_group"), (slot_pump, "give_back_slots"),
                         (run_request, "record_position")):
        real = getattr(module, name)

        def dead(*args, real=real, **kwargs):
            if len(calls) > 3:
                raise SystemExit("worker process died")
            return real(*args, **kwargs)

        monkeypatch.setattr(module, name, dead)
    with pytest.raises(BaseException):  # noqa: B017 - whatever the dying process raised
        run_pump(svc, slots=4)
    monkeypatch.undo()
    assert budget_in_flight(svc) == 4 and len(slot_leases(svc)) == 1  # slots held by a dead worker

    sweep_once(svc)
    assert budget_in_flight(svc) == 4  # nothing is recovered before its lease runs out
    svc.clock.advance(61)
    sweep_once(svc)
    assert slot_leases(svc) == [] and budget_in_flight(svc) == 0  # the lease's slots went back
    final = pump(svc, batch_id)
    assert final["status"] == "completed" and final["completed"] == 12
    assert_ledger_consistent(svc, batch_id, who, [r["custom_id"] for r in requests])


def test_a_pump_on_a_sharded_budget_grows_across_its_shards_and_gives_each_its_slots_back(svc, sim_control,
                                                                                           monkeypatch):
    """A budget of 8 in 4 shards of 2 slots (`BUDGET_SHARD_SLOTS`): a pump asked for 3 takes them from two
    shards (a lease holds slots of several), then grows into the others' until all 8 are busy; no shard ever
    holds more than its 2, none goes below 0, and every slot goes back to the shard it came from."""
    configure(svc, budget_shard_slots=2)
    set_budgets(svc, {GLM: 8})
    sim_config(sim_control, latency_seconds=0.2)
    _, key = new_key(svc)
    who = authenticate(svc, key)
    requests = [chat_request(f"s-{i}", f"sharded {i}") for i in range(64)]
    batch_id = submit(svc, who, requests)
    leases: list[dict] = []
    for name in ("take_slots", "grow_slots"):
        real = getattr(slot_pump, name)

        def watched(*args, real=real, **kwargs):
            lease = real(*args, **kwargs)
            leases.append(lease)
            return lease

        monkeypatch.setattr(slot_pump, name, watched)
    peaks: Counter = Counter()
    stop = threading.Event()

    def sampler() -> None:
        while not stop.is_set():
            for k, shard in enumerate(budget_of(svc, GLM)["shards"]):
                peaks[k] = max(peaks[k], shard["in_flight"])
                peaks["lowest"] = min(peaks["lowest"], shard["in_flight"])
            time.sleep(0.02)

    watcher = threading.Thread(target=sampler)
    watcher.start()
    try:
        outcome = run_pump(svc, slots=3)
    finally:
        stop.set()
        watcher.join()

    assert sorted(lease_shards(leases[0]).values()) == [1, 2] and leases[0]["slots"] == 3  # two shards to start
    assert lease_shards(leases[-1]) == {0: 2, 1: 2, 2: 2, 3: 2}, leases[-1]  # then the others'
    assert outcome["completed"] == 64, outcome
    assert [peaks[k] for k in range(4)] == [2, 2, 2, 2] and peaks["lowest"] == 0, peaks
    assert sim_stats(sim_control, settle=True)["max_in_flight"] == 8
    assert budget_of(svc, GLM)["shards"] == [{"in_flight": 0, "interactive": 0}] * 4
    assert slot_leases(svc) == []
    final = pump(svc, batch_id)
    assert final["status"] == "completed" and final["completed"] == 64
    assert_ledger_consistent(svc, batch_id, who, [r["custom_id"] for r in requests])


def test_slots_of_a_sharded_budget_held_by_dead_processes_go_back_to_their_own_shards(svc, sim_control):
    """Groups a dispatcher claimed (without a lease) from several shards, a worker's lease on one and an
    interactive call counted on another, all of whose processes died: the sweeper gives each back to the
    shard it came from, once, and leaves no shard below zero."""
    from batchinfer.ledger import take_slots
    from batchinfer.records import InteractiveLease
    from batchinfer.scheduling.capacity import Draws

    configure(svc, budget_shard_slots=2, lease_seconds=60)
    set_budgets(svc, {GLM: 8})
    _, key = new_key(svc)
    who = authenticate(svc, key)
    requests = [chat_request(f"x-{i}", f"dies sharded {i}") for i in range(10)]
    batch_id = submit(svc, who, requests)

    configure(svc, tier_limits={**svc.settings.tier_limits, "pro": 6})
    Dispatcher(svc).pass_once()  # one claim of 6 (the account's tier): 2 from each of 3 shards (the groups never run)
    held = [shard["in_flight"] for shard in budget_of(svc, GLM)["shards"]]
    assert sorted(held) == [0, 2, 2, 2], held
    groups = list(svc.table.query_all("pk = :pk AND begins_with(sk, :g)", {":pk": f"BATCH#{batch_id}", ":g": "GRP#"},
                                      consistent=True))
    assert [group_shards(g) for g in groups] == [{k: 2 for k, n in enumerate(held) if n}], groups  # one group
    free = held.index(0)
    now = svc.now()
    take_slots(svc, GLM, [(Draws(budget_of(svc, GLM), 8).of(free), 2)])  # a worker's lease on the last shard
    svc.table.transact(InteractiveLease.begin(svc.table, GLM, "died", "acct_x", now, now + 60, now * 1000,
                                              shard=(free + 1) % 4))
    budget = budget_of(svc, GLM)
    assert budget["in_flight"] == 8 and budget["interactive"] == 1
    assert budget["shards"][(free + 1) % 4]["interactive"] == 1

    svc.clock.advance(61)
    sweep_once(svc)
    sweep_once(svc)  # a second pass finds nothing more to give back

    budget = budget_of(svc, GLM)
    assert budget["shards"] == [{"in_flight": 0, "interactive": 0}] * 4, budget
    assert slot_leases(svc) == []
    final = pump(svc, batch_id)
    assert final["status"] == "completed" and final["completed"] == 10
    assert_ledger_consistent(svc, batch_id, who, [r["custom_id"] for r in requests])


def test_pump_hand_back_racing_a_recovery_counts_each_request_once(svc, sim_control, monkeypatch):
    from batchinfer.service.sweep import _recover_group

    configure(svc, lease_seconds=3600)
    set_budgets(svc, {GLM: 2})
    _, key = new_key(svc)
    who = authenticate(svc, key)
    requests = [chat_request(f"h-{i}", f"hand back {i}") for i in range(8)]
    batch_id = submit(svc, who, requests)
    real_attempt = run_request._attempt
    recovered = []

    async def attempt(model, batch, body, *args, **kwargs):
        if not recovered:  # the sweeper recovers the first group while its members are queued or running
            groups = list(svc.table.query_all("pk = :pk AND begins_with(sk, :g)",
                                              {":pk": f"BATCH#{batch_id}", ":g": "GRP#"}, consistent=True))
            recovered.append(groups[0]["sk"])
            await asyncio.to_thread(_recover_group, svc, groups[0])
        return await real_attempt(model, batch, body, *args, **kwargs)

    monkeypatch.setattr(run_request, "_attempt", attempt)
    outcome = run_pump(svc, slots=2, seconds=5)
    monkeypatch.undo()

    assert outcome["lease_lost"] > 0, outcome  # the pump's writes for that group lost to the recovery
    assert budget_in_flight(svc) == 0 and slot_leases(svc) == []
    final = pump(svc, batch_id)
    assert final["status"] == "completed" and final["completed"] == 8
    assert_ledger_consistent(svc, batch_id, who, [r["custom_id"] for r in requests])


def test_pump_starts_nothing_after_the_window_closes(svc, sim_control, monkeypatch):
    configure(svc, batch_completion_window_seconds=600, lease_seconds=3600)
    set_budgets(svc, {GLM: 2})
    _, key = new_key(svc)
    who = authenticate(svc, key)
    requests = [chat_request(f"w-{i}", f"window {i}") for i in range(20)]
    batch_id = submit(svc, who, requests)
    real_attempt = run_request._attempt
    after_close = []

    async def attempt(*args, **kwargs):
        if svc.clock.offset:
            after_close.append(1)
        answer = await real_attempt(*args, **kwargs)
        svc.clock.advance(601) if not svc.clock.offset else None  # the window closes after the first answer
        return answer

    monkeypatch.setattr(run_request, "_attempt", attempt)
    outcome = run_pump(svc, slots=2, seconds=5)
    monkeypatch.undo()

    assert outcome["handed_back"] > 0, outcome  # claimed ahead, never started: handed back
    assert len(after_close) <= 1  # at most the call that was already running on the other slot
    final = pump(svc, batch_id)
    assert final["status"] == "expired"
    assert_ledger_consistent(svc, batch_id, who, [r["custom_id"] for r in requests])
    assert sim_stats(sim_control, settle=True)["total_requests"] == final["completed"] <= 3


def floor_of_two(svc, sim_control, latency: float, n: int, word: str) -> tuple:
    """GLM at a budget of 8 and a floor of 2, the backend at `latency`, and a batch of n requests on it."""
    set_budgets(svc, {GLM: 8})
    svc.catalog = Catalog(models=[m.model_copy(update={"batch_floor": 2}) if m.id == GLM else m
                                  for m in svc.catalog.models])
    sim_config(sim_control, latency_seconds=latency)
    _, key = new_key(svc)
    who = authenticate(svc, key)
    requests = [chat_request(f"{word[0]}-{i}", f"{word} {i}") for i in range(n)]
    return who, requests, submit(svc, who, requests)


def test_pump_gives_slots_back_when_the_budget_shrinks(svc, sim_control):
    from batchinfer.scheduling.capacity import track_interactive

    who, requests, batch_id = floor_of_two(svc, sim_control, latency=0.3, n=60, word="shrink")
    seen: list[int] = []

    def interactive_load_arrives() -> None:
        time.sleep(1.0)
        track_interactive(svc, GLM, 6)  # the budget shrinks to its floor of 2
        # Running calls may finish; then no new ones.
        time.sleep(0.3 + 2 * scheduler_config(svc.settings).poll_seconds + 0.2)
        for _ in range(10):
            seen.append(sim_stats(sim_control)["in_flight"])
            time.sleep(0.1)
        track_interactive(svc, GLM, -6)

    load = threading.Thread(target=interactive_load_arrives)
    load.start()
    run_pump(svc, slots=8, seconds=4)
    load.join()

    assert max(seen) <= 2, seen  # the pump kept to the shrunk budget
    assert budget_in_flight(svc) == 0 and slot_leases(svc) == []
    final = pump(svc, batch_id)
    assert final["status"] == "completed" and final["completed"] == 60
    assert_ledger_consistent(svc, batch_id, who, [r["custom_id"] for r in requests])


def test_a_new_dispatcher_claims_nothing_in_a_dip_of_interactive_load_until_it_has_watched_it(svc, sim_control):
    """Between one interactive client's call and its next the count dips for a moment (to 0 when calls end
    together). A dispatcher new to the model (each scheduled invocation is) remembers none of the load: while
    the count moved within the last second it claims nothing until it has watched it that long; a count that
    has stood still that long is taken as it is, at once."""
    from batchinfer.scheduling.capacity import track_interactive

    who, requests, batch_id = floor_of_two(svc, sim_control, latency=0.3, n=20, word="dip")
    model = svc.catalog.get(GLM)
    track_interactive(svc, GLM, 6)  # six interactive calls: the budget of 8 shrinks to its floor of 2
    track_interactive(svc, GLM, -6)  # they end together; their clients' next calls are a moment away
    new = Dispatcher(svc)
    assert new.dispatch_model(model) == 0  # the count reads 0, but it moved a moment ago
    track_interactive(svc, GLM, 6)  # the next calls
    time.sleep(scheduler_config(svc.settings).interactive_window_seconds + 0.05)
    assert new.dispatch_model(model) == 2  # it has watched for the window: the floor
    track_interactive(svc, GLM, -6)
    time.sleep(scheduler_config(svc.settings).interactive_window_seconds + 0.05)  # the load has gone and stayed gone
    assert Dispatcher(svc).dispatch_model(model) == 6  # a new one takes the rest of the budget at once

    assert budget_in_flight(svc) == 8
    final = pump(svc, batch_id)
    assert final["status"] == "completed" and final["completed"] == 20
    assert budget_in_flight(svc) == 0
    assert_ledger_consistent(svc, batch_id, who, [r["custom_id"] for r in requests])


def test_pump_grows_into_free_slots_rather_than_queue_behind_a_long_call(svc, sim_control, monkeypatch):
    """Work-conserving: a pump holding one slot, busy with a long call, takes free slots of the budget for the
    requests it claimed meanwhile instead of holding them until the long call ends; never past the budget."""
    set_budgets(svc, {GLM: 4})
    _, key = new_key(svc)
    who = authenticate(svc, key)
    requests = [chat_request("slow", "slow [[sim:tag:slow]]")] + [chat_request(f"q-{i}", f"quick {i}")
                                                                   for i in range(6)]
    batch_id = submit(svc, who, requests)
    real_attempt = run_request._attempt
    calls: list[tuple[str, float, float]] = []

    async def attempt(model, batch, body, *args, **kwargs):
        started = time.monotonic()
        if "slow" in body["messages"][0]["content"]:
            await asyncio.sleep(3.0)  # the long call (a long generation)
        answer = await real_attempt(model, batch, body, *args, **kwargs)
        calls.append((body["messages"][0]["content"], started, time.monotonic()))
        return answer

    monkeypatch.setattr(run_request, "_attempt", attempt)
    outcome = run_pump(svc, slots=1, seconds=20)
    monkeypatch.undo()

    slow = next(c for c in calls if c[0].startswith("slow"))
    quick = [c for c in calls if c[0].startswith("quick")]
    assert outcome["completed"] == 7 and len(quick) == 6, outcome
    # Every quick request ran while the long call still ran: none waited for its slot to come free.
    assert max(end for _, _, end in quick) < slow[2], (slow, quick)
    assert sim_stats(sim_control, settle=True)["max_in_flight"] <= 4
    assert budget_in_flight(svc) == 0 and slot_leases(svc) == []
    final = pump(svc, batch_id)
    assert final["status"] == "completed" and final["completed"] == 7
    assert_ledger_consistent(svc, batch_id, who, [r["custom_id"] for r in requests])



def test_pumps_start_no_new_call_over_the_floor_while_calls_above_it_finish(svc, sim_control, monkeypatch):
    """Interactive load came: running calls may finish, new ones must not start. Two workers' pumps: one
    whose long calls are all above the floor (it gives all its slots back as they end), one whose short calls
    go on at the floor: those wait until the long calls have ended rather than start beside them."""
    import contextvars

    from batchinfer.scheduling.capacity import track_interactive

    who, requests, batch_id = floor_of_two(svc, sim_control, latency=0.5, n=150, word="floor")
    real_attempt = run_request._attempt
    worker: contextvars.ContextVar[str] = contextvars.ContextVar("worker")
    calls: list[tuple[float, float]] = []

    async def attempt(*args, **kwargs):
        started = time.monotonic()
        if worker.get() == "long":
            await asyncio.sleep(2.5)  # long generations
        answer = await real_attempt(*args, **kwargs)
        calls.append((started, time.monotonic()))
        return answer

    arrived: list[float] = []

    def interactive_load_arrives() -> None:
        time.sleep(1.5)
        track_interactive(svc, GLM, 6)  # the budget shrinks to its floor of 2
        arrived.append(time.monotonic())
        time.sleep(5.0)
        track_interactive(svc, GLM, -6)

    async def two_workers() -> None:
        deadline = time.monotonic() + 7

        async def one(name: str, slots: int) -> None:
            worker.set(name)
            await run_request.slot_pump(svc, svc.catalog.get(GLM), deadline).run(slots)

        await asyncio.gather(one("long", 2), one("short", 6))

    monkeypatch.setattr(run_request, "_attempt", attempt)
    load = threading.Thread(target=interactive_load_arrives)
    load.start()
    asyncio.run(two_workers())
    load.join()
    monkeypatch.undo()

    # After a poll's time (and the poll's own read), no batch call starts while the floor's worth or more of
    # other batch calls still run; and batch work goes on at the floor once the long calls have ended.
    poll = scheduler_config(svc.settings).poll_seconds
    after = [a for a, _ in calls if arrived[0] + 2 * poll + 0.3 < a < arrived[0] + 5.0]
    over = [(round(a - arrived[0], 2), sum(1 for a2, b2 in calls if a2 < a < b2)) for a in after]
    assert after and all(running < 2 for _, running in over), over
    # The floor's 2 slots stay busy once the long calls are gone (0.5 s calls: ~8 starts in 2 s; 1 slot: ~4).
    assert sum(1 for a, _ in calls if arrived[0] + 2.5 < a < arrived[0] + 4.5) >= 6, sorted(calls)
    assert budget_in_flight(svc) == 0 and slot_leases(svc) == []
    final = pump(svc, batch_id)
    assert final["status"] == "completed" and final["completed"] == 150
    assert_ledger_consistent(svc, batch_id, who, [r["custom_id"] for r in requests])


def test_pump_starts_no_call_on_an_old_cap_while_its_budget_poll_is_stalled(svc, sim_control, monkeypatch):
    """The budget poll stalls (a throttled or stalled store) just as interactive load comes: runners stop
    starting calls once the cap they know is stale_cap_seconds old, rather than go on at the old budget, and
    go on once a poll answers (at the floor); every request still ends once."""
    from batchinfer.scheduling.capacity import track_interactive

    who, requests, batch_id = floor_of_two(svc, sim_control, latency=0.3, n=200, word="stall")
    stall = threading.Event()
    released = threading.Event()
    real_read = slot_pump.read_budget

    def stalling_read(*args, **kwargs):
        if stall.is_set() and threading.current_thread().name.startswith("pump-poll"):
            released.wait(10)
        return real_read(*args, **kwargs)

    real_attempt = run_request._attempt
    starts: list[float] = []

    async def attempt(*args, **kwargs):
        starts.append(time.monotonic())
        return await real_attempt(*args, **kwargs)

    marks: dict[str, float] = {}

    def load_arrives_while_the_poll_stalls() -> None:
        time.sleep(1.0)
        stall.set()
        time.sleep(0.3)  # the stalled poll has been sent
        marks["stalled"] = time.monotonic()
        track_interactive(svc, GLM, 6)  # the budget shrinks to its floor of 2: no poll sees it yet
        time.sleep(2.5)
        marks["released"] = time.monotonic()
        released.set()
        time.sleep(1.5)
        track_interactive(svc, GLM, -6)

    monkeypatch.setattr(slot_pump, "read_budget", stalling_read)
    monkeypatch.setattr(run_request, "_attempt", attempt)
    load = threading.Thread(target=load_arrives_while_the_poll_stalls)
    load.start()
    run_pump(svc, slots=8, seconds=6)
    load.join()
    monkeypatch.undo()

    # The last poll answered before the stall began; from a second after it (stale_cap_seconds, and a
    # runner's wait), until the stalled poll answers, no call starts.
    assert scheduler_config(svc.settings).stale_cap_seconds <= 1.0
    quiet_from = marks["stalled"] - 0.3 + 1.0 + scheduler_config(svc.settings).poll_seconds + 0.1
    assert not [round(a - marks["stalled"], 2) for a in starts if quiet_from < a < marks["released"]]
    assert [a for a in starts if a > marks["released"]], "the pump went on once the poll answered"
    assert budget_in_flight(svc) == 0 and slot_leases(svc) == []
    final = pump(svc, batch_id)
    assert final["status"] == "completed" and final["completed"] == 200
    assert_ledger_consistent(svc, batch_id, who, [r["custom_id"] for r in requests])


def test_retry_delivered_after_the_budget_shrank_does_not_start_over_it(svc, sim_control):
    """A retry dispatched within the cap and delivered once interactive load has come waits again (its slot
    given back) instead of starting over the floor; it runs once the load goes, exactly once."""
    from batchinfer.scheduling.capacity import track_interactive

    _, key = new_key(svc)
    who = authenticate(svc, key)
    requests = [chat_request("again", "retry me [[sim:flaky:1:500]]")]
    batch_id = submit(svc, who, requests)
    Dispatcher(svc).pass_once()
    run_queued(svc)  # the first attempt: a 500, so it waits for its retry
    assert requests_by_custom_id(svc, batch_id)["again"]["state"] == "waiting"
    svc.clock.advance(3600)
    assert Dispatcher(svc).pass_once() == 1  # the retry is dispatched, holding one slot
    track_interactive(svc, GLM, 16)  # the model's batch work shrinks to its floor... and below what is held
    set_budgets(svc, {GLM: 0})  # (and a budget of 0: over the cap with the one slot the retry holds)
    run_queued(svc)

    assert requests_by_custom_id(svc, batch_id)["again"]["state"] == "waiting"
    assert sim_stats(sim_control, settle=True)["total_requests"] == 1  # not sent again
    assert budget_in_flight(svc) == 0

    track_interactive(svc, GLM, -16)
    set_budgets(svc, {GLM: 16})
    final = pump(svc, batch_id)
    assert final["status"] == "completed" and final["completed"] == 1
    assert sim_stats(sim_control, settle=True)["total_requests"] == 2
    assert_ledger_consistent(svc, batch_id, who, ["again"])


def test_new_pump_does_not_take_a_dip_between_interactive_calls_for_room(svc, sim_control):
    """Interactive clients send back to back: their count dips to 0 for a moment when calls end together. A
    pump that starts then watches the count over the memory's window before taking slots."""
    from batchinfer.scheduling.capacity import track_interactive

    who, requests, batch_id = floor_of_two(svc, sim_control, latency=0.3, n=24, word="dip")
    track_interactive(svc, GLM, 6)
    track_interactive(svc, GLM, -6)  # the calls end together...

    def next_calls_arrive() -> None:
        time.sleep(0.1)
        track_interactive(svc, GLM, 6)  # ...and the clients' next ones are counted a moment later
        time.sleep(scheduler_config(svc.settings).interactive_window_seconds + 2.0)
        track_interactive(svc, GLM, -6)

    load = threading.Thread(target=next_calls_arrive)
    load.start()
    run_pump(svc, slots=8, seconds=2.5)
    load.join()

    assert sim_stats(sim_control, settle=True)["max_in_flight"] <= 2  # the floor, not the dip's 8
    assert budget_in_flight(svc) == 0 and slot_leases(svc) == []
    final = pump(svc, batch_id)
    assert final["status"] == "completed" and final["completed"] == 24
    assert_ledger_consistent(svc, batch_id, who, [r["custom_id"] for r in requests])
