"""A batch's spending cap on the local stack through the official SDKs at each major (`extra_body`), each
in its own interpreter: an OpenAI file batch and an Anthropic Message Batch stop at their cap, shown on the
SDKs' batch objects, with what they spent never past it."""

from __future__ import annotations

import json
import subprocess

import pytest

from batchinfer.service import accounts
from tests.conftest import SDK_MAJORS
from tests.e2e.conftest import local_stack
from tests.e2e.test_message_batches_sdk import SDK_SCRIPTS, sdk_env

pytestmark = pytest.mark.e2e
MODEL = "glm-5.3-flash"


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    with local_stack(tmp_path_factory, message_batches_enabled=True, file_batches_enabled=True) as running:
        yield running


def worst_case(svc) -> float:
    """One request's worst case as the cap counts it (its line's bytes as input, max_tokens 5 as output)."""
    line = json.dumps({"custom_id": "q-00", "body": {"model": MODEL, "max_tokens": 5, "messages": [
        {"role": "user", "content": "Question 00?"}]}}, separators=(",", ":"))
    return svc.catalog.get(MODEL).cost_usd(len(line) + 1, 5)


@pytest.mark.parametrize("sdk_major", SDK_MAJORS)
def test_the_cap_through_each_sdk(stack, sdk_python, sdk_major, tmp_path):
    svc = stack["svc"]
    account = accounts.create_account(svc, tier="internal", batch_access=True, daily_quota_usd=1000.0)
    key = accounts.create_key(svc, account["id"])
    cap = 3.5 * worst_case(svc)
    env = sdk_env(tmp_path, FREEINFERENCE_BASE_URL=stack["base"], FREEINFERENCE_API_KEY=key, CAP_USD=repr(cap))
    if sdk_major != "openai1":  # that interpreter has only openai
        env["FREEINFERENCE_ANTHROPIC_BASE_URL"] = stack["base"].removesuffix("/v1") + "/anthropic"
    run = subprocess.run([sdk_python(sdk_major), str(SDK_SCRIPTS / "spending_cap.py")], capture_output=True,
                         text=True, timeout=240, cwd=tmp_path, env=env)
    assert run.returncode == 0, run.stderr
    seen = json.loads(run.stdout)
    assert seen["refused"] == [400, "max_cost_usd"], seen
    assert seen["created_cap"] == pytest.approx(cap)
    batch = seen["batch"]
    assert batch["status"] == "cancelled" and batch["error"]["code"] == "max_cost_reached", batch
    assert batch["cap"] == pytest.approx(cap) and 0 < batch["cost_usd"] <= cap, batch
    assert 3 < batch["completed"] < batch["total"] == 30 and batch["failed"] == 0, batch
    assert seen["error_lines"] == ["batch_cancelled"], seen  # the error file: the requests it never started
    if sdk_major == "openai1":
        return
    assert seen["message_refused"] == [400, True], seen
    message_batch = seen["message_batch"]
    assert message_batch["status"] == "ended" and message_batch["error"]["code"] == "max_cost_reached"
    assert 0 < message_batch["cost_usd"] <= cap and message_batch["cap"] == pytest.approx(cap), message_batch
    counts = message_batch["counts"]
    assert counts["canceled"] > 0 and counts["succeeded"] > 3 and counts["errored"] == 0, counts
    assert seen["message_results"] == ["canceled", "succeeded"]
