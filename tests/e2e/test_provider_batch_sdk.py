"""A file batch on a model's provider batch tier with the official OpenAI SDK on the local stack (the simulated
backend serves OpenAI's Batches API for `glm-5.3-flash`): unchanged but for `extra_body={"execution": ...}`,
with exact results, usage, `cost_usd` at the tier's price and `saved_usd`. And `claude-bedrock`'s part on the
simulated Bedrock batch inference, its input and output in the moto server's bucket, as under `make run`."""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

import httpx
import pytest

from batchinfer.api.app import create_app
from batchinfer.service import accounts
from batchinfer.settings import Settings
from local.run import LOCAL_BEDROCK_BATCH_ROLE, start
from local.servers import UvicornThread, free_port
from local.simulated_backend import SimConfig

pytestmark = pytest.mark.e2e
SDK_SCRIPTS = Path(__file__).with_name("sdk_scripts")


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    state = tmp_path_factory.mktemp("tier-stack") / ".local"
    settings = Settings(table_name="e2e-tier", bucket_name="e2e-tier", stage="e2e-tier", file_batches_enabled=True,
                        bedrock_batch_role_arn=LOCAL_BEDROCK_BATCH_ROLE)
    sim_port = free_port()
    svc, _, stop = start(settings, free_port(), sim_port, SimConfig(), pollers=1, state_dir=state)
    api = UvicornThread(create_app(), free_port()).start()
    yield {"base": f"{api.url}/v1", "svc": svc, "sim": f"http://127.0.0.1:{sim_port}", "bucket": settings.bucket_name}
    api.stop()
    stop()


def test_openai_sdk_file_batch_runs_on_the_tier_at_its_price(stack, tmp_path, sdk_python):
    account = accounts.create_account(stack["svc"], tier="internal", batch_access=True, daily_quota_usd=1000.0)
    key = accounts.create_key(stack["svc"], account["id"])
    environment = {k: v for k, v in os.environ.items()
                   if k != "PYTHONPATH" and not k.startswith(("OPENAI_", "ANTHROPIC_"))}
    out = subprocess.run([sdk_python("newest"), str(SDK_SCRIPTS / "provider_batch_openai.py")], capture_output=True,
                         text=True, timeout=180, cwd=tmp_path,
                         env={**environment, "HOME": str(tmp_path), "FREEINFERENCE_API_KEY": key,
                              "FREEINFERENCE_BASE_URL": stack["base"]})
    assert out.returncode == 0, out.stderr
    seen = json.loads(out.stdout)
    kind, status, message = seen["refused"]
    assert (kind, status) == ("BadRequestError", 400) and "execution" in message, seen
    assert seen["created_execution"] == "provider_batch", seen
    assert seen["status"] == "completed" and seen["counts"] == [4, 4, 0], seen
    assert seen["output"] == [f"t-{i}" for i in range(4)], seen
    tokens_in, tokens_out = seen["usage"]
    assert seen["cost_usd"] == pytest.approx((tokens_in * 0.05 + tokens_out * 0.20) / 1e6, abs=1e-9), seen
    assert seen["saved_usd"] == pytest.approx((tokens_in * 0.05 + tokens_out * 0.20) / 1e6, abs=1e-9), seen
    jobs = httpx.get(stack["sim"] + "/_sim/batches").json()
    assert jobs["jobs"] == 1 and jobs["lines"] == 4, jobs
    assert httpx.get(stack["sim"] + "/_sim/stats").json()["by_path"].get("/v1/chat/completions", 0) == 0


def test_a_bedrock_models_part_runs_as_a_model_invocation_job_over_the_moto_bucket(stack):
    account = accounts.create_account(stack["svc"], tier="internal", batch_access=True, daily_quota_usd=1000.0)
    key = accounts.create_key(stack["svc"], account["id"])
    requests = [{"custom_id": f"b-{i}", "method": "POST", "url": "/v1/chat/completions",
                 "body": {"model": "claude-bedrock", "max_tokens": 16,
                          "messages": [{"role": "user", "content": f"question {i}"}]}} for i in range(100)]
    with httpx.Client(base_url=stack["base"], headers={"Authorization": f"Bearer {key}"}, timeout=30) as api:
        created = api.post("/batches", json={"requests": requests, "execution": "provider_batch"})
        assert created.status_code == 200, created.text
        batch_id = created.json()["id"]
        deadline = time.monotonic() + 120
        while (shown := api.get(f"/batches/{batch_id}").json())["status"] not in ("completed", "failed"):
            assert time.monotonic() < deadline, shown
            time.sleep(0.5)
        results = api.get(f"/batches/{batch_id}/results", params={"limit": 1000}).json()["data"]
    assert shown["status"] == "completed" and shown["request_counts"]["completed"] == 100, shown
    assert sorted(r["custom_id"] for r in results) == sorted(f"b-{i}" for i in range(100))
    jobs = httpx.get(stack["sim"] + "/_sim/batches").json()["bedrock_jobs"]
    assert (jobs["jobs"], jobs["records"], jobs["role_arns"]) == (1, 100, [LOCAL_BEDROCK_BATCH_ROLE]), jobs
    paths = httpx.get(stack["sim"] + "/_sim/stats").json()["by_path"]
    assert not [p for p in paths if p.startswith("/model/")], paths  # nothing ran directly
    assert shown["saved_usd"] > 0 and shown["cost_usd"] == pytest.approx(shown["saved_usd"], abs=1e-9)
