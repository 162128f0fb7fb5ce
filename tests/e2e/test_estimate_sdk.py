"""Estimates before running (an extension) on the local stack through the official SDKs at each major, each
in its own interpreter: `client.post` to the estimate routes of both APIs, their refusals in each SDK's error
class, and `admission: reject_if_late` (`extra_body`) refused once (the SDK does not retry it) and admitted."""

from __future__ import annotations

import json
import subprocess

import pytest

from batchinfer.records import Budget
from batchinfer.service import accounts
from tests.conftest import SDK_MAJORS
from tests.e2e.conftest import local_stack
from tests.e2e.test_message_batches_sdk import SDK_SCRIPTS, sdk_env

pytestmark = pytest.mark.e2e
SLOW = "qwen3.6-35b"  # its calls are noted as taking an hour: 500 requests over 16 slots pass 24 h


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    with local_stack(tmp_path_factory, message_batches_enabled=True, file_batches_enabled=True) as running:
        Budget.note_latency(running["svc"].table, SLOW, 3600.0, running["svc"].now())
        yield running


@pytest.mark.parametrize("sdk_major", SDK_MAJORS)
def test_estimates_through_each_sdk(stack, sdk_python, sdk_major, tmp_path):
    svc = stack["svc"]
    account = accounts.create_account(svc, tier="pro", batch_access=True)
    key = accounts.create_key(svc, account["id"])
    env = sdk_env(tmp_path, FREEINFERENCE_BASE_URL=stack["base"], FREEINFERENCE_API_KEY=key, SLOW_MODEL=SLOW,
                  LATE_REQUESTS="500")
    if sdk_major != "openai1":  # that interpreter has only openai
        env["FREEINFERENCE_ANTHROPIC_BASE_URL"] = stack["base"].removesuffix("/v1") + "/anthropic"
    run = subprocess.run([sdk_python(sdk_major), str(SDK_SCRIPTS / "estimate.py")], capture_output=True,
                         text=True, timeout=240, cwd=tmp_path, env=env)
    assert run.returncode == 0, run.stderr
    seen = json.loads(run.stdout)
    # "tiktoken is great!" is 6 o200k_base tokens, "hello world" 2; each request adds 7 (OpenAI's chat rule).
    assert seen["estimate"] == ["batch.estimate", 2, 13 + 9, 30, "o200k_base", True, ["glm-5.3-flash"]], seen
    assert seen["estimate_refused"] == [400, "requests[0]"], seen
    # One request sent, no retry: the refusal says x-should-retry false.
    assert seen["late"] == [429, "batch_would_be_late", "false", True, 1], seen
    assert seen["admitted"] == ["batch", True], seen
    if sdk_major == "openai1":
        return
    assert seen["message_estimate"] == ["batch.estimate", 2, 10, ["bad"]], seen
    assert seen["message_refused"] == [400, True], seen
    assert seen["message_batches"] == 0, seen  # estimates store nothing
