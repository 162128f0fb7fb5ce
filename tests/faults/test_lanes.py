"""Lanes: claims take turns over the batches of a model, a quantum at a time."""

from __future__ import annotations

import dataclasses
from collections import Counter

from batchinfer.ledger import queue_message
from batchinfer.scheduling import lanes
from batchinfer.scheduling.config import scheduler_config
from batchinfer.scheduling.dispatcher import Dispatcher
from batchinfer.service.accounts import authenticate
from tests.faults.harness import GLM, pump, run_queued, set_budgets, submit
from tests.helpers import chat_request, new_key
from tests.invariants import assert_ledger_consistent

# --- Lanes taking turns ----------------------------------------------------------------------------------------


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
