"""Embeddings on a Titan text model's part of a batch go to Bedrock's batch inference as an InvokeModel job, one
record per text, through the real API handler, worker and sweeper: each answer lands as a direct InvokeModel
call's would (the same vectors, base64 when asked, the same usage) at the tier's price with what it saved; a
request of several texts, and a Cohere embed model's part, run directly; a record Bedrock refused fails with its
answer, one that failed there for a reason that may pass runs directly."""

from __future__ import annotations

import base64
import struct
from pathlib import Path

import pytest

from batchinfer.records.provider_jobs import ProviderJob
from local.simulated_answers import embedding_vector
from tests.faults.harness import Clock
from tests.helpers import bedrock_embedder, catalog_with, finish, new_key, ok, services_in_use

TITAN, COHERE = "titan-embed-bedrock", "cohere-embed-bedrock"
TITAN_ID = "amazon.titan-embed-text-v2:0"
MODEL_PRICE, TIER_PRICE = 0.20, 0.10  # USD per million input tokens
ROLE = "arn:aws:iam::123456789012:role/batchinfer-bedrock-batch"
TIER = {"price": {"input_per_mtok": TIER_PRICE}, "min_requests": 100, "poll_seconds": 1, "guard_seconds": 600}


@pytest.fixture
def catalog_file(tmp_path: Path) -> Path:
    """The default catalog plus a Titan text and a Cohere embed model on Bedrock, each with a batch tier."""
    price = {"input_per_mtok": MODEL_PRICE}
    return catalog_with(tmp_path, bedrock_embedder(TITAN, TITAN_ID, "titan", price=price, provider_batch=TIER),
                        bedrock_embedder(COHERE, "cohere.embed-english-v3", "cohere", price=price,
                                         provider_batch=TIER))


@pytest.fixture
def svc(svc, sim, sim_control, catalog_file):
    sim_control.post("/_sim/batches/reset")
    with services_in_use(svc, sim.url, "tierembed", models_file=str(catalog_file), bedrock_batch_role_arn=ROLE,
                         embeddings_responses_batches_enabled=True) as services:
        services.clock = Clock()
        yield services
    sim_control.post("/_sim/batches/reset")


def embedding(custom_id: str, text: str | list[str], model: str = TITAN, **body) -> dict:
    return {"custom_id": custom_id, "url": "/v1/embeddings", "body": {"model": model, "input": text, **body}}


def run(svc, api, key: str, lines: list[dict], execution: str) -> tuple[dict, dict]:
    created = api.created(key, lines, execution=execution)
    assert finish(svc, created["id"], clock_step=1)["status"] == "completed"
    shown = ok(api("GET", f"/v1/batches/{created['id']}", key))
    results = ok(api.results(key, created["id"], limit=1000))["data"]
    return shown, {r["custom_id"]: r for r in results}


def invoke_calls(sim_control) -> int:
    paths = sim_control.get("/_sim/stats").json()["by_path"]
    return sum(n for path, n in paths.items() if path.startswith("/model/") and path.endswith("/invoke"))


def tier_stats(sim_control) -> dict:
    return sim_control.get("/_sim/batches").json()["bedrock_jobs"]


def vectors(result: dict) -> list:
    return [item["embedding"] for item in result["response"]["body"]["data"]]


def test_a_titan_part_runs_as_an_invoke_model_job_with_a_direct_runs_vectors_at_the_tiers_price(
        svc, api, sim_control):
    _, key = new_key(svc)
    lines = [embedding(f"e-{i}", f"passage number {i}" if i % 2 else [f"passage number {i}"]) for i in range(100)]
    lines[7] = embedding("e-7", "packed passage", encoding_format="base64")
    lines[8] = embedding("e-8", "short passage", dimensions=256)
    several = [embedding(f"s-{i}", ["first text", f"second text {i}"]) for i in range(3)]
    direct, expected = run(svc, api, key, lines + several, "direct")
    assert invoke_calls(sim_control) == 100 + 6 and tier_stats(sim_control)["jobs"] == 0
    sim_control.post("/_sim/stats/reset")

    shown, results = run(svc, api, key, lines + several, "provider_batch")
    stats = tier_stats(sim_control)
    assert (stats["jobs"], stats["records"], stats["role_arns"], stats["invocation_types"]) == (
        1, 100, [ROLE], ["InvokeModel"])
    assert invoke_calls(sim_control) == 6  # only the requests of several texts ran directly, a call a text
    assert shown["request_counts"] == {"total": 103, "completed": 103, "failed": 0}
    for custom_id, result in results.items():  # the very answers a direct run gives
        body, direct_body = result["response"]["body"], expected[custom_id]["response"]["body"]
        assert result["response"]["status_code"] == 200
        assert body == {**direct_body, "model": TITAN}
    one = results["e-3"]["response"]["body"]
    assert one["data"] == [{"object": "embedding", "index": 0, "embedding": embedding_vector(TITAN_ID,
                                                                                             "passage number 3")}]
    assert one["usage"]["prompt_tokens"] > 0
    packed = base64.b64decode(vectors(results["e-7"])[0])
    assert list(struct.unpack(f"<{len(packed) // 4}f", packed)) == pytest.approx(
        embedding_vector(TITAN_ID, "packed passage"), abs=1e-6)
    assert len(vectors(results["s-0"])) == 2

    assert shown["usage"] == direct["usage"] and shown["usage"]["output_tokens"] == 0
    on_tier = sum(r["response"]["body"]["usage"]["prompt_tokens"] for c, r in results.items() if c.startswith("e-"))
    ran_direct = sum(r["response"]["body"]["usage"]["prompt_tokens"] for c, r in results.items()
                     if c.startswith("s-"))
    assert shown["cost_usd"] == pytest.approx((on_tier * TIER_PRICE + ran_direct * MODEL_PRICE) / 1e6, abs=1e-12)
    assert shown["saved_usd"] == pytest.approx(on_tier * (MODEL_PRICE - TIER_PRICE) / 1e6, abs=1e-12)
    assert direct["saved_usd"] == 0
    assert svc.blobs.keys("provider-jobs/") == []  # the job's input and output went with it


def test_record_errors_fail_with_bedrocks_answer_and_a_retryable_one_runs_directly(svc, api, sim_control):
    _, key = new_key(svc)
    lines = [embedding(f"e-{i}", f"passage {i}") for i in range(100)]
    lines[0] = embedding("e-0", "refused [[sim:400]]")
    lines[1] = embedding("e-1", "flaky [[sim:tier-500]]")
    lines[2] = embedding("e-2", "late [[sim:batch-expired]]")
    shown, results = run(svc, api, key, lines, "provider_batch")

    assert tier_stats(sim_control)["records"] == 100
    assert invoke_calls(sim_control) == 2  # the flaky and the late one, each once, directly
    assert {c: r["status"] for c, r in results.items() if r["status"] != "completed"} == {"e-0": "failed"}
    assert "Simulated batch line error 400" in str(results["e-0"]["error"])
    assert vectors(results["e-1"]) == [embedding_vector(TITAN_ID, "flaky [[sim:tier-500]]")]
    assert shown["request_counts"] == {"total": 100, "completed": 99, "failed": 1}


def test_a_cohere_embed_part_runs_directly(svc, api, sim_control):
    _, key = new_key(svc)
    shown, results = run(svc, api, key, [embedding(f"c-{i}", f"text {i}", model=COHERE) for i in range(100)],
                         "provider_batch")
    assert tier_stats(sim_control)["jobs"] == 0 and invoke_calls(sim_control) == 100
    assert ProviderJob.of_batch(svc.table, shown["id"]) == []
    assert shown["request_counts"]["completed"] == 100 and shown["saved_usd"] == 0


def test_an_estimate_prices_at_the_tiers_price_only_the_requests_a_job_would_carry(svc, api):
    _, key = new_key(svc)
    singles = [embedding(f"e-{i}", f"passage number {i}") for i in range(100)]
    several = [embedding(f"s-{i}", ["first text", f"second text {i}"]) for i in range(3)]

    def estimate(lines: list[dict], execution: str) -> dict:
        [model] = ok(api("POST", "/v1/batches/estimate", key,
                         json_body={"requests": lines, "execution": execution}))["models"]
        return model

    whole, rest = estimate(singles + several, "direct"), estimate(several, "direct")
    tier = estimate(singles + several, "provider_batch")
    assert (tier["execution"], tier["provider_batch_request_count"], tier["request_count"]) == (
        "provider_batch", 100, 103)
    assert (whole["execution"], whole["provider_batch_request_count"]) == ("direct", 0)
    assert tier["input_tokens"] == whole["input_tokens"]
    carried = whole["cost_usd"]["min"] - rest["cost_usd"]["min"]  # at the model's price
    assert tier["cost_usd"]["min"] == pytest.approx(carried * TIER_PRICE / MODEL_PRICE + rest["cost_usd"]["min"],
                                                    abs=1e-12)
    # Fewer requests a job would carry than Bedrock's 100 records: the whole part is estimated as it runs, directly.
    short = estimate(singles[:99] + several, "provider_batch")
    assert (short["execution"], short["provider_batch_request_count"]) == ("direct", 0)
