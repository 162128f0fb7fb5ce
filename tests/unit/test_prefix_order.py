"""The order a batch's work runs in for a prompt cache: waves of prefixes at intake, and a pump's pick by prefix
(prime, affinity, never idle) inside the fair turns between batches."""

from __future__ import annotations

from collections import Counter

from hypothesis import given
from hypothesis import strategies as st

from batchinfer.layout import owner_sort
from batchinfer.scheduling.call_timing import CallTiming
from batchinfer.scheduling.claimed_work import GroupRun, Member
from batchinfer.scheduling.config import SchedulerConfig
from batchinfer.scheduling.fair_queue import FairQueue
from batchinfer.scheduling.prefix_order import pick, prefix_waves, worth_ordering
from tests.fake_clock import FakeClock

CONFIG = SchedulerConfig()


def test_waves_go_round_width_prefixes_and_the_next_takes_a_finished_ones_place() -> None:
    keys = list("AAABBBCCCDD")
    assert "".join(keys[i] for i in prefix_waves(keys, 2)) == "ABABABCDCDC"
    assert "".join(keys[i] for i in prefix_waves(keys, 4)) == "ABCDABCDABC"


def test_a_shuffled_file_comes_out_as_a_grouped_one_does() -> None:
    grouped = [p for p in "ABCDEFGH" for _ in range(6)]
    shuffled = [grouped[(i * 29) % 48] for i in range(48)]
    for keys in (grouped, shuffled):
        order = [keys[i] for i in prefix_waves(keys, 4)]
        for wave in range(0, 48, 4):
            assert len(set(order[wave:wave + 4])) == 4  # every wave holds 4 different prefixes


def test_requests_sharing_nothing_keep_their_place() -> None:
    assert prefix_waves([None, None, None], 4) == [0, 1, 2]
    assert not worth_ordering([None, "A", "B", None])
    assert worth_ordering(["A", None, "A"])


@given(st.lists(st.sampled_from(["A", "B", "C", None]), max_size=40), st.integers(1, 6))
def test_waves_are_a_permutation_keeping_each_prefixs_own_order(keys: list, width: int) -> None:
    order = prefix_waves(keys, width)
    assert sorted(order) == list(range(len(keys)))
    for prefix in ("A", "B", "C"):
        mine = [i for i in order if keys[i] == prefix]
        assert mine == sorted(mine)  # a prefix's requests run in submission order: its first is its primer


def test_pick_affinity_then_a_free_prefix_then_a_primed_one_then_anything() -> None:
    queued = ["A", "A", "B", "C"]
    assert pick(queued, "B", {"A": 1, "B": 1}, set()) == 2  # the runner's own prefix
    assert pick(queued, "D", {"A": 1, "B": 1}, set()) == 3  # C: no call of it runs (a primer)
    assert pick(["A", "B"], "D", {"A": 1, "B": 1}, {"B"}) == 1  # B answered once: its cache is written
    assert pick(["A", "B"], "D", {"A": 1, "B": 1}, set()) == 0  # never idle
    assert pick(queued, None, {}, set()) == 0
    assert pick(queued, "B", {}, set(), affinity=False) == 0  # a shared cache: no slot to keep


def member(batch: dict, prefix: str | None, index: int) -> Member:
    run = GroupRun(group={}, batch=batch, left=1)
    return Member(run=run, position=[index, f"c{index}", 0, 1] + ([prefix] if prefix else []), body={})


def queue_of(cache: str) -> tuple[CallTiming, FairQueue]:
    clock = FakeClock()
    timing = CallTiming(lambda: CONFIG, clock)
    return timing, FairQueue(clock, timing.memory, cache)


def run(queue: FairQueue, timing: CallTiming, after: str | None = None) -> Member:
    taken = queue.take_next(after)
    timing.starts(taken)
    queue.started(taken)
    return taken


def end(queue: FairQueue, timing: CallTiming, taken: Member) -> None:
    if timing.ends(taken):
        queue.ended(taken)


def prefix(m: Member) -> str:
    return m.position[4]


def test_four_runners_hold_four_prefixes_and_each_keeps_its_own() -> None:
    """A file written prefix by prefix, claimed two prefixes at a time: the runners still start the primers of
    different prefixes first, and a runner that answers takes the next of its own prefix."""
    timing, queue = queue_of("slot")
    b = {"id": "b", "owner_sk": owner_sort(0, "b")}
    keys = [p for p in "ABCD" for _ in range(3)]
    queue.add([member(b, k, i) for i, k in enumerate(keys)], {"b": b})
    first = [run(queue, timing) for _ in range(4)]
    assert [prefix(m) for m in first] == ["A", "B", "C", "D"]  # primed once each, not A four times
    end(queue, timing, first[2])
    assert prefix(run(queue, timing, "C")) == "C"  # affinity: the runner's slot holds C


def test_a_prefixs_rest_waits_for_its_primer_while_other_work_is_queued() -> None:
    timing, queue = queue_of("shared")
    b = {"id": "b", "owner_sk": owner_sort(0, "b")}
    queue.add([member(b, k, i) for i, k in enumerate("AAAB")], {"b": b})
    primer = run(queue, timing)
    assert prefix(primer) == "A"
    assert prefix(run(queue, timing)) == "B"  # not A's second: A's primer has not answered
    assert prefix(run(queue, timing)) == "A"  # never idle: nothing else is queued
    end(queue, timing, primer)
    assert queue.primed and "A" in queue.primed


def test_off_keeps_first_queued_first() -> None:
    timing, queue = queue_of("off")
    b = {"id": "b", "owner_sk": owner_sort(0, "b")}
    queue.add([member(b, k, i) for i, k in enumerate("AAAB")], {"b": b})
    assert [prefix(run(queue, timing)) for _ in range(4)] == list("AAAB")


def test_the_turns_between_batches_come_first() -> None:
    """Two batches: each start still goes to the batch served least; the prefix only picks within it."""
    timing, queue = queue_of("slot")
    one = {"id": "one", "owner_sk": owner_sort(0, "one")}
    two = {"id": "two", "owner_sk": owner_sort(1, "two")}
    queue.add([member(one, k, i) for i, k in enumerate("AAAA")], {"one": one, "two": two})
    queue.add([member(two, k, i) for i, k in enumerate("XYXY")], {"one": one, "two": two})
    started = [run(queue, timing, "A") for _ in range(6)]
    assert Counter(m.run.batch["id"] for m in started) == {"one": 3, "two": 3}
    assert [prefix(m) for m in started if m.run.batch["id"] == "two"][:2] == ["X", "Y"]


def test_work_without_keys_runs_first_queued_first_and_the_count_follows_the_queue() -> None:
    timing, queue = queue_of("slot")
    b = {"id": "b", "owner_sk": owner_sort(0, "b")}
    queue.add([member(b, None, i) for i in range(3)] + [member(b, "A", 3)], {"b": b})
    assert queue.keyed == 1
    assert [run(queue, timing, None).position[0] for _ in range(2)] == [0, 1]
    queue.leftover()
    assert queue.keyed == 1 and queue.leftover().position[0] == 3 and queue.keyed == 0
