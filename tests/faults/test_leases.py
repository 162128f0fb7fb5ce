"""Duplicate deliveries and dying workers: the leases recover what a worker left, nothing runs twice."""

from __future__ import annotations

from batchinfer.layout import (
    GROUP_PREFIX,
    LEASE_DUE,
    LEASE_PARTITIONS,
    batch_key,
)
from batchinfer.operations.openai import batches
from batchinfer.scheduling.dispatcher import Dispatcher
from batchinfer.service.accounts import authenticate
from batchinfer.service.background.sweep import sweep_once
from batchinfer.service.running import run_request
from local.lambda_runtime import invoke, sqs_event
from tests.faults.harness import (
    GLM,
    configure,
    dispatch_in_groups,
    get_batch,
    pump,
    receive,
    requests_by_custom_id,
    results_by_custom_id,
    run_messages,
    run_queued,
    sim_stats,
    submit,
    worker_dies_after_answer,
)
from tests.helpers import chat_request, new_key
from tests.invariants import assert_ledger_consistent, stored_requests

# --- Duplicate delivery ----------------------------------------------------------------------------------------


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


# --- A worker dies between the answer and the record -----------------------------------------------------------


def test_worker_dying_before_recording_is_recovered_by_lease(svc, sim_control, monkeypatch):
    configure(svc, lease_seconds=60)
    _, key = new_key(svc)
    who = authenticate(svc, key)
    requests = [chat_request("dies", "the worker dies after this answer"), chat_request("fine", "all good")]
    batch_id = submit(svc, who, requests)

    died = worker_dies_after_answer(monkeypatch, "dies")
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


# --- Index shards the sweeper reads ----------------------------------------------------------------------------


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
