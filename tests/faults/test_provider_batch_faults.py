"""Provider jobs under faults: per-line errors (final ones fail the request with the provider's answer kept,
retryable ones run again directly), a job that never finishes (the guard cancels it in time and the rest runs
directly), a cancel during a job, a worker dying between the job's record and the provider's job or while it
takes the results (no second job, nothing doubled), and a job that fails as a whole."""

from __future__ import annotations

import itertools
import json

import pytest

from batchinfer.operations.openai import batches
from batchinfer.providers.batch_tiers import JobView, TierError
from batchinfer.records.provider_jobs import ProviderJob
from batchinfer.service import accounts
from batchinfer.service.accounts import authenticate
from batchinfer.service.offloading import jobs
from batchinfer.service.offloading.execution import goes_to_tier
from local.lambda_runtime import invoke
from local.simulated_answers import build_chat, parse_chat
from tests.faults.harness import account_counters, configure, get_batch, pump, results_by_custom_id, sim_stats
from tests.helpers import chat_request, new_key, worker_dies_before_recording_the_job
from tests.invariants import assert_ledger_consistent

TIER = (0.05, 0.20)
DIRECT = (0.10, 0.40)


@pytest.fixture
def tier_sim(sim_control):
    sim_control.post("/_sim/batches/reset")
    yield sim_control
    sim_control.post("/_sim/batches/reset")


def tier_config(sim_control, **config) -> None:
    answer = sim_control.put("/_sim/batches/config", json=config)
    assert answer.status_code == 200, answer.text


def tier_stats(sim_control) -> dict:
    return sim_control.get("/_sim/batches").json()


def submit_tier(svc, who, requests: list[dict]) -> str:
    body = {"requests": requests, "execution": "provider_batch"}
    obj, created = batches.create_batch(svc, who, json.dumps(body).encode(), None)
    assert created and obj["execution"] == "provider_batch"
    return obj["id"]


def the_job(svc, batch_id: str) -> dict:
    [job] = ProviderJob.of_batch(svc.table, batch_id)
    return job


def until_job(svc, batch_id: str, state: str, rounds: int = 20) -> dict:
    for _ in range(rounds):
        if the_job(svc, batch_id)["state"] == state:
            return the_job(svc, batch_id)
        invoke("sweeper", {})
    raise AssertionError(f"the job never got to {state}: {the_job(svc, batch_id)}")


def cost(tokens: tuple[int, int], price: tuple[float, float]) -> float:
    return (tokens[0] * price[0] + tokens[1] * price[1]) / 1e6


def usage_of(result: dict) -> tuple[int, int]:
    usage = result["response"]["body"]["usage"]
    return usage["prompt_tokens"], usage["completion_tokens"]


def assert_ran_directly(svc, who, batch_id: str, requests: list[dict], final: dict) -> None:
    """Each request's result is the backend's own answer to it (content and usage), charged at the direct price."""
    results = results_by_custom_id(svc, who, batch_id)
    for request in requests:
        answer = build_chat(parse_chat(request["body"]), request["body"])
        body = results[request["custom_id"]]["response"]["body"]
        assert body["choices"][0]["message"]["content"] == answer["choices"][0]["message"]["content"]
        assert usage_of(results[request["custom_id"]]) == (answer["usage"]["prompt_tokens"],
                                                           answer["usage"]["completion_tokens"])
    assert batches.batch_object(final)["cost_usd"] == pytest.approx(
        sum(cost(usage_of(r), DIRECT) for r in results.values()), abs=1e-9)


def job_running(svc, tier_sim, n: int, custom_id: str, text: str, **tier) -> tuple:
    """A new account's batch of n requests on the tier, its job running at a provider that never finishes it
    (`tier`: more of the simulator's tier settings): (who, requests, batch_id)."""
    tier_config(tier_sim, never_finish=True, **tier)
    _, key = new_key(svc)
    who = authenticate(svc, key)
    requests = [chat_request(f"{custom_id}{i}", f"{text}{i}") for i in range(n)]
    batch_id = submit_tier(svc, who, requests)
    until_job(svc, batch_id, "running")
    return who, requests, batch_id


def test_per_line_errors_final_ones_fail_with_the_providers_answer_retryable_ones_run_directly(svc, tier_sim):
    _, key = new_key(svc)
    who = authenticate(svc, key)
    requests = [chat_request("ok-0", "fine"), chat_request("ok-1", "also fine"),
                chat_request("bad", "refused [[sim:400]]"),
                chat_request("flaky", "a server error at the provider [[sim:tier-500]]"),
                chat_request("late", "never run by the provider [[sim:batch-expired]]")]
    batch_id = submit_tier(svc, who, requests)
    final = pump(svc, batch_id)

    assert final["status"] == "completed"
    assert_ledger_consistent(svc, batch_id, who, [r["custom_id"] for r in requests])
    results = results_by_custom_id(svc, who, batch_id)
    assert {c: r["status"] for c, r in results.items()} == {
        "ok-0": "completed", "ok-1": "completed", "bad": "failed", "flaky": "completed", "late": "completed"}
    bad = results["bad"]["error"]
    assert bad["code"] == "invalid_request" or bad["status"] == 400, bad
    assert "Simulated batch line error 400" in json.dumps(results["bad"]), results["bad"]
    assert tier_stats(tier_sim)["jobs"] == 1
    direct = sim_stats(tier_sim)["by_path"].get("/v1/chat/completions", 0)
    assert direct == 2  # `flaky` and `late`, each once, directly
    tier_tokens = [usage_of(results[c]) for c in ("ok-0", "ok-1")]
    direct_tokens = [usage_of(results[c]) for c in ("flaky", "late")]
    batch = batches.batch_object(get_batch(svc, batch_id))
    expected = sum(cost(t, TIER) for t in tier_tokens) + sum(cost(t, DIRECT) for t in direct_tokens)
    assert batch["cost_usd"] == pytest.approx(expected, abs=1e-9)
    assert batch["saved_usd"] == pytest.approx(sum(cost(t, DIRECT) - cost(t, TIER) for t in tier_tokens), abs=1e-9)
    assert final.get("offloaded", 0) == 0


def test_a_job_that_never_finishes_is_cancelled_at_the_guard_and_the_rest_runs_directly(svc, tier_sim):
    who, requests, batch_id = job_running(svc, tier_sim, 6, "n-", "never ", answered_before_cancel=2)
    for _ in range(3):  # it runs on at the provider, looked at on schedule, while the guard's moment is ahead
        svc.clock.advance(2)
        invoke("sweeper", {})
    assert the_job(svc, batch_id)["state"] == "running" and tier_stats(tier_sim)["cancels"] == 0
    batch = get_batch(svc, batch_id)
    model = svc.catalog.get("glm-5.3-flash")
    svc.clock.advance(jobs.guard_at(svc, batch, model, 6) - svc.now())  # the guard's moment
    final = pump(svc, batch_id)

    assert final["status"] == "completed"
    assert final["completed_at"] < final["expires_at"]
    assert tier_stats(tier_sim)["cancels"] == 1
    assert sim_stats(tier_sim)["by_path"].get("/v1/chat/completions", 0) == 4  # the two it finished are kept
    assert_ledger_consistent(svc, batch_id, who, [r["custom_id"] for r in requests])
    assert final["completed"] == 6 and final["saved_usd"] > 0


def test_the_guard_comes_no_later_than_guard_seconds_before_the_window_ends(svc, tier_sim):
    _, key = new_key(svc)
    who = authenticate(svc, key)
    batch_id = submit_tier(svc, who, [chat_request(f"g-{i}", "q") for i in range(3)])
    batch, model = get_batch(svc, batch_id), svc.catalog.get("glm-5.3-flash")
    assert jobs.guard_at(svc, batch, model, 3) <= batch["expires_at"] - model.provider_batch.guard_seconds
    # Past the guard's moment a part does not go to the tier at all.
    late = {**batch, "expires_at": svc.now() + model.provider_batch.guard_seconds - 1}
    assert not goes_to_tier(late, model, 3, svc.now())


def test_cancel_during_a_job_cancels_it_at_the_provider_and_keeps_what_it_finished(svc, tier_sim):
    who, requests, batch_id = job_running(svc, tier_sim, 4, "c-", "cancel ", answered_before_cancel=1)
    assert batches.cancel_batch(svc, who, batch_id)["status"] == "cancelling"
    final = pump(svc, batch_id)

    assert final["status"] == "cancelled"
    assert tier_stats(tier_sim)["cancels"] == 1
    assert sim_stats(tier_sim)["by_path"].get("/v1/chat/completions", 0) == 0  # nothing ran directly
    assert final["completed"] == 1
    assert_ledger_consistent(svc, batch_id, who, [r["custom_id"] for r in requests])


@pytest.mark.background_failures
def test_a_worker_dying_after_the_providers_job_was_made_makes_no_second_one(svc, tier_sim, monkeypatch):
    _, key = new_key(svc)
    who = authenticate(svc, key)
    requests = [chat_request(f"d-{i}", f"die {i}") for i in range(5)]
    batch_id = submit_tier(svc, who, requests)
    died = worker_dies_before_recording_the_job(monkeypatch)
    invoke("sweeper", {})
    assert died and the_job(svc, batch_id)["state"] == "submitting" and tier_stats(tier_sim)["jobs"] == 1
    svc.clock.advance(jobs.RETRY_SECONDS)  # a job whose look raised is looked at again a little later
    final = pump(svc, batch_id)

    assert final["status"] == "completed" and final["completed"] == 5
    assert tier_stats(tier_sim)["jobs"] == 1  # found again by its key, not made twice
    assert sim_stats(tier_sim)["by_path"].get("/v1/chat/completions", 0) == 0
    assert_ledger_consistent(svc, batch_id, who, [r["custom_id"] for r in requests])


def job_state_change_dies(monkeypatch, when, message: str) -> list[str]:
    """A job's state change raises (the worker dies there) whenever `when(job, state, died so far)` says so;
    the jobs it died on are listed."""
    real_state, died = jobs._state, []

    def dies(svc_, job, state, **sets):
        if when(job, state, died):
            died.append(job["sk"])
            raise RuntimeError(message)
        return real_state(svc_, job, state, **sets)

    monkeypatch.setattr(jobs, "_state", dies)
    return died


@pytest.mark.background_failures
def test_a_worker_dying_while_it_takes_the_results_lands_nothing_twice(svc, tier_sim, monkeypatch):
    _, key = new_key(svc)
    who = authenticate(svc, key)
    requests = [chat_request(f"t-{i}", f"take {i}") for i in range(5)]
    batch_id = submit_tier(svc, who, requests)
    # Once, after a page landed and before its place is recorded.
    died = job_state_change_dies(monkeypatch, lambda job, state, died: job["state"] == state == "collecting"
                                 and not died, "the worker died before it recorded the page's end")
    for _ in range(5):
        invoke("sweeper", {})
        svc.clock.advance(jobs.RETRY_SECONDS)  # its next look (put off a little after the look that raised)
    assert died and get_batch(svc, batch_id)["completed"] == 5
    final = pump(svc, batch_id)

    assert final["status"] == "completed" and final["completed"] == 5
    results = results_by_custom_id(svc, who, batch_id)
    expected = sum(cost(usage_of(r), TIER) for r in results.values())
    assert batches.batch_object(final)["cost_usd"] == pytest.approx(expected, abs=1e-9)
    assert_ledger_consistent(svc, batch_id, who, [r["custom_id"] for r in requests])


@pytest.mark.background_failures
def test_jobs_whose_look_always_raises_are_put_off_and_never_hold_back_another_accounts(svc, tier_sim, monkeypatch):
    """One account's job whose every look raises (its bulkhead passes over it) is put off, longer at each
    failure in a row, so that it does not stand first among the due jobs run after run: another account's
    job, due after it, is looked at and ends though a run looks at one job only."""
    _, poisoner_key = new_key(svc)
    poisoned = submit_tier(svc, authenticate(svc, poisoner_key), [chat_request(f"p-{i}", f"p {i}") for i in range(5)])
    svc.clock.advance(1)  # the poisoned job is due first
    _, key = new_key(svc)
    who = authenticate(svc, key)
    requests = [chat_request(f"h-{i}", f"healthy {i}") for i in range(5)]
    healthy = submit_tier(svc, who, requests)
    real_step, raised = jobs._step, []

    def step(svc_, job):
        if job["batch_id"] == poisoned:
            raised.append(svc_.now())
            raise RuntimeError("a step that always raises")
        return real_step(svc_, job)

    monkeypatch.setattr(jobs, "_step", step)
    monkeypatch.setattr(jobs, "JOBS_PER_RUN", 1)
    configure(svc, sweep_failures_to_fail=10)  # only put off here, never given up (a slow run may see a third)
    for _ in range(12):
        invoke("sweeper", {})
        svc.clock.advance(1)

    assert the_job(svc, healthy)["state"] == "done" and get_batch(svc, healthy)["completed"] == 5
    # At its first look, 5 s later, then 10 s after that (the service's clock also moves with real time): not
    # at every run.
    assert 2 <= len(raised) <= 3, raised
    assert the_job(svc, poisoned)["failures"] == len(raised)
    final = pump(svc, healthy)
    assert final["status"] == "completed"
    assert_ledger_consistent(svc, healthy, who, [r["custom_id"] for r in requests])


def looks_until(svc, batch_id: str, states: tuple[str, ...], seconds: float = 30, rounds: int = 12) -> dict:
    """Sweeper runs, the clock moved on between them (past any put-off), until the job is in one of `states`."""
    for _ in range(rounds):
        invoke("sweeper", {})
        if the_job(svc, batch_id)["state"] in states:
            return the_job(svc, batch_id)
        svc.clock.advance(seconds)
    raise AssertionError(f"the job never got to {states}: {the_job(svc, batch_id)}")


@pytest.mark.background_failures
def test_a_job_whose_look_at_its_provider_keeps_raising_is_given_up_and_its_requests_run_directly(
        svc, tier_sim, monkeypatch):
    """A running job whose look raises `sweep_failures_to_fail` times in a row is given up: its provider's job
    is cancelled and every request it held runs directly (those the provider had finished too: nothing of
    the provider's was landed, so nothing is charged twice), and the batch completes."""
    who, requests, batch_id = job_running(svc, tier_sim, 5, "u-", "unseen ", answered_before_cancel=2)
    raised = []

    def poll(svc_, job, batch, model):
        raised.append(job["state"])
        raise RuntimeError("a look at the provider that always raises")

    monkeypatch.setattr(jobs, "_poll", poll)
    given_up = looks_until(svc, batch_id, ("handing_back", "done"))

    assert raised == ["running"] * svc.settings.sweep_failures_to_fail
    assert tier_stats(tier_sim)["cancels"] == 1 and given_up.get("failures", 0) == 0
    final = pump(svc, batch_id)
    assert final["status"] == "completed" and final["completed"] == 5 and final.get("offloaded", 0) == 0
    assert sim_stats(tier_sim)["by_path"].get("/v1/chat/completions", 0) == 5  # every one of them, directly
    assert_ran_directly(svc, who, batch_id, requests, final)
    assert final.get("saved_usd", 0) == 0
    assert_ledger_consistent(svc, batch_id, who, [r["custom_id"] for r in requests])


@pytest.mark.background_failures
def test_a_job_whose_submit_never_gets_recorded_is_given_up_and_its_providers_job_cancelled(
        svc, tier_sim, monkeypatch):
    """The provider's job is made but the job's record of it fails at every try: once given up, the provider's
    job (found by the job's key) is cancelled, never made twice, and the requests run directly."""
    tier_config(tier_sim, never_finish=True)
    _, key = new_key(svc)
    who = authenticate(svc, key)
    requests = [chat_request(f"s-{i}", f"submitted {i}") for i in range(3)]
    batch_id = submit_tier(svc, who, requests)
    died = job_state_change_dies(monkeypatch, lambda job, state, died: state == "running",
                                 "the worker died before it recorded the provider's job")
    looks_until(svc, batch_id, ("handing_back", "done"))

    assert len(died) == svc.settings.sweep_failures_to_fail
    assert tier_stats(tier_sim)["jobs"] == 1 and tier_stats(tier_sim)["cancels"] == 1
    final = pump(svc, batch_id)
    assert final["status"] == "completed" and final["completed"] == 3
    assert sim_stats(tier_sim)["by_path"].get("/v1/chat/completions", 0) == 3
    assert_ledger_consistent(svc, batch_id, who, [r["custom_id"] for r in requests])


def tried_apart(tried: list[tuple[str, int]]) -> bool:
    """Each look at the provider came a put-off (RETRY_SECONDS) or more after the one before it: the services'
    clock is the real one moved on by the test, so a loaded machine may add a second."""
    looks = [at for call, at in tried if call == "look"]
    return all(later - earlier >= jobs.RETRY_SECONDS for earlier, later in itertools.pairwise(looks))


def with_the_last_look(tried: list[tuple[str, int]]) -> bool:
    """The cancel was tried in the sweep of the last look, not a put-off later (a loaded machine may add a
    second of the real clock between them)."""
    return tried[-1][1] - tried[-2][1] < jobs.RETRY_SECONDS


def provider_stops_answering(svc, monkeypatch) -> list[tuple[str, int]]:
    """From now on the tier's looks and cancels do not go through (an outage, a revoked provider key); the
    calls tried are listed, in order, each with when it was tried."""
    tier, tried = jobs.tier_of(svc.catalog.get("glm-5.3-flash")), []

    def silent(call: str):
        def no_answer(model, api_key, provider_id):
            tried.append((call, svc.now()))
            raise TierError(f"the provider did not answer its {call}")
        return no_answer

    for call in ("look", "cancel"):
        monkeypatch.setattr(tier, call, silent(call))
    return tried


@pytest.mark.background_failures
def test_a_job_whose_provider_stops_answering_runs_its_requests_directly_once_its_guards_moment_passed(
        svc, tier_sim, monkeypatch):
    """While the guard's moment is ahead a provider that does not answer is only tried again (nothing given
    up); past it, each look it does not answer counts, and after `sweep_failures_to_fail` of them the job is
    given up: its requests run directly and the batch completes within its window, with their answers."""
    who, requests, batch_id = job_running(svc, tier_sim, 5, "o-", "outage ")
    tried = provider_stops_answering(svc, monkeypatch)
    for _ in range(6):  # an outage of minutes before the guard's moment
        svc.clock.advance(jobs.RETRY_SECONDS)
        invoke("sweeper", {})
    job = the_job(svc, batch_id)
    assert [call for call, _ in tried] == ["look"] * 6 and job["state"] == "running" and job.get("failures", 0) == 0
    guard = jobs.guard_at(svc, get_batch(svc, batch_id), svc.catalog.get("glm-5.3-flash"), 5)
    svc.clock.advance(guard - svc.now())
    del tried[:]
    looks_until(svc, batch_id, ("handing_back", "done"), seconds=jobs.RETRY_SECONDS)

    times = svc.settings.sweep_failures_to_fail
    assert [call for call, _ in tried] == ["look"] * times + ["cancel"]  # its provider's job cancelled, best effort
    assert tried[0][1] >= guard and tried_apart(tried) and with_the_last_look(tried)
    final = pump(svc, batch_id)
    assert final["status"] == "completed" and final["completed"] == 5 and final.get("offloaded", 0) == 0
    assert final["completed_at"] < final["expires_at"]
    assert sim_stats(tier_sim)["by_path"].get("/v1/chat/completions", 0) == 5
    assert_ran_directly(svc, who, batch_id, requests, final)
    assert_ledger_consistent(svc, batch_id, who, [r["custom_id"] for r in requests])


@pytest.mark.background_failures
def test_a_batch_cancelled_while_its_provider_does_not_answer_ends_cancelled(svc, tier_sim, monkeypatch):
    """A batch cancelled while its job's provider does not answer: each try counts, and after
    `sweep_failures_to_fail` of them the job is given up and the batch ends cancelled, nothing run directly."""
    who, requests, batch_id = job_running(svc, tier_sim, 4, "x-", "cancelled in an outage ")
    tried = provider_stops_answering(svc, monkeypatch)
    assert batches.cancel_batch(svc, who, batch_id)["status"] == "cancelling"
    looks_until(svc, batch_id, ("handing_back", "done"), seconds=jobs.RETRY_SECONDS)

    times = svc.settings.sweep_failures_to_fail
    assert [call for call, _ in tried] == ["look"] * times + ["cancel"]
    assert tried_apart(tried) and with_the_last_look(tried)  # its looks a put-off apart, then the cancel
    final = pump(svc, batch_id)
    assert final["status"] == "cancelled" and final["completed"] == 0 and final.get("offloaded", 0) == 0
    assert sim_stats(tier_sim)["by_path"].get("/v1/chat/completions", 0) == 0
    assert tier_stats(tier_sim)["cancels"] == 0
    assert_ledger_consistent(svc, batch_id, who, [r["custom_id"] for r in requests])
    assert account_counters(svc, who.account_id) == {"unfinished_batches": 0, "unfinished_requests": 0,
                                                     "in_flight": 0}


@pytest.mark.background_failures
def test_a_key_revoked_while_its_jobs_provider_does_not_answer_fails_the_batch_at_the_next_look(
        svc, tier_sim, monkeypatch):
    """A key revoked during an outage of its job's provider, hours before the guard's moment: the next look
    fails the batch, as a worker would (no more of its requests may run); each look the provider does not
    answer then counts, and after `sweep_failures_to_fail` of them the job is given up and the batch ends
    failed, nothing run directly."""
    who, requests, batch_id = job_running(svc, tier_sim, 4, "k-", "revoked in an outage ")
    tried = provider_stops_answering(svc, monkeypatch)
    accounts.revoke_key(svc, get_batch(svc, batch_id)["key_hash"])
    svc.clock.advance(jobs.RETRY_SECONDS)
    invoke("sweeper", {})
    batch = get_batch(svc, batch_id)
    assert batch["stop"] == "fail" and svc.now() < jobs.guard_at(svc, batch, svc.catalog.get("glm-5.3-flash"), 4)
    looks_until(svc, batch_id, ("handing_back", "done"), seconds=jobs.RETRY_SECONDS)

    times = svc.settings.sweep_failures_to_fail
    assert [call for call, _ in tried] == ["look"] * times + ["cancel"]  # its provider's job cancelled, best effort
    final = pump(svc, batch_id)
    assert final["status"] == "failed" and final["stop"] == "fail" and final["completed"] == 0
    assert sim_stats(tier_sim)["by_path"].get("/v1/chat/completions", 0) == 0
    assert_ledger_consistent(svc, batch_id, who, [r["custom_id"] for r in requests])
    assert account_counters(svc, who.account_id) == {"unfinished_batches": 0, "unfinished_requests": 0,
                                                     "in_flight": 0}


def test_a_provider_answering_between_failures_past_the_guard_never_gets_its_job_given_up(
        svc, tier_sim, monkeypatch):
    """Only tries not answered in a row count: a cancelling job whose provider answers every other look (its job
    still cancelling there) is never given up, and once the provider's job has ended what it finished lands."""
    who, requests, batch_id = job_running(svc, tier_sim, 4, "i-", "intermittent ", answered_before_cancel=1)
    tier = jobs.tier_of(svc.catalog.get("glm-5.3-flash"))
    real_look, looks = tier.look, []

    def now_and_then(model, api_key, provider_id):  # answered (and cancelled), then every other look answered
        looks.append(svc.now())
        if len(looks) == 1 or len(looks) > 8:
            return real_look(model, api_key, provider_id)
        if len(looks) % 2 == 0:
            raise TierError("the provider did not answer this look")
        return JobView(provider_id=provider_id, status="cancelling", ended=False)

    monkeypatch.setattr(tier, "look", now_and_then)
    assert batches.cancel_batch(svc, who, batch_id)["status"] == "cancelling"
    final = pump(svc, batch_id, clock_step=jobs.RETRY_SECONDS, rounds=60)

    assert len(looks) == 9 and final["status"] == "cancelled" and final["completed"] == 1
    assert tier_stats(tier_sim)["cancels"] == 1
    assert sim_stats(tier_sim)["by_path"].get("/v1/chat/completions", 0) == 0
    assert_ledger_consistent(svc, batch_id, who, [r["custom_id"] for r in requests])


@pytest.mark.background_failures
def test_a_job_whose_hand_back_keeps_raising_fails_its_batch_and_frees_its_accounts_slot(svc, tier_sim, monkeypatch):
    """A job whose hand-back raises `sweep_failures_to_fail` times in a row is abandoned: its batch ends failed
    with `internal_error`, what the provider finished kept, the requests it still held counted as failed,
    the account's unfinished batch given back; another account's batch goes on and completes."""
    tier_config(tier_sim, never_finish=True, answered_before_cancel=2)
    _, poisoner_key = new_key(svc)
    poisoner = authenticate(svc, poisoner_key)
    poisoned_requests = [chat_request(f"p-{i}", f"p {i}") for i in range(5)]
    poisoned = submit_tier(svc, poisoner, poisoned_requests)
    _, key = new_key(svc)
    who = authenticate(svc, key)
    requests = [chat_request(f"h-{i}", f"healthy {i}") for i in range(4)]
    healthy = submit_tier(svc, who, requests)
    until_job(svc, poisoned, "running")
    until_job(svc, healthy, "running")
    real_hand_back, raised = jobs._hand_back, []

    def hand_back(svc_, job, batch, model):
        if job["batch_id"] == poisoned:
            raised.append(svc_.now())
            raise RuntimeError("a hand-back that always raises")
        return real_hand_back(svc_, job, batch, model)

    monkeypatch.setattr(jobs, "_hand_back", hand_back)
    model = svc.catalog.get("glm-5.3-flash")
    guard = max(jobs.guard_at(svc, get_batch(svc, b), model, n) for b, n in ((poisoned, 5), (healthy, 4)))
    svc.clock.advance(guard - svc.now())  # both jobs are cancelled at their guard; each lands the two it finished
    looks_until(svc, poisoned, ("done",))

    assert len(raised) == svc.settings.sweep_failures_to_fail
    failed = pump(svc, poisoned)
    assert failed["status"] == "failed"
    obj = batches.batch_object(failed)
    assert obj["error"]["code"] == "internal_error" and "provider job" in obj["error"]["message"]
    assert obj["request_counts"] == {"total": 5, "completed": 2, "failed": 3}
    assert failed.get("offloaded", 0) == 0 and failed.get("open", 0) == 0 and failed.get("in_flight", 0) == 0
    assert sim_stats(tier_sim)["by_path"].get("/v1/chat/completions", 0) == 2  # only the healthy batch's rest
    assert_ledger_consistent(svc, poisoned, poisoner, [r["custom_id"] for r in poisoned_requests])
    assert account_counters(svc, poisoner.account_id) == {"unfinished_batches": 0, "unfinished_requests": 0,
                                                          "in_flight": 0}
    final = pump(svc, healthy)
    assert final["status"] == "completed" and final["completed"] == 4
    assert_ledger_consistent(svc, healthy, who, [r["custom_id"] for r in requests])
    assert tier_stats(tier_sim)["cancels"] == 2


def test_a_job_that_fails_as_a_whole_runs_its_requests_directly(svc, tier_sim):
    tier_config(tier_sim, fail_jobs=True)
    _, key = new_key(svc)
    who = authenticate(svc, key)
    requests = [chat_request(f"f-{i}", f"fail {i}") for i in range(3)]
    batch_id = submit_tier(svc, who, requests)
    final = pump(svc, batch_id)

    assert final["status"] == "completed" and final["completed"] == 3
    assert sim_stats(tier_sim)["by_path"].get("/v1/chat/completions", 0) == 3
    assert batches.batch_object(final)["saved_usd"] == 0
    assert_ledger_consistent(svc, batch_id, who, [r["custom_id"] for r in requests])


def test_a_pause_leaves_a_submitted_job_running_and_its_answers_land(svc, tier_sim):
    tier_config(tier_sim, turnaround_seconds=3600)  # the provider takes its time
    _, key = new_key(svc)
    who = authenticate(svc, key)
    requests = [chat_request(f"p-{i}", f"pause {i}") for i in range(4)]
    batch_id = submit_tier(svc, who, requests)
    until_job(svc, batch_id, "running")
    assert batches.pause_batch(svc, who, batch_id)["paused_at"] is not None
    for _ in range(3):  # paused: the job's requests stay with it, nothing runs directly
        svc.clock.advance(2)
        invoke("sweeper", {})
    paused = get_batch(svc, batch_id)
    assert paused["offloaded"] == 4 and the_job(svc, batch_id)["state"] == "running"
    tier_config(tier_sim, turnaround_seconds=0)
    svc.clock.advance(2)
    until_job(svc, batch_id, "done")
    invoke("sweeper", {})
    final = get_batch(svc, batch_id)  # landed while paused: with nothing left to run, it has ended

    assert final["status"] == "completed" and final["completed"] == 4 and tier_stats(tier_sim)["jobs"] == 1
    assert sim_stats(tier_sim)["by_path"].get("/v1/chat/completions", 0) == 0
    assert_ledger_consistent(svc, batch_id, who, [r["custom_id"] for r in requests])


def test_a_revoked_key_fails_the_batch_and_cancels_its_job(svc, tier_sim):
    tier_config(tier_sim, never_finish=True)
    _, key = new_key(svc)
    who = authenticate(svc, key)
    requests = [chat_request(f"r-{i}", f"revoked {i}") for i in range(3)]
    batch_id = submit_tier(svc, who, requests)
    until_job(svc, batch_id, "running")
    accounts.revoke_key(svc, key)
    svc.clock.advance(2)  # its next look
    final = pump(svc, batch_id)

    assert final["status"] == "failed" and final["stop"] == "fail"
    assert tier_stats(tier_sim)["cancels"] == 1
    assert sim_stats(tier_sim)["by_path"].get("/v1/chat/completions", 0) == 0
    assert final["completed"] == 0 and final.get("offloaded", 0) == 0
