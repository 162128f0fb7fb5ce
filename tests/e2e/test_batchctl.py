"""The real `./batchctl` against a running local stack, on what looks like a fresh machine: no AWS_* variable
and an empty HOME (no ~/.aws). It needs no flags and no credentials, and every error is one line."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import httpx
import pytest

from batchinfer.api.app import create_app
from batchinfer.settings import Settings
from local.run import start
from local.servers import UvicornThread, free_port

pytestmark = pytest.mark.e2e
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    state = tmp_path_factory.mktemp("ctl-stack") / ".local"
    settings = Settings(table_name="e2e-ctl", bucket_name="e2e-ctl", stage="e2e-ctl")
    _, _, stop = start(settings, free_port(), free_port(), pollers=1, state_dir=state)
    api = UvicornThread(create_app(), free_port()).start()
    yield {"base": f"{api.url}/v1", "dir": state.parent}
    api.stop()
    stop()


@pytest.fixture(scope="module")
def fresh_env(tmp_path_factory) -> dict[str, str]:
    """This environment without AWS settings or credentials, and a HOME with nothing in it."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_") and k not in ("TABLE_NAME", "HOME")}
    return {**env, "HOME": str(tmp_path_factory.mktemp("empty-home"))}


def batchctl(cwd: Path, env: dict[str, str], *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([str(ROOT / "batchctl"), *args], capture_output=True, text=True, timeout=60, cwd=cwd,
                          env=env)


def one_line_error(out: subprocess.CompletedProcess) -> str:
    assert out.returncode != 0 and out.stdout == ""
    assert "Traceback" not in out.stderr
    lines = out.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("batchctl: "), out.stderr
    return lines[0]


def test_admin_works_with_no_aws_setup(stack, fresh_env):
    created = batchctl(stack["dir"], fresh_env, "admin", "create-account", "--tier", "pro")
    assert created.returncode == 0, created.stderr
    account = created.stdout.strip()
    assert account.startswith("acct_") and "\n" not in account

    made = batchctl(stack["dir"], fresh_env, "admin", "create-key", "--account", account)
    assert made.returncode == 0, made.stderr
    key = made.stdout.strip()
    assert key.startswith("hyi-") and "\n" not in key
    with httpx.Client(trust_env=False, timeout=10) as http:
        answer = http.get(f"{stack['base']}/batches", headers={"Authorization": f"Bearer {key}"})
    assert answer.status_code == 200, answer.text


def test_unknown_account_is_one_line(stack, fresh_env):
    line = one_line_error(batchctl(stack["dir"], fresh_env, "admin", "show", "--account", "acct_nonexistent"))
    assert "acct_nonexistent not found" in line


def test_local_stack_not_running_is_one_line(tmp_path, fresh_env):
    url = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    (tmp_path / ".local").mkdir()
    (tmp_path / ".local" / "stack.json").write_text(json.dumps({"aws_endpoint_url": url, "table_name": "gone"}))
    line = one_line_error(batchctl(tmp_path, fresh_env, "admin", "create-account", "--tier", "pro"))
    assert url in line and "not reachable" in line and "make run" in line


def test_no_stack_file_and_no_table_name_is_one_line(tmp_path, fresh_env):
    line = one_line_error(batchctl(tmp_path, fresh_env, "admin", "show", "--account", "acct_x"))
    assert "TABLE_NAME" in line and "make run" in line
