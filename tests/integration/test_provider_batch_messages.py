"""Message Batches (Anthropic's API) on provider batch tiers, through the real API handler and the real worker
and sweeper: an anthropic-kind model's part runs on Anthropic's Message Batches, an openai-kind model's part on
OpenAI's Batch API translated as a direct run translates it. Results are exactly a direct run's, with usage,
`cost_usd` at the tier's price and `saved_usd`; a line the provider refused fails with its answer, one it
could not run runs directly; a worker dying after the create makes no second job; a cancel keeps what the
provider finished."""

from __future__ import annotations

from pathlib import Path

import pytest

from batchinfer.records.provider_jobs import ProviderJob
from tests.helpers import (
    catalog_with,
    finish,
    new_key,
    ok,
    services_in_use,
    step_by_record,
    worker_dies_before_recording_the_job,
)
from tests.integration.test_message_batches import Messages

CLAUDE = "claude-sim"  # an anthropic-kind model with a tier, on the simulator's Messages and Message Batches
GLM = "glm-5.3-flash"  # an openai-kind model with a tier (the default catalog's)
PRICE = {CLAUDE: ((3.0, 15.0), (1.5, 7.5)), GLM: ((0.10, 0.40), (0.05, 0.20))}  # (model's, tier's)


@pytest.fixture
def catalog_file(tmp_path: Path, sim) -> Path:
    return catalog_with(tmp_path, {
        "id": CLAUDE, "backend": {"kind": "anthropic", "base_url": "${SIMULATED_BACKEND_URL}/v1",
                                  "api_key_env": "CLAUDE_SIM_KEY"},
        "batch_budget": 4, "price": {"input_per_mtok": 3.0, "output_per_mtok": 15.0},
        "provider_batch": {"price": {"input_per_mtok": 1.5, "output_per_mtok": 7.5}, "min_requests": 2,
                           "poll_seconds": 1, "guard_seconds": 600}})


@pytest.fixture
def svc(svc, sim, sim_control, catalog_file):
    sim_control.post("/_sim/batches/reset")
    with services_in_use(svc, sim.url, "tiermsg", models_file=str(catalog_file),
                         message_batches_enabled=True) as services:
        yield services
    sim_control.post("/_sim/batches/reset")


@pytest.fixture
def messages(api, svc) -> Messages:
    _, key = new_key(svc)
    return Messages(api, key)


def entries(model: str, texts: list[str]) -> list[dict]:
    return [{"custom_id": f"m-{n}", "params": {"model": model, "max_tokens": 32, "stop_sequences": ["zz"],
                                               "messages": [{"role": "user", "content": text}]}}
            for n, text in enumerate(texts)]


def run(svc, messages: Messages, requests: list[dict], execution: str) -> tuple[dict, dict]:
    created = ok(messages("POST", json_body={"requests": requests, "execution": execution}))
    assert created["execution"] == execution
    finish(svc, created["id"])
    shown = ok(messages("GET", f"/{created['id']}"))
    return shown, {line["custom_id"]: line["result"] for line in messages.results(created["id"])}


def cost(usage: dict, price: tuple[float, float]) -> float:
    return (usage["input_tokens"] * price[0] + usage["output_tokens"] * price[1]) / 1e6


def tier_stats(sim_control) -> dict:
    return sim_control.get("/_sim/batches").json()


def direct_calls(sim_control, path: str) -> int:
    return sim_control.get("/_sim/stats").json()["by_path"].get(path, 0)


@pytest.mark.parametrize(("model", "tier_path", "direct_path"), [
    (CLAUDE, "message_batches", "/v1/messages"),  # Anthropic's Message Batches
    (GLM, "jobs", "/v1/chat/completions"),  # OpenAI's Batch API, each request translated to a chat completion
])
def test_a_message_batch_runs_on_its_models_tier_with_a_direct_runs_results_at_the_tiers_price(
        svc, messages, sim_control, model, tier_path, direct_path):
    requests = entries(model, [f"question {n}" for n in range(4)])
    direct, expected = run(svc, messages, requests, "direct")
    assert direct_calls(sim_control, direct_path) == 4
    sim_control.post("/_sim/stats/reset")

    shown, results = run(svc, messages, requests, "provider_batch")
    stats = tier_stats(sim_control)
    made = stats["message_batches"] if tier_path == "message_batches" else stats
    assert made["jobs"] == 1 and made["lines"] == 4 and direct_calls(sim_control, direct_path) == 0
    assert results == expected  # the very messages a direct run gives (ids, model, stop reasons, usage)
    assert shown["processing_status"] == "ended"
    assert shown["request_counts"] == {"processing": 0, "succeeded": 4, "errored": 0, "canceled": 0, "expired": 0}
    assert shown["usage"]["input_tokens"] == direct["usage"]["input_tokens"] > 0
    assert shown["usage"]["output_tokens"] == direct["usage"]["output_tokens"] > 0
    model_price, tier_price = PRICE[model]
    assert shown["cost_usd"] == pytest.approx(cost(shown["usage"], tier_price), abs=1e-9)
    assert shown["saved_usd"] == pytest.approx(cost(shown["usage"], model_price) - shown["cost_usd"], abs=1e-9)
    assert direct["cost_usd"] == pytest.approx(cost(direct["usage"], model_price), abs=1e-9)


def test_a_line_refused_by_anthropics_tier_fails_with_its_answer_and_one_it_could_not_run_runs_directly(
        svc, messages, sim_control):
    requests = entries(CLAUDE, ["fine", "refused [[sim:400]]", "flaky [[sim:tier-500]]",
                                "late [[sim:batch-expired]]"])
    shown, results = run(svc, messages, requests, "provider_batch")

    assert tier_stats(sim_control)["message_batches"]["jobs"] == 1
    assert direct_calls(sim_control, "/v1/messages") == 2  # the flaky and the late one, each once, directly
    assert {c: r["type"] for c, r in results.items()} == {"m-0": "succeeded", "m-1": "errored",
                                                          "m-2": "succeeded", "m-3": "succeeded"}
    assert results["m-1"]["error"]["error"] == {"type": "invalid_request_error",
                                                "message": "Simulated batch line error 400"}
    model_price, tier_price = PRICE[CLAUDE]
    on_tier, ran_directly = results["m-0"]["message"]["usage"], [results[c]["message"]["usage"] for c in ("m-2", "m-3")]
    assert shown["cost_usd"] == pytest.approx(cost(on_tier, tier_price) + sum(cost(u, model_price)
                                                                              for u in ran_directly), abs=1e-9)
    assert shown["saved_usd"] == pytest.approx(cost(on_tier, model_price) - cost(on_tier, tier_price), abs=1e-9)


@pytest.mark.background_failures
def test_a_worker_dying_after_anthropics_job_was_made_makes_no_second_one(svc, messages, sim_control, monkeypatch):
    died = worker_dies_before_recording_the_job(monkeypatch)
    shown, results = run(svc, messages, entries(CLAUDE, [f"die {n}" for n in range(3)]), "provider_batch")

    assert died and shown["request_counts"]["succeeded"] == 3
    assert tier_stats(sim_control)["message_batches"]["jobs"] == 1  # found again, not made twice
    assert direct_calls(sim_control, "/v1/messages") == 0
    assert all(r["type"] == "succeeded" for r in results.values())


def test_a_cancel_during_anthropics_job_cancels_it_there_and_keeps_what_it_finished(svc, messages, sim_control):
    assert sim_control.put("/_sim/batches/config", json={"never_finish": True,
                                                          "answered_before_cancel": 1}).status_code == 200
    created = ok(messages("POST", json_body={"requests": entries(CLAUDE, [f"c {n}" for n in range(3)]),
                                             "execution": "provider_batch"}))
    for _ in range(10):
        step_by_record(svc)
        job = ProviderJob.of_batch(svc.table, created["id"])[0]
        if job["state"] == "running":
            break
    assert job["state"] == "running"
    assert ok(messages("POST", f"/{created['id']}/cancel"))["processing_status"] == "canceling"
    finish(svc, created["id"])
    shown = ok(messages("GET", f"/{created['id']}"))

    assert tier_stats(sim_control)["message_batches"]["cancels"] == 1
    assert direct_calls(sim_control, "/v1/messages") == 0
    assert shown["request_counts"] == {"processing": 0, "succeeded": 1, "errored": 0, "canceled": 2, "expired": 0}
