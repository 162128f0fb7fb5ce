"""Pause and resume (an extension) on the local stack through the official SDKs' `client.post(...)`: the
`openai` SDK on an inline batch at each of its majors, the `anthropic` SDK on a Message Batch at each of
its majors, each in its own interpreter (tests/e2e/sdk_scripts/pause_resume.py)."""

from __future__ import annotations

import datetime as dt
import json
import os
import subprocess
from pathlib import Path

import pytest

from batchinfer.api.app import create_app
from batchinfer.service import accounts
from batchinfer.settings import Settings
from local.run import start
from local.servers import UvicornThread, free_port
from local.simulated_backend import SimConfig
from tests.conftest import SDK_MAJORS, pinned

pytestmark = pytest.mark.e2e
SCRIPT = Path(__file__).with_name("sdk_scripts") / "pause_resume.py"
N = 120  # the script's batch: at 0.2 s a call and 16 slots, some 1.5 s of work, so the pause lands mid-way


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    state = tmp_path_factory.mktemp("stack") / ".local"
    settings = Settings(table_name="e2e", bucket_name="e2e", stage="e2e", message_batches_enabled=True)
    svc, key, stop = start(settings, free_port(), free_port(), sim_config=SimConfig(latency_seconds=0.2),
                           pollers=2, state_dir=state)
    api = UvicornThread(create_app(), free_port()).start()
    yield {"base": f"{api.url}/v1", "svc": svc}
    api.stop()
    stop()


def run(stack, sdk_python, sdk_major: str, sdk: str, cwd: Path) -> dict:
    """The script in the SDK major's interpreter, under a key of a new account; what it printed."""
    python = sdk_python(sdk_major)
    account = accounts.create_account(stack["svc"], tier="internal", batch_access=True, daily_quota_usd=1000.0)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH" and not k.startswith(("OPENAI_", "ANTHROPIC_"))}
    env.update(HOME=str(cwd), FREEINFERENCE_SDK=sdk, FREEINFERENCE_BASE_URL=stack["base"],
               FREEINFERENCE_API_KEY=accounts.create_key(stack["svc"], account["id"]))
    out = subprocess.run([python, str(SCRIPT)], capture_output=True, text=True, timeout=150, cwd=cwd, env=env)
    assert out.returncode == 0, out.stderr
    seen = json.loads(out.stdout)
    assert seen["version"].split(".")[0] == pinned(sdk_major)[sdk].split(".")[0], seen["version"]
    return seen


@pytest.mark.parametrize("sdk_major", SDK_MAJORS)
def test_openai_sdk_pauses_and_resumes_an_inline_batch(stack, tmp_path, sdk_python, sdk_major):
    seen = run(stack, sdk_python, sdk_major, "openai", tmp_path)
    status, paused_at = seen["paused"]
    assert status == "in_progress" and isinstance(paused_at, int), seen
    (first, done), second, still_paused_at = seen["while_paused"]
    assert second == [first, done] and 0 < done < N, seen  # paused mid-way: nothing started while paused
    assert still_paused_at == paused_at == seen["again"], seen  # pausing again changes nothing
    assert seen["resumed"] == ["in_progress", None], seen
    assert seen["final"] == ["completed", N, None], seen
    assert seen["refusals"] == {"ended": [409, "ConflictError"], "unknown": [404, "NotFoundError"]}, seen


@pytest.mark.parametrize("sdk_major", ("newest", "previous"))  # the openai1 venv has no anthropic
def test_anthropic_sdk_pauses_and_resumes_a_message_batch(stack, tmp_path, sdk_python, sdk_major):
    seen = run(stack, sdk_python, sdk_major, "anthropic", tmp_path)
    status, paused_at = seen["paused"]
    assert status == "in_progress" and paused_at.endswith("Z"), seen
    dt.datetime.strptime(paused_at, "%Y-%m-%dT%H:%M:%SZ")
    assert seen["while_paused"] == [["in_progress", 0], ["in_progress", 0], paused_at], seen
    assert seen["again"] == paused_at and seen["resumed"] == ["in_progress", None], seen
    assert seen["final"] == ["ended", N, None], seen
    assert seen["refusals"] == {"ended": [409, "ConflictError"], "unknown": [404, "NotFoundError"]}, seen
