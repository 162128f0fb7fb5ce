"""A model's part of a batch on its provider's batch tier (the simulated backend's OpenAI Batches API): what a
user sees through the API. Each request lands as a direct call's would, at the tier's price, with what it
saved; a part under the tier's minimum, a `direct` batch and a failed job run directly."""

from __future__ import annotations

import pytest

from batchinfer.records.provider_jobs import ProviderJob
from tests.helpers import anthropic_error, error, finish, new_key, ok, req, settings

TIER_PRICE = (0.05, 0.20)
MODEL_PRICE = (0.10, 0.40)


@pytest.fixture
def batches_sim(sim_control):
    sim_control.post("/_sim/batches/reset")
    yield sim_control
    sim_control.post("/_sim/batches/reset")


def sim_jobs(sim_control) -> dict:
    return sim_control.get("/_sim/batches").json()


def cost(usage: dict, price: tuple[float, float]) -> float:
    return (usage["input_tokens"] * price[0] + usage["output_tokens"] * price[1]) / 1e6


def test_a_tier_batch_runs_on_the_provider_at_its_price_with_what_it_saved(svc, api, batches_sim):
    _, key = new_key(svc)
    created = api.created(key, [req(f"r{i}", f"question {i}") for i in range(5)], execution="provider_batch")
    assert created["execution"] == "provider_batch" and created["saved_usd"] == 0
    done = finish(svc, created["id"])
    assert done["status"] == "completed"
    shown = ok(api("GET", f"/v1/batches/{created['id']}", key))
    assert shown["request_counts"] == {"total": 5, "completed": 5, "failed": 0}
    assert sim_jobs(batches_sim)["jobs"] == 1 and sim_jobs(batches_sim)["lines"] == 5
    stats = batches_sim.get("/_sim/stats").json()
    assert stats["by_path"].get("/v1/chat/completions", 0) == 0  # nothing ran directly
    assert shown["cost_usd"] == pytest.approx(cost(shown["usage"], TIER_PRICE), abs=1e-9)
    assert shown["saved_usd"] == pytest.approx(cost(shown["usage"], MODEL_PRICE) - cost(shown["usage"], TIER_PRICE),
                                               abs=1e-9)
    results = ok(api.results(key, created["id"]))
    lines = results["data"] if "data" in results else results
    assert sorted(line["custom_id"] for line in lines) == [f"r{i}" for i in range(5)]
    assert all(line["response"]["status_code"] == 200 for line in lines)
    assert ProviderJob.of_batch(svc.table, created["id"])[0]["state"] == "done"


def test_a_part_under_the_tiers_minimum_runs_directly(svc, api, batches_sim):
    _, key = new_key(svc)
    created = api.created(key, [req("only", "one question")], execution="provider_batch")
    assert finish(svc, created["id"])["status"] == "completed"
    assert sim_jobs(batches_sim)["jobs"] == 0
    shown = ok(api("GET", f"/v1/batches/{created['id']}", key))
    assert shown["saved_usd"] == 0
    assert shown["cost_usd"] == pytest.approx(cost(shown["usage"], MODEL_PRICE), abs=1e-9)


def test_without_execution_the_models_default_direct_applies(svc, api, batches_sim):
    _, key = new_key(svc)
    created = api.created(key, [req(f"r{i}", "q") for i in range(3)])
    assert created["execution"] is None
    assert finish(svc, created["id"])["status"] == "completed"
    assert sim_jobs(batches_sim)["jobs"] == 0


@pytest.mark.parametrize("value", ["fast", 1, ""])
def test_an_unknown_execution_is_refused_naming_it(svc, api, value):
    settings(svc, message_batches_enabled=True)
    _, key = new_key(svc)
    error(api.create(key, [req("a")], execution=value), 400, "execution", param="execution")
    reply = api("POST", "/v1/messages/batches", key, json_body={"execution": value, "requests": [
        {"custom_id": "a", "params": {"model": "glm-5.3-flash", "max_tokens": 10,
                                      "messages": [{"role": "user", "content": "hi"}]}}]},
                headers={"anthropic-version": "2023-06-01"})
    anthropic_error(reply, 400, "invalid_request_error", "execution")


def test_an_estimate_prices_the_part_that_would_go_to_the_tier_at_its_price(svc, api):
    _, key = new_key(svc)
    body = {"requests": [req(f"e{i}", "the same question", max_tokens=100) for i in range(4)]}
    direct = ok(api("POST", "/v1/batches/estimate", key, json_body=body))["models"][0]
    tier = ok(api("POST", "/v1/batches/estimate", key, json_body={**body, "execution": "provider_batch"}))["models"][0]
    assert (direct["execution"], tier["execution"]) == ("direct", "provider_batch")
    assert tier["cost_usd"]["min"] == pytest.approx(direct["cost_usd"]["min"] / 2, abs=1e-12)
    assert tier["cost_usd"]["max"] == pytest.approx(direct["cost_usd"]["max"] / 2, abs=1e-12)
    # A high priority batch under `auto` runs directly, and so is it estimated.
    auto = ok(api("POST", "/v1/batches/estimate", key, json_body={**body, "execution": "auto", "priority": "high"}))
    assert auto["models"][0]["execution"] == "direct"


def test_embeddings_past_the_tiers_inputs_per_job_run_directly(svc, api, batches_sim, monkeypatch):
    """OpenAI's job takes at most 50,000 embedding inputs across its requests (lowered to 5 here): the requests
    that fit go to the job, in order; one that does not fit beside them runs directly; every one is answered."""
    from batchinfer.providers.batch_tiers import openai_batches

    monkeypatch.setattr(openai_batches, "MAX_EMBEDDING_INPUTS", 5)
    settings(svc, embeddings_responses_batches_enabled=True)
    _, key = new_key(svc)
    texts = {"e0": ["one", "two"], "e1": ["three", "four", "five"], "e2": ["six", "seven"], "e3": "eight"}
    created = api.created(key, [{"custom_id": custom_id, "url": "/v1/embeddings",
                                 "body": {"model": "glm-5.3-flash", "input": given}}
                                for custom_id, given in texts.items()], execution="provider_batch")
    assert finish(svc, created["id"])["status"] == "completed"
    assert sim_jobs(batches_sim)["jobs"] == 1 and sim_jobs(batches_sim)["lines"] == 2  # e0 and e1: 5 inputs
    stats = batches_sim.get("/_sim/stats").json()
    assert stats["by_path"].get("/v1/embeddings", 0) == 2  # e2 (2 more inputs) and e3 (1) ran directly
    results = ok(api.results(key, created["id"]))
    lines = {line["custom_id"]: line for line in (results["data"] if "data" in results else results)}
    assert {c: len(line["response"]["body"]["data"]) for c, line in lines.items()} == {"e0": 2, "e1": 3, "e2": 2,
                                                                                       "e3": 1}
