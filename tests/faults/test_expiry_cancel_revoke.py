"""Expiry, cancellation and an owner's key revoked mid-batch."""

from __future__ import annotations

import asyncio
import json
import threading
from collections import Counter

import pytest

from batchinfer.operations.openai import batches
from batchinfer.records import Batch
from batchinfer.scheduling.config import scheduler_config
from batchinfer.scheduling.dispatcher import Dispatcher
from batchinfer.service import accounts, lifecycle
from batchinfer.service.accounts import authenticate
from batchinfer.service.background.sweep import sweep_once
from batchinfer.service.running import run_request
from batchinfer.storage.dynamo import Throttled
from tests.faults.harness import (
    GLM,
    account_counters,
    configure,
    dispatch_in_groups,
    get_batch,
    pump,
    requests_by_custom_id,
    results_by_custom_id,
    run_queued,
    set_budgets,
    sim_config,
    sim_stats,
    start_one_running,
    submit,
    submit_file,
)
from tests.faults.pump_doubles import FakeClock, Gate, drive, gated_pump
from tests.helpers import chat_request, new_key
from tests.invariants import assert_ledger_consistent, stored_requests

# --- Expiry and cancellation -----------------------------------------------------------------------------------


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


# --- The owner's key is revoked mid-batch ----------------------------------------------------------------------


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


def _lose_owner(svc, account: dict, key: str, how: str) -> None:
    if how == "revoke_key":
        accounts.revoke_key(svc, key)
    else:
        accounts.update_account(svc, account["id"], status={"suspend": "suspended", "delete_account": "deleted"}[how])


@pytest.mark.parametrize("how", ["suspend", "delete_account", "revoke_key"])
def test_owner_lost_while_a_request_waits_ends_the_batch_once_whoever_settles_it(svc, sim_control, monkeypatch, how):
    """The owner loses access (suspended, deleted, or its key revoked) while a request of its batch waits for
    a retry, and is made active again a moment later. The sweeper closes the waiting request; between that
    close and its fresh read of the batch, another settler (a worker whose last work of the batch is done)
    gives the batch its final status. The sweeper, reading an ended batch, must not end it again: the requests
    that were never dispatched count as failed once, the counts add up to the total, and the account gets its
    unfinished batch back once."""
    configure(svc, retry_base_seconds=30.0, retry_max_seconds=60.0)  # o-1 waits through the stop
    set_budgets(svc, {GLM: 2})
    account, key = new_key(svc)
    who = authenticate(svc, key)
    requests = [chat_request(f"o-{i}", f"owner {i}" + (" [[sim:flaky:1:500]]" if i == 1 else "")) for i in range(12)]
    batch_id = submit(svc, who, requests)
    dispatcher = Dispatcher(svc)
    assert dispatcher.pass_once() == 2
    run_queued(svc)  # o-0 completed; o-1 failed once and waits for its retry
    assert dispatcher.pass_once() == 2  # o-2, o-3 queued

    _lose_owner(svc, account, key, how)
    run_queued(svc)  # the worker's checks find the owner gone: the batch stops; o-2 and o-3 never run
    if how != "revoke_key":
        accounts.update_account(svc, account["id"], status="active")  # too late: the batch has failed for good
    stopped = get_batch(svc, batch_id)
    assert stopped["stop"] == "fail" and stopped["status"] == "in_progress"
    assert stopped["open"] == 1 and stopped["in_flight"] == 0  # o-1 still waits

    real_close_waiting = lifecycle._close_waiting
    other_settles = []

    def close_waiting_then_another_settles(*args, **kwargs):
        real_close_waiting(*args, **kwargs)
        if not other_settles:  # once: the other settler, between this close and the sweeper's fresh read
            run_request.BatchRequests(svc).settle_batch(batch_id)
            other_settles.append(get_batch(svc, batch_id)["status"])

    monkeypatch.setattr(lifecycle, "_close_waiting", close_waiting_then_another_settles)
    sweep_once(svc)

    assert other_settles == ["failed"]
    final = get_batch(svc, batch_id)
    assert final["status"] == "failed" and final["error"]["code"] == "owner_unauthorized"
    # o-0 completed; o-1 failed (it had run: it keeps its last error); o-2, o-3 and the 8 never dispatched
    # failed unrun; each counted once.
    assert (final["completed"], final["failed"], final["unstarted"]) == (1, 11, 10)
    assert account_counters(svc, account["id"]) == {"unfinished_batches": 0, "unfinished_requests": 0,
                                                    "in_flight": 0}
    assert_ledger_consistent(svc, batch_id, who, [r["custom_id"] for r in requests])
    assert sim_stats(sim_control)["total_requests"] == 2  # nothing ran after the owner lost access


class StalledClaims:
    """Batch reads on a pump's claim thread stall once `stall` is set, until `released` (counted parked
    meanwhile: the fake clock does not wait for them); with `throttle_starts`, reads on its start threads are
    throttled meanwhile."""

    def __init__(self, gate: Gate, monkeypatch: pytest.MonkeyPatch, throttle_starts: bool = False) -> None:
        self.stall, self.stalled, self.released = threading.Event(), threading.Event(), threading.Event()
        real_get = Batch.get

        def get(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202
            thread = threading.current_thread().name
            if self.stall.is_set() and throttle_starts and thread.startswith("pump-start"):
                raise Throttled("the batch's read was throttled")
            if self.stall.is_set() and thread.startswith("pump-claim"):
                gate.work.parked += 1
                self.stalled.set()
                try:
                    self.released.wait(30)
                finally:
                    gate.work.parked -= 1
            return real_get(*args, **kwargs)

        monkeypatch.setattr(Batch, "get", staticmethod(get))


def queued_behind_held_calls(svc, sim_control, monkeypatch, word: str, throttle_starts: bool = False,  # noqa: ANN001
                             meanwhile=lambda who, batch_id: None) -> tuple[Counter, int, tuple]:  # noqa: ANN001
    """A pump on a budget of 4 runs 4 calls of a 12-request batch, held at the backend, with more claimed and
    queued behind them; then its claims stall (`StalledClaims`), `meanwhile(who, batch_id)` runs, a second and
    a quarter pass on its clock (past `stale_stop_seconds`) and the held calls answer; once its queue is empty
    (nothing more started than the 4) the claims go on and it runs out. What it did, how many were queued, and
    the batch."""
    configure(svc, lease_seconds=3600)
    set_budgets(svc, {GLM: 4})
    _, key = new_key(svc)
    who = authenticate(svc, key)
    requests = [chat_request(f"{word[0]}-{i}", f"{word} {i}") for i in range(12)]
    batch_id = submit(svc, who, requests)
    config = scheduler_config(svc.settings)
    holding = [True]
    clock, gate = FakeClock(), Gate(held=lambda body: holding[0])  # calls held until the test lets them go
    claims = StalledClaims(gate, monkeypatch, throttle_starts)

    async def scenario() -> tuple[Counter, int]:
        pump_ = gated_pump(svc, gate, clock)
        running = asyncio.create_task(pump_.run(4))
        await gate.until(lambda: len(gate.waiting) == 4)
        await drive(running, clock, gate, config.poll_seconds, until=lambda: pump_.queue)
        claims.stall.set()
        await drive(running, clock, gate, config.poll_seconds, until=claims.stalled.is_set)
        queued, began = len(pump_.queue), clock.monotonic()
        meanwhile(who, batch_id)
        await drive(running, clock, gate, config.poll_seconds,
                    until=lambda: clock.monotonic() - began > config.stale_stop_seconds)
        holding[0] = False
        gate.release()
        await drive(running, clock, gate, config.poll_seconds, until=lambda: not pump_.queue)
        assert len(gate.started_at) == 4  # none of the queued started on the batch as it was
        claims.stall.clear()
        claims.released.set()
        await drive(running, clock, gate, config.poll_seconds)
        return running.result(), queued

    try:
        outcome, queued = asyncio.run(scenario())
    finally:
        claims.released.set()
    assert queued > 0 and outcome["handed_back"] >= queued, (queued, outcome)
    return outcome, queued, (who, requests, batch_id)


def test_a_cancel_stops_what_a_pump_had_queued_within_a_second_though_its_claims_are_stalled(svc, sim_control,
                                                                                            monkeypatch):
    """The batch is cancelled while the claims stall (their looks between claims stop too): the queued requests
    must not start on what the batch was before the cancel. Only the 4 running reach the backend."""
    def cancel(who, batch_id: str) -> None:  # noqa: ANN001
        assert batches.cancel_batch(svc, who, batch_id)["status"] == "cancelling"

    outcome, queued, (who, requests, batch_id) = queued_behind_held_calls(svc, sim_control, monkeypatch, "cancelled",
                                                                          meanwhile=cancel)

    assert outcome["handed_back"] == queued, (queued, outcome)
    assert sim_stats(sim_control, settle=True)["total_requests"] == 4
    final = pump(svc, batch_id)
    assert final["status"] == "cancelled" and final["completed"] == 4
    assert_ledger_consistent(svc, batch_id, who, [r["custom_id"] for r in requests])
    statuses = Counter(r["status"] for r in batches.results_page(svc, who, batch_id, 1000, None)["data"])
    assert statuses == {"completed": 4, "cancelled": 8}


def test_a_runner_that_cannot_look_at_its_batch_hands_its_request_back_and_it_runs_later(svc, sim_control,
                                                                                        monkeypatch):
    """No cancel, but the runners' own look at the batch is throttled when the held calls answer: their queued
    requests are handed back, not started on an old view; claimed again later, every request completes once."""
    _, _, (who, requests, batch_id) = queued_behind_held_calls(svc, sim_control, monkeypatch, "throttled",
                                                               throttle_starts=True)

    final = pump(svc, batch_id)
    assert final["status"] == "completed" and final["completed"] == 12
    assert sim_stats(sim_control, settle=True)["total_requests"] == 12  # each ran once
    assert_ledger_consistent(svc, batch_id, who, [r["custom_id"] for r in requests])
