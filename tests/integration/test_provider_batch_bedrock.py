"""A Bedrock model's part of a batch on Bedrock's batch inference (model invocation jobs on the simulated
backend's control plane, their input and output in moto's bucket), through the real API handler, worker and
sweeper (inline batches and Message Batches): each request lands as a direct Converse call's answer would, at the
tier's price with what it saved, and the job's objects leave the bucket once it is done; a
part under Bedrock's 100 records, a request a job cannot carry (tools) and a deployment without the service role
run directly; a record Bedrock refused fails with its answer, one it did not run runs directly; a job that never
finishes is stopped at the guard and its rest runs directly; a worker dying between the job's record and
Bedrock's job makes no second one."""

from __future__ import annotations

import pytest

from batchinfer.layout import batch_key
from batchinfer.records.provider_jobs import ProviderJob
from batchinfer.service.offloading import jobs
from tests.faults.harness import Clock
from tests.helpers import (
    finish,
    new_key,
    ok,
    req,
    services_in_use,
    step_by_record,
    worker_dies_before_recording_the_job,
)
from tests.integration.test_message_batches import Messages

CLAUDE = "claude-bedrock"  # the default catalog's Bedrock model, with a tier of at least 100 requests a job
MODEL_PRICE, TIER_PRICE = (1.00, 5.00), (0.50, 2.50)
ROLE = "arn:aws:iam::123456789012:role/batchinfer-bedrock-batch"
TOOL = {"type": "function", "function": {"name": "search", "parameters": {"type": "object", "properties": {}}}}


@pytest.fixture
def svc(svc, sim, sim_control):
    sim_control.post("/_sim/batches/reset")
    with services_in_use(svc, sim.url, "tierbedrock", bedrock_batch_role_arn=ROLE,
                         message_batches_enabled=True) as services:
        services.clock = Clock()
        yield services
    sim_control.post("/_sim/batches/reset")


def requests(n: int, text: str = "question", **body) -> list[dict]:
    return [req(f"b-{i}", f"{text} {i}", model=CLAUDE, max_tokens=24, **body) for i in range(n)]


def tier_stats(sim_control) -> dict:
    return sim_control.get("/_sim/batches").json()["bedrock_jobs"]


def converse_calls(sim_control) -> int:
    paths = sim_control.get("/_sim/stats").json()["by_path"]
    return sum(n for path, n in paths.items() if path.startswith("/model/") and path.endswith("/converse"))


def cost(usage: dict, price: tuple[float, float]) -> float:
    """What `usage` costs at `price`: a result's (prompt and completion tokens) or a batch's (input and output)."""
    tokens = (usage.get("prompt_tokens", usage.get("input_tokens")), usage.get("completion_tokens",
                                                                               usage.get("output_tokens")))
    return (tokens[0] * price[0] + tokens[1] * price[1]) / 1e6


def run(svc, api, key: str, lines: list[dict], execution: str) -> tuple[dict, dict]:
    created = api.created(key, lines, execution=execution)
    assert finish(svc, created["id"], clock_step=1)["status"] == "completed"  # a job's looks come a second apart
    shown = ok(api("GET", f"/v1/batches/{created['id']}", key))
    results = ok(api.results(key, created["id"], limit=1000))["data"]
    return shown, {r["custom_id"]: r for r in results}


def the_job(svc, batch_id: str) -> dict:
    [job] = ProviderJob.of_batch(svc.table, batch_id)
    return job


def test_a_bedrock_part_runs_as_a_model_invocation_job_with_a_direct_runs_results_at_the_tiers_price(
        svc, api, sim_control):
    _, key = new_key(svc)
    lines = requests(100)
    direct, expected = run(svc, api, key, lines, "direct")
    assert converse_calls(sim_control) == 100 and tier_stats(sim_control)["jobs"] == 0
    sim_control.post("/_sim/stats/reset")

    shown, results = run(svc, api, key, lines, "provider_batch")
    stats = tier_stats(sim_control)
    assert (stats["jobs"], stats["records"], stats["role_arns"], stats["invocation_types"]) == (
        1, 100, [ROLE], ["Converse"])
    assert converse_calls(sim_control) == 0  # nothing ran directly
    assert shown["request_counts"] == {"total": 100, "completed": 100, "failed": 0}
    for custom_id, result in results.items():  # the very answers a direct run gives (but their ids and times)
        body, direct_body = result["response"]["body"], expected[custom_id]["response"]["body"]
        assert result["response"]["status_code"] == 200
        assert (body["object"], body["model"], body["choices"], body["usage"]) == (
            direct_body["object"], direct_body["model"], direct_body["choices"], direct_body["usage"])
    assert shown["usage"] == direct["usage"] and shown["usage"]["input_tokens"] > 0
    assert shown["cost_usd"] == pytest.approx(cost(shown["usage"], TIER_PRICE), abs=1e-9)
    assert shown["saved_usd"] == pytest.approx(cost(shown["usage"], MODEL_PRICE) - shown["cost_usd"], abs=1e-9)
    assert direct["cost_usd"] == pytest.approx(cost(direct["usage"], MODEL_PRICE), abs=1e-9)
    assert the_job(svc, shown["id"])["state"] == "done"
    assert svc.blobs.keys("provider-jobs/") == []  # its input and output went with it


def test_a_message_batch_for_a_bedrock_model_runs_on_its_tier_with_a_direct_runs_messages(svc, api, sim_control):
    _, key = new_key(svc)
    messages = Messages(api, key)
    entries = [{"custom_id": f"m-{n}", "params": {"model": CLAUDE, "max_tokens": 32, "stop_sequences": ["zz"],
                                                  "system": "Be brief.",
                                                  "messages": [{"role": "user", "content": f"question {n}"}]}}
               for n in range(100)]

    def run_messages(execution: str) -> tuple[dict, dict]:
        created = ok(messages("POST", json_body={"requests": entries, "execution": execution}))
        finish(svc, created["id"])
        shown = ok(messages("GET", f"/{created['id']}"))
        return shown, {line["custom_id"]: line["result"] for line in messages.results(created["id"])}

    direct, expected = run_messages("direct")
    assert converse_calls(sim_control) == 100
    sim_control.post("/_sim/stats/reset")
    shown, results = run_messages("provider_batch")

    assert tier_stats(sim_control)["jobs"] == 1 and converse_calls(sim_control) == 0
    assert shown["request_counts"]["succeeded"] == 100
    for custom_id, result in results.items():  # the very messages a direct run gives (but their ids)
        assert result["type"] == "succeeded"
        got, want = result["message"], expected[custom_id]["message"]
        assert {k: v for k, v in got.items() if k != "id"} == {k: v for k, v in want.items() if k != "id"}
    assert shown["usage"] == direct["usage"]
    tokens = (shown["usage"]["input_tokens"], shown["usage"]["output_tokens"])
    assert shown["cost_usd"] == pytest.approx((tokens[0] * TIER_PRICE[0] + tokens[1] * TIER_PRICE[1]) / 1e6,
                                              abs=1e-9)


def test_a_part_under_bedrocks_100_records_runs_directly(svc, api, sim_control):
    _, key = new_key(svc)
    shown, results = run(svc, api, key, requests(99), "provider_batch")
    assert tier_stats(sim_control)["jobs"] == 0 and converse_calls(sim_control) == 99
    assert ProviderJob.of_batch(svc.table, shown["id"]) == []
    assert shown["saved_usd"] == 0
    assert shown["cost_usd"] == pytest.approx(cost(shown["usage"], MODEL_PRICE), abs=1e-9)


def test_without_the_service_role_a_bedrock_part_runs_directly(svc, api, sim_control):
    svc.settings = svc.settings.model_copy(update={"bedrock_batch_role_arn": None})
    _, key = new_key(svc)
    shown, _ = run(svc, api, key, requests(100), "provider_batch")
    assert tier_stats(sim_control)["jobs"] == 0 and converse_calls(sim_control) == 100
    assert shown["saved_usd"] == 0


def test_record_errors_fail_with_bedrocks_answer_and_what_a_job_cannot_carry_or_did_not_run_runs_directly(
        svc, api, sim_control):
    _, key = new_key(svc)
    lines = requests(101)
    lines[0] = req("b-0", "refused [[sim:400]]", model=CLAUDE, max_tokens=24)
    lines[1] = req("b-1", "flaky [[sim:tier-500]]", model=CLAUDE, max_tokens=24)
    lines[2] = req("b-2", "late [[sim:batch-expired]]", model=CLAUDE, max_tokens=24)
    lines[3] = req("b-3", "look it up", model=CLAUDE, max_tokens=24, tools=[TOOL])
    shown, results = run(svc, api, key, lines, "provider_batch")

    stats = tier_stats(sim_control)
    assert stats["jobs"] == 1 and stats["records"] == 100  # the tool request was not sent to the job
    assert converse_calls(sim_control) == 3  # the flaky, the late and the tool request, each once, directly
    assert {c: r["status"] for c, r in results.items() if r["status"] != "completed"} == {"b-0": "failed"}
    assert "Simulated batch line error 400" in str(results["b-0"]["error"])
    tier_usage = [r["response"]["body"]["usage"] for c, r in results.items() if c not in ("b-0", "b-1", "b-2", "b-3")]
    direct_usage = [results[c]["response"]["body"]["usage"] for c in ("b-1", "b-2", "b-3")]
    assert shown["cost_usd"] == pytest.approx(sum(cost(u, TIER_PRICE) for u in tier_usage)
                                              + sum(cost(u, MODEL_PRICE) for u in direct_usage), abs=1e-9)
    assert shown["saved_usd"] == pytest.approx(sum(cost(u, MODEL_PRICE) - cost(u, TIER_PRICE)
                                                   for u in tier_usage), abs=1e-9)


def test_a_job_that_never_finishes_is_stopped_at_the_guard_and_the_rest_runs_directly(svc, api, sim_control):
    assert sim_control.put("/_sim/batches/config", json={"never_finish": True,
                                                          "answered_before_cancel": 30}).status_code == 200
    _, key = new_key(svc)
    created = api.created(key, requests(100), execution="provider_batch")
    for _ in range(10):
        step_by_record(svc)
        if the_job(svc, created["id"])["state"] == "running":
            break
    for _ in range(3):  # it runs on at Bedrock, looked at on schedule, while the guard's moment is ahead
        svc.clock.advance(2)
        step_by_record(svc)
    assert the_job(svc, created["id"])["state"] == "running" and tier_stats(sim_control)["stops"] == 0
    batch = svc.table.get(*batch_key(created["id"]))
    svc.clock.advance(jobs.guard_at(svc, batch, svc.catalog.get(CLAUDE), 100) - svc.now())  # the guard's moment
    final = finish(svc, created["id"])

    assert final["status"] == "completed" and final["completed_at"] < final["expires_at"]
    assert tier_stats(sim_control)["stops"] == 1
    assert converse_calls(sim_control) == 70  # the 30 it finished are kept
    shown = ok(api("GET", f"/v1/batches/{created['id']}", key))
    assert shown["request_counts"]["completed"] == 100 and shown["saved_usd"] > 0


@pytest.mark.background_failures
def test_a_worker_dying_after_bedrocks_job_was_made_makes_no_second_one(svc, api, sim_control, monkeypatch):
    died = worker_dies_before_recording_the_job(monkeypatch)
    _, key = new_key(svc)
    shown, results = run(svc, api, key, requests(100, "die"), "provider_batch")

    assert died and shown["request_counts"]["completed"] == 100
    assert tier_stats(sim_control)["jobs"] == 1  # found again by its name and token, not made twice
    assert converse_calls(sim_control) == 0
    assert all(r["status"] == "completed" for r in results.values())
