"""What an estimate takes a call to last, after real batches ran on the simulator at a latency other than the
1 s first guess: every pump notes what its calls took when it stops (and at once when the budget has none),
so a batch shorter than the pumps' periodic note still teaches the next estimate the backend's pace."""

from __future__ import annotations

import time

import pytest

from batchinfer.records import Budget
from batchinfer.scheduling import pump as slot_pump
from batchinfer.scheduling.config import scheduler_config
from batchinfer.service.accounts import authenticate
from batchinfer.service.creating.forecast import read_queue, seconds_to_finish
from tests.faults.harness import GLM, configure, pump, set_budgets, sim_config, submit
from tests.helpers import chat_request, new_key


@pytest.fixture
def calls_seen(monkeypatch) -> list[float]:
    """The seconds each pump call took as the pump itself timed it (a spy: the pump runs unchanged). On a
    busy machine calls take longer than the simulator's latency; the figure noted must follow what they took."""
    seen: list[float] = []
    measured = slot_pump.SlotPump._measured

    def spy(self, started: float) -> None:
        seen.append(time.monotonic() - started)
        measured(self, started)

    monkeypatch.setattr(slot_pump.SlotPump, "_measured", spy)
    return seen


def within(figure: float, samples: list[float]) -> bool:
    """Whether `figure` lies within the range of `samples`, as any average of them does (what the pumps note is
    a weighted average of the calls they timed, in an order and grouping that depend on the machine's pace)."""
    return min(samples) - 1e-6 <= figure <= max(samples) + 1e-6


def _short_batch(svc, who, prefix: str) -> dict:
    batch_id = submit(svc, who, [chat_request(f"{prefix}-{i}", f"short {prefix} {i}") for i in range(16)])
    final = pump(svc, batch_id)
    assert final["status"] == "completed" and final["completed"] == 16
    return final


def test_an_estimate_after_a_short_half_second_batch_uses_half_a_second_not_the_default(svc, sim_control, calls_seen):
    configure(svc, worker_pull=True)  # workers run slot pumps, as deployed
    set_budgets(svc, {GLM: 8})
    sim_config(sim_control, latency_seconds=0.5)
    _, key = new_key(svc)
    who = authenticate(svc, key)
    model = svc.catalog.get(GLM)
    before = read_queue(svc, model)
    assert before.measured is None and before.latency == scheduler_config(svc.settings).first_call_seconds == 1.0

    _short_batch(svc, who, "a")  # 16 calls on 8 slots: about a second, shorter than the periodic note

    queue = read_queue(svc, model)
    # What the calls took: half a second each (more on a busy machine), not the 1 s default. The pump notes
    # averages of what it timed, so the figure lies within the calls' range however unevenly they ran.
    assert len(calls_seen) == 16 and min(calls_seen) >= 0.5
    assert queue.measured is not None and within(queue.measured, calls_seen)
    assert queue.latency == queue.measured
    # 200 requests on 8 slots at the pace measured: 25 waves of that (and the last half), not of a second.
    seconds = seconds_to_finish(queue, who.account_id, 16, 200)
    assert 25 * queue.measured < seconds < 26 * queue.measured + 3
    # Before any call it took 1 s a call: about 28 s for what runs in about 13.
    assert seconds_to_finish(before, who.account_id, 16, 200) > 25 * 1.0


def test_a_short_batch_moves_an_older_figure_almost_all_the_way(svc, sim_control, calls_seen):
    """The budget says 2 s (noted an hour ago); 16 calls of 0.5 s move it as 16 samples of a moving average
    would (weight 0.2 each: 97 % of the way), not as one."""
    configure(svc, worker_pull=True)  # workers run slot pumps, as deployed
    set_budgets(svc, {GLM: 8})
    sim_config(sim_control, latency_seconds=0.5)
    Budget.note_latency(svc.table, GLM, 2.0, svc.now() - 3600)
    _, key = new_key(svc)
    who = authenticate(svc, key)

    _short_batch(svc, who, "b")

    measured = read_queue(svc, svc.catalog.get(GLM)).measured
    moved = 1 - 0.8 ** 16  # 16 samples' move: 97 % of the way from 2 s to what they took
    assert measured is not None and within(measured, [2.0 + moved * (took - 2.0) for took in calls_seen])
    assert measured < 0.1 * 2.0 + 0.9 * max(calls_seen)  # not one sample's move of 20 %


def test_a_figure_too_old_to_count_is_replaced_by_what_the_calls_took(svc, sim_control, calls_seen):
    configure(svc, worker_pull=True)  # workers run slot pumps, as deployed
    set_budgets(svc, {GLM: 8})
    sim_config(sim_control, latency_seconds=0.5)
    too_old = scheduler_config(svc.settings).latency_fresh_seconds + 60
    Budget.note_latency(svc.table, GLM, 9.0, svc.now() - too_old)
    _, key = new_key(svc)
    who = authenticate(svc, key)
    assert read_queue(svc, svc.catalog.get(GLM)).measured is None  # the estimate does not count it

    _short_batch(svc, who, "c")

    measured = read_queue(svc, svc.catalog.get(GLM)).measured
    assert measured is not None and within(measured, calls_seen)
