"""A batch's priority (an extension beyond the OpenAI and Anthropic APIs) with the official SDKs on the local
stack, each major in its own interpreter: `extra_body={"priority": ...}` on create, `client.post(...)` for the
priority route, the refusals as the SDKs raise them. The backend answers in 1 s, so a 40-request batch still runs
when its priority changes."""

from __future__ import annotations

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
SDK_SCRIPTS = Path(__file__).with_name("sdk_scripts")
ANTHROPIC_MAJORS = ("newest", "previous")  # openai1's venv has no anthropic
ALLOWED = "'high', 'normal' or 'low'"


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    state = tmp_path_factory.mktemp("priority-stack") / ".local"
    settings = Settings(table_name="e2e-priority", bucket_name="e2e-priority", stage="e2e-priority",
                        file_batches_enabled=True, message_batches_enabled=True)
    svc, _, stop = start(settings, free_port(), free_port(), SimConfig(latency_seconds=1.0), pollers=2,
                         state_dir=state)
    api = UvicornThread(create_app(), free_port()).start()
    yield {"base": f"{api.url}/v1", "root": api.url, "svc": svc}
    api.stop()
    stop()


def run_script(stack, python: str, script: str, cwd: Path, **env: str) -> dict:
    account = accounts.create_account(stack["svc"], tier="internal", batch_access=True, daily_quota_usd=1000.0)
    key = accounts.create_key(stack["svc"], account["id"])
    environment = {k: v for k, v in os.environ.items()
                   if k != "PYTHONPATH" and not k.startswith(("OPENAI_", "ANTHROPIC_"))}
    out = subprocess.run([python, str(SDK_SCRIPTS / script)], capture_output=True, text=True, timeout=180, cwd=cwd,
                         env={**environment, "HOME": str(cwd), "FREEINFERENCE_API_KEY": key, **env})
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


@pytest.mark.parametrize("sdk_major", SDK_MAJORS)
def test_openai_sdk_sets_and_changes_a_batchs_priority(stack, tmp_path, sdk_python, sdk_major):
    seen = run_script(stack, sdk_python(sdk_major), "priority_openai.py", tmp_path,
                      FREEINFERENCE_BASE_URL=stack["base"])
    assert seen["openai"].split(".")[0] == pinned(sdk_major)["openai"].split(".")[0], seen["openai"]
    kind, status, message = seen["refused"]
    assert (kind, status) == ("BadRequestError", 400) and "priority" in message and ALLOWED in message, seen
    assert seen["created"] == seen["retrieved"] == "high", seen
    assert seen["changed"][:3] == ["Batch", True, "low"] and seen["changed"][3] in ("validating", "in_progress"), seen
    kind, status, message = seen["change_refused"]
    assert (kind, status) == ("BadRequestError", 400) and "priority: " in message and ALLOWED in message
    kind, status, message = seen["after_end"]
    assert (kind, status) == ("ConflictError", 409) and "has ended" in message, seen
    assert seen["ended_priority"] == "low", seen


@pytest.mark.parametrize("sdk_major", ANTHROPIC_MAJORS)
def test_anthropic_sdk_sets_and_changes_a_message_batchs_priority(stack, tmp_path, sdk_python, sdk_major):
    seen = run_script(stack, sdk_python(sdk_major), "priority_anthropic.py", tmp_path,
                      FREEINFERENCE_ANTHROPIC_BASE_URL=stack["root"] + "/anthropic")
    assert seen["anthropic"].split(".")[0] == pinned(sdk_major)["anthropic"].split(".")[0], seen["anthropic"]
    kind, status, message = seen["refused"]
    assert (kind, status) == ("BadRequestError", 400) and "priority" in message and ALLOWED in message, seen
    assert seen["created"] == seen["retrieved"] == "high", seen
    assert seen["changed"] == ["MessageBatch", True, "low", "in_progress"], seen
    kind, status, message = seen["after_end"]
    assert (kind, status) == ("ConflictError", 409) and "has ended" in message, seen
