"""A file batch on a model's provider batch tier with the official OpenAI SDK on the local stack (the simulated
backend serves OpenAI's Batches API for `glm-5.3-flash`): unchanged but for `extra_body={"execution": ...}`,
with exact results, usage, `cost_usd` at the tier's price and `saved_usd`."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import httpx
import pytest

from batchinfer.api.app import create_app
from batchinfer.service import accounts
from batchinfer.settings import Settings
from local.run import start
from local.servers import UvicornThread, free_port
from local.simulated_backend import SimConfig

pytestmark = pytest.mark.e2e
SDK_SCRIPTS = Path(__file__).with_name("sdk_scripts")


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    state = tmp_path_factory.mktemp("tier-stack") / ".local"
    settings = Settings(table_name="e2e-tier", bucket_name="e2e-tier", stage="e2e-tier", file_batches_enabled=True)
    sim_port = free_port()
    svc, _, stop = start(settings, free_port(), sim_port, SimConfig(), pollers=1, state_dir=state)
    api = UvicornThread(create_app(), free_port()).start()
    yield {"base": f"{api.url}/v1", "svc": svc, "sim": f"http://127.0.0.1:{sim_port}"}
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
