"""A Bedrock model under faults, through boto3 against the simulated Bedrock runtime: a storm of
ThrottlingExceptions backs the model's concurrency off and every request still ends once; a worker that dies
after Bedrock answered is recovered by its lease, the lost answer counted as cost unknown."""

from __future__ import annotations

from batchinfer.layout import model_budget_key
from batchinfer.scheduling import outcomes as pump_outcomes
from batchinfer.scheduling.dispatcher import Dispatcher
from batchinfer.service.accounts import authenticate
from batchinfer.service.background.sweep import sweep_once
from batchinfer.service.running import run_request
from tests.faults.harness import (
    configure,
    get_batch,
    pump,
    receive,
    requests_by_custom_id,
    results_by_custom_id,
    run_messages,
    run_queued,
    set_budgets,
    sim_config,
    sim_stats,
    submit,
    worker_dies_after_answer,
)
from tests.helpers import chat_request, new_key
from tests.invariants import assert_ledger_consistent

CLAUDE = "claude-bedrock"


def test_a_throttling_storm_backs_off_and_loses_or_doubles_nothing(svc, sim_control, monkeypatch):
    set_budgets(svc, {CLAUDE: 6})
    configure(svc, backend_timeout_seconds=30)  # the storm is of 429s; a loaded machine must not add timeouts
    sim_config(sim_control, rate_429=0.35, seed=5)  # answered as Bedrock's ThrottlingException
    _, key = new_key(svc)
    who = authenticate(svc, key)
    requests = [chat_request(f"s-{i}", f"storm {i}", model=CLAUDE) for i in range(24)]
    batch_id = submit(svc, who, requests)
    backed_off = []
    real = run_request.backend_said_429

    def watched(svc_, model):
        real(svc_, model)
        backed_off.append(svc_.table.get(*model_budget_key(model.id)).get("adaptive_cap"))

    for module in (run_request, pump_outcomes):  # the worker's first group and its slot pump's outcomes
        monkeypatch.setattr(module, "backend_said_429", watched)
    final = pump(svc, batch_id, clock_step=2)

    assert final["status"] == "completed" and final["completed"] == 24 and final["failed"] == 0
    assert_ledger_consistent(svc, batch_id, who, [r["custom_id"] for r in requests])
    stored = requests_by_custom_id(svc, batch_id)
    stats = sim_stats(sim_control, settle=True)
    unknown = final["cost_unknown_attempts"]  # an answer lost on the way (a timeout): the one way to run twice
    assert stats["by_status"].get("429", 0) > 0
    assert 24 <= stats["by_status"]["200"] <= 24 + unknown and unknown <= 1, (stats, unknown)
    assert sum(r["attempt"] for r in stored.values()) == stats["total_requests"]  # every call, a counted attempt
    assert backed_off and all(cap is not None and 1 <= cap < 6 for cap in backed_off), backed_off


def test_a_worker_dying_after_bedrock_answered_is_recovered_by_its_lease(svc, sim_control, monkeypatch):
    configure(svc, lease_seconds=60)
    _, key = new_key(svc)
    who = authenticate(svc, key)
    requests = [chat_request("dies", "the worker dies after this answer", model=CLAUDE),
                chat_request("fine", "all good", model=CLAUDE)]
    batch_id = submit(svc, who, requests)
    died = worker_dies_after_answer(monkeypatch, "dies")
    assert Dispatcher(svc).pass_once() == 2
    messages = receive(svc, CLAUDE)
    report = run_messages(svc, CLAUDE, messages)
    assert died == ["completed"] and report["failed"]
    assert results_by_custom_id(svc, who, batch_id)["dies"]["status"] == "running"
    sweep_once(svc)
    run_queued(svc)  # the redelivered message is stale before the lease runs out
    assert results_by_custom_id(svc, who, batch_id)["dies"]["status"] == "running"
    assert get_batch(svc, batch_id)["status"] == "in_progress"

    svc.clock.advance(61)
    final = pump(svc, batch_id, clock_step=2)

    assert final["status"] == "completed" and final["completed"] == 2 and final["failed"] == 0
    assert_ledger_consistent(svc, batch_id, who, ["dies", "fine"])
    stored = requests_by_custom_id(svc, batch_id)
    assert stored["dies"]["attempt"] == 2 and stored["fine"]["attempt"] == 1
    assert final["cost_unknown_attempts"] == 1  # Bedrock may have billed the lost answer
    paths = sim_stats(sim_control)["by_path"]
    assert sum(n for p, n in paths.items() if p.endswith("/converse")) == 3
