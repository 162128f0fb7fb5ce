"""Dispatchers, workers and sweepers racing for the same items: nothing runs or ends twice."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections import Counter

import pytest

from batchinfer.layout import (
    budget_share,
)
from batchinfer.providers import openai_compat
from batchinfer.scheduling import dispatcher as claim_pass
from batchinfer.scheduling import lanes
from batchinfer.scheduling.dispatcher import Dispatcher
from batchinfer.service import lifecycle
from batchinfer.service.accounts import authenticate
from batchinfer.service.background.sweep import sweep_once
from batchinfer.service.running.run_request import process, process_and_pull
from batchinfer.storage.dynamo import ConditionFailed
from tests.faults.harness import (
    GLM,
    QWEN,
    account_counters,
    configure,
    finalizes,
    get_batch,
    receive,
    run_queued,
    set_budgets,
    sim_config,
    sim_stats,
    stops,
    submit,
    submit_file,
)
from tests.helpers import chat_request, new_key
from tests.invariants import assert_ledger_consistent, budget_of, stored_requests

# --- Two dispatchers at once -----------------------------------------------------------------------------------


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
    sim_config(sim_control, latency_seconds=0.1)
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
    # The two dispatchers' first claims from a lane wait for each other, so both have read the lane before
    # either writes: they race for it on every machine, however fast one of them gets there.
    both_read = threading.Barrier(2, timeout=30)

    def watched(claim):
        def call(*args, **kwargs):
            if claim.__name__ == "claim_from_lane" and getattr(racing, "first", False):
                racing.first = False
                try:
                    both_read.wait()
                except threading.BrokenBarrierError:
                    pass
            try:
                units = claim(*args, **kwargs)
            except ConditionFailed:
                lost[claim.__name__] += 1
                raise
            if claim.__name__ == "claim_from_lane":
                with sent_lock:
                    claimed.update(p[0] for group in units for p in group["positions"])
                sample()  # the slots it took are held now
            return units
        return call

    monkeypatch.setattr(lanes, "claim_from_lane", watched(lanes.claim_from_lane))
    monkeypatch.setattr(claim_pass, "claim_retry", watched(claim_pass.claim_retry))
    stop = threading.Event()
    errors: list[BaseException] = []
    peaks: Counter = Counter()

    racing = threading.local()

    def dispatcher_loop() -> None:
        racing.first = True
        dispatcher = Dispatcher(svc)
        while not stop.is_set():
            try:
                dispatcher.pass_once()
            except Exception as error:
                errors.append(error)
            stop.wait(0.05)  # a scheduled dispatcher's next pass

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
                    stop.wait(0.01)  # the event source mapping's next poll
                    continue
                outcomes = loop.run_until_complete(run_all(messages))
                errors.extend(o for o in outcomes if isinstance(o, BaseException))
                svc.queues.sqs.delete_message_batch(QueueUrl=svc.queues.urls[model], Entries=[
                    {"Id": str(i), "ReceiptHandle": m["ReceiptHandle"]} for i, m in enumerate(messages)])
        finally:
            loop.close()

    def sample() -> None:  # the budget counters, at each claim and each call's start (slots are held then)
        for model in budgets:
            budget = budget_of(svc, model)
            peaks[f"counter:{model}"] = max(peaks[f"counter:{model}"], budget.get("in_flight", 0))
            for k, shard in enumerate(budget["shards"]):
                peaks[f"shard:{model}:{k}"] = max(peaks[f"shard:{model}:{k}"], shard["in_flight"])
        peaks["counter:account"] = max(peaks["counter:account"], account_counters(svc, account["id"])["in_flight"])

    # What really runs at once: every backend call of the worker, per model and in all. The first calls wait
    # at a gate until more than one model's budget is in flight (both models at once, within the tier), so
    # the test sees them run together however slowly a busy machine starts them.
    calling: Counter = Counter()
    real_call = openai_compat.call
    together = threading.Event()
    answered = threading.Event()  # set at each answer: the test looks at the batch again then

    async def counted_call(model, *args, **kwargs):
        with sent_lock:
            calling[model.id] += 1
            calling["all"] += 1
            for name in (model.id, "all"):
                peaks[f"calling:{name}"] = max(peaks[f"calling:{name}"], calling[name])
            if calling["all"] > max(budgets.values()):
                together.set()
        try:
            await asyncio.to_thread(sample)
            await asyncio.to_thread(together.wait, 60)  # (a bound for a broken scheduler, not a timing)
            return await real_call(model, *args, **kwargs)
        finally:
            with sent_lock:
                calling[model.id] -= 1
                calling["all"] -= 1
            answered.set()

    monkeypatch.setattr(openai_compat, "call", counted_call)

    # A worker loop per model runs one receive's messages at a time. With shards a dispatcher's claim takes one
    # shard's slots, so a model's slots travel in several messages: a poller per shard then (an event source
    # mapping runs as many invocations at once as the model's budget).
    pollers = -(-max(budgets.values()) // shard_slots)
    threads = [threading.Thread(target=dispatcher_loop), threading.Thread(target=dispatcher_loop),
               *(threading.Thread(target=worker_loop, args=(model,)) for model in (GLM, QWEN) for _ in range(pollers))]
    for thread in threads:
        thread.start()
    try:
        # Until every request has run, or none has ended for a long while (a stuck pipeline): a busy machine
        # runs them slower, and that alone must not fail the test.
        done, moved_at = 0, time.monotonic()
        while done < 60 and time.monotonic() - moved_at < 60:
            answered.wait(1.0)
            answered.clear()
            now_done = get_batch(svc, batch_id)["completed"]
            if now_done > done:
                done, moved_at = now_done, time.monotonic()
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


# --- Two sweepers at once --------------------------------------------------------------------------------------


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

    gate, outcomes = race_sweepers(svc, finalizes)

    assert gate.arrived == 2, "both sweepers should have reached the final transaction"
    assert not [o for o in outcomes if isinstance(o, BaseException)], outcomes
    assert sum(o["settled"] for o in outcomes) >= 1
    assert account_counters(svc, account["id"]) == {"unfinished_batches": 0, "unfinished_requests": 0,
                                                     "in_flight": 0}
    final = assert_ledger_consistent(svc, batch_id, who, [r["custom_id"] for r in requests])
    assert final["status"] == "completed" and final["completed"] == 4


class CutOff:
    """A run's deadline (compared as `time.monotonic() >= deadline`) that comes when the test says."""

    def __init__(self) -> None:
        self.come = False

    def __le__(self, now: float) -> bool:
        return self.come


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
    deadline = CutOff()
    real_start = svc.blobs.start_multipart

    def start_multipart(*args):
        upload_id = real_start(*args)
        deadline.come = True
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

    gate, outcomes = race_sweepers(svc, lambda name, kw: stops(name, kw) or finalizes(name, kw))

    assert not [o for o in outcomes if isinstance(o, BaseException)], outcomes
    assert gate.arrived == 4, "both sweepers should have tried to stop, then to finish, the batch"
    assert sum(o["expired"] for o in outcomes) == 1
    assert account_counters(svc, account["id"]) == {"unfinished_batches": 0, "unfinished_requests": 0,
                                                     "in_flight": 0}
    final = assert_ledger_consistent(svc, batch_id, who, [r["custom_id"] for r in requests])
    assert final["status"] == "expired" and final["completed"] == 2 and final["failed"] == 4
