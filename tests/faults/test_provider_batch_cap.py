"""A spending cap on a batch whose part goes to a provider's batch tier: the job's worst case is committed at
the tier's price before the provider's job is made (a cap that holds it at the tier's price but not at the
model's still sends the part there); a job that does not fit runs directly, claim by claim; what the job did
not spend comes back, so in the end the batch has committed exactly what it spent, never past its cap."""

from __future__ import annotations

import json

import pytest

from batchinfer.operations.openai import batches
from batchinfer.records import Batch
from batchinfer.records.provider_jobs import ProviderJob
from batchinfer.service.accounts import authenticate
from batchinfer.service.offloading import jobs
from local.lambda_runtime import invoke
from tests.faults.harness import get_batch, pump, sim_stats
from tests.helpers import chat_request, new_key
from tests.invariants import assert_ledger_consistent

TIER, DIRECT = (0.05, 0.20), (0.10, 0.40)


@pytest.fixture
def tier_sim(sim_control):
    sim_control.post("/_sim/batches/reset")
    yield sim_control
    sim_control.post("/_sim/batches/reset")


def create(svc, who, requests: list[dict]) -> str:
    body = {"requests": requests, "execution": "provider_batch", "max_cost_usd": 1000.0}
    obj, created = batches.create_batch(svc, who, json.dumps(body).encode(), None)
    assert created and obj["execution"] == "provider_batch"
    return obj["id"]


def worst(svc, batch_id: str, price: tuple[float, float]) -> float:
    """The part's worst case at `price`: each line's bytes as input, its max_tokens as output."""
    batch = get_batch(svc, batch_id)
    entries = jobs._Entries(svc, batch)
    return sum((entries.entry(i).length * price[0] + entries.entry(i).output_bound * price[1]) / 1e6
               for i in range(int(batch["total"])))


def capped_at(svc, batch_id: str, cap: float) -> None:
    Batch.set_cap(svc.table, batch_id, cap)


def questions(prefix: str, n: int, *extra: str) -> list[dict]:
    texts = [f"{prefix} {i}" for i in range(n)] + list(extra)
    return [chat_request(f"{prefix}-{i}", text, max_tokens=200) for i, text in enumerate(texts)]


def test_a_cap_that_holds_the_jobs_worst_case_at_the_tiers_price_sends_the_part_there(svc, tier_sim):
    _, key = new_key(svc)
    who = authenticate(svc, key)
    requests = questions("fit", 4)
    batch_id = create(svc, who, requests)
    at_tier, at_model = worst(svc, batch_id, TIER), worst(svc, batch_id, DIRECT)
    assert at_model == pytest.approx(2 * at_tier)
    capped_at(svc, batch_id, 1.5 * at_tier)  # the part fits at the tier's price, not at the model's
    # The provider's job does not finish until the commitment is checked: however slow a sweep, none of its
    # answers lands (and gives back what it did not spend) before then.
    assert tier_sim.put("/_sim/batches/config", json={"turnaround_seconds": 3600}).status_code == 200
    for _ in range(10):
        invoke("sweeper", {})
        [job] = ProviderJob.of_batch(svc.table, batch_id)
        if job["state"] == "running":
            break
    assert job["state"] == "running"
    assert job["committed_usd"] == pytest.approx(at_tier)
    assert float(get_batch(svc, batch_id)["committed_usd"]) == pytest.approx(at_tier)  # before it is submitted
    assert tier_sim.put("/_sim/batches/config", json={"turnaround_seconds": 0}).status_code == 200
    final = pump(svc, batch_id)

    assert final["status"] == "completed" and final["completed"] == 4
    assert tier_sim.get("/_sim/batches").json()["jobs"] == 1
    assert sim_stats(tier_sim)["by_path"].get("/v1/chat/completions", 0) == 0
    shown = batches.batch_object(final)
    assert shown["cost_usd"] <= 1.5 * at_tier
    assert float(final["committed_usd"]) == pytest.approx(shown["cost_usd"], abs=1e-12)  # the rest came back
    assert_ledger_consistent(svc, batch_id, who, [r["custom_id"] for r in requests])


def test_a_job_whose_worst_case_does_not_fit_runs_directly_claim_by_claim(svc, tier_sim):
    _, key = new_key(svc)
    who = authenticate(svc, key)
    requests = questions("tight", 4)
    batch_id = create(svc, who, requests)
    capped_at(svc, batch_id, 0.6 * worst(svc, batch_id, TIER))  # one request at a time fits, at the model's price
    final = pump(svc, batch_id)

    assert final["status"] == "completed" and final["completed"] == 4
    assert tier_sim.get("/_sim/batches").json()["jobs"] == 0
    assert sim_stats(tier_sim)["by_path"].get("/v1/chat/completions", 0) == 4
    shown = batches.batch_object(final)
    assert shown["saved_usd"] == 0
    assert float(final["committed_usd"]) == pytest.approx(shown["cost_usd"], abs=1e-12)
    assert_ledger_consistent(svc, batch_id, who, [r["custom_id"] for r in requests])


def test_a_request_handed_back_from_a_capped_job_runs_directly_under_the_cap(svc, tier_sim):
    _, key = new_key(svc)
    who = authenticate(svc, key)
    requests = questions("back", 3, "flaky [[sim:tier-500]]", "late [[sim:batch-expired]]")
    batch_id = create(svc, who, requests)
    cap = 2 * worst(svc, batch_id, DIRECT)
    capped_at(svc, batch_id, cap)
    final = pump(svc, batch_id)

    assert final["status"] == "completed" and final["completed"] == 5
    assert tier_sim.get("/_sim/batches").json()["jobs"] == 1
    assert sim_stats(tier_sim)["by_path"].get("/v1/chat/completions", 0) == 2
    shown = batches.batch_object(final)
    assert 0 < shown["cost_usd"] <= cap and shown["saved_usd"] > 0
    assert float(final["committed_usd"]) == pytest.approx(shown["cost_usd"], abs=1e-12)
    assert_ledger_consistent(svc, batch_id, who, [r["custom_id"] for r in requests])
