"""The slot pump's parts on a clock the test moves: its fair queue, call timing and budget watch."""

from __future__ import annotations

import asyncio

from batchinfer.layout import owner_sort
from batchinfer.scheduling.call_timing import CallTiming
from batchinfer.scheduling.claimed_work import GroupRun, Member
from batchinfer.scheduling.config import SchedulerConfig
from batchinfer.scheduling.fair_queue import FairQueue
from tests.fake_clock import FakeClock

CONFIG = SchedulerConfig()


def members(batch: dict, n: int) -> list[Member]:
    run = GroupRun(group={}, batch=batch, left=n)
    return [Member(run=run, position=[i], body={}) for i in range(n)]


def parts(clock: FakeClock) -> tuple[CallTiming, FairQueue]:
    timing = CallTiming(lambda: CONFIG, clock)
    return timing, FairQueue(clock, timing.memory)


def batch(batch_id: str, created: float) -> dict:
    return {"id": batch_id, "owner_sk": owner_sort(int(created * 1e6), batch_id)}


def test_a_newcomer_gets_the_starts_owed_since_it_arrived_then_turns_alternate():
    """A large batch's 4 calls run; a batch created then has its work queued once 3 of them answered: it is
    owed the starts the large one had since it came, so the next runners serve it first, then alternate."""
    clock = FakeClock()
    timing, queue = parts(clock)
    big = batch("big", clock.time() - 1)
    batches = {"big": big}
    queue.add(members(big, 20), batches)
    running = [queue.take_next() for _ in range(4)]
    for member in running:
        timing.starts(member)
        queue.started(member)
    new = batch("new", clock.time())  # created while the 4 calls ran
    clock.advance(1.0)
    for member in running[:3]:  # the test releases 3 calls
        if timing.ends(member):
            queue.ended(member)
        timing.measured(clock.monotonic() - 1.0)
    batches["new"] = new
    queue.add(members(new, 10), batches)

    assert queue.served["new"] == queue.served["big"] - 4  # owed the large one's starts since it came
    order = []
    for _ in range(6):
        member = queue.take_next()
        queue.started(member)
        order.append(member.run.batch["id"])
    assert order[:4] == ["new"] * 4  # the free runners give the newcomer its turn: the 4 starts it is owed
    assert sorted(order[4:]) == ["big", "new"]  # then the starts alternate
    assert queue.queued_of["new"] == 5 and queue.queued_of["big"] == 15


def test_a_batch_created_long_before_its_work_arrives_is_owed_nothing_from_before_the_pumps_memory():
    clock = FakeClock()
    timing, queue = parts(clock)
    big = batch("big", clock.time() - 100)
    batches = {"big": big}
    queue.add(members(big, 10), batches)
    for member in [queue.take_next() for _ in range(4)]:
        timing.starts(member)
        queue.started(member)
        clock.advance(0.5)
        if timing.ends(member):
            queue.ended(member)
    clock.advance(60.0)  # far past two calls and a claim's round trip
    old = batch("old", clock.time() - 61)
    batches["old"] = old
    queue.add(members(old, 4), batches)

    assert queue.served["old"] == queue.served["big"]  # level with the others: no calls owed from then


def test_call_timing_moves_with_the_answers_on_the_clock():
    clock = FakeClock()
    timing, _ = parts(clock)
    assert timing.call_seconds == CONFIG.first_call_seconds and not timing.answered
    member = members({"id": "b"}, 1)[0]
    started = timing.starts(member)
    assert timing.busy == 1 and timing.ending_soon() == (0, CONFIG.poll_seconds)  # a guess counts nothing
    clock.advance(2.0)
    assert timing.ends(member) and not timing.ends(member)
    timing.measured(started)
    assert timing.call_seconds == 2.0 and timing.busy == 0  # the first answer replaces the guess
    assert timing.note_due(stopping=False, noted=None) == 2.0  # no fresh figure on the budget: noted at once
    assert timing.note_due(stopping=True, noted=None) is None  # nothing answered since


def test_a_wait_on_the_fake_clock_ends_only_when_the_test_moves_it_or_the_event_comes():
    async def scenario() -> list:
        clock, event = FakeClock(), asyncio.Event()
        timed_out = asyncio.create_task(clock.wait(event, 1.0))
        await asyncio.sleep(0)
        assert not timed_out.done()
        clock.advance(0.5)
        await asyncio.sleep(0)
        assert not timed_out.done()
        clock.advance(0.5)
        first = await timed_out
        woken = asyncio.create_task(clock.wait(event, 1.0))
        await asyncio.sleep(0)
        event.set()
        return [first, await woken]

    assert asyncio.run(scenario()) == [False, True]
