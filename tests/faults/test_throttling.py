"""DynamoDB throttling: a refused write is tried again or recovered, never lost nor run twice."""

from __future__ import annotations

import random
import threading
from collections import Counter

from botocore.exceptions import ClientError

from batchinfer.scheduling.dispatcher import Dispatcher
from batchinfer.service.accounts import authenticate
from batchinfer.service.background.sweep import sweep_once
from tests.faults.harness import (
    GLM,
    QWEN,
    configure,
    get_batch,
    pump,
    run_queued,
    set_budgets,
    sim_stats,
    stops,
    submit,
)
from tests.helpers import chat_request, new_key
from tests.invariants import assert_ledger_consistent, stored_requests

# --- Throttled writes ------------------------------------------------------------------------------------------


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


# --- One throttled write at the worst moment -------------------------------------------------------------------


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
    gate = ThrottleOnce(real, stops, times=10)
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
