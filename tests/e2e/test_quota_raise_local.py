"""On the local stack as `make run` starts it: a batch paused on a used-up daily quota goes on within 10 s of
`./batchctl admin set --account A --daily-quota-usd 100`, not at 00:00 UTC; and `batchctl submit --max-cost`
sends the batch's spending cap."""

from __future__ import annotations

import json
import os
import time

import httpx
import pytest

from batchinfer.api.app import create_app
from batchinfer.settings import Settings
from local.run import start
from local.servers import UvicornThread, free_port
from tests.e2e.test_batchctl import batchctl

pytestmark = pytest.mark.e2e
MODEL = "glm-5.3-flash"
RAISE_TAKES_EFFECT_SECONDS = 10  # in `make run`; 60 deployed (the dispatcher's next claim, every few seconds)


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    state = tmp_path_factory.mktemp("quota-stack") / ".local"
    settings = Settings(table_name="e2e-quota", bucket_name="e2e-quota", stage="e2e-quota")
    port = free_port()
    _, key, stop = start(settings, free_port(), free_port(), pollers=1, state_dir=state,
                         api_url=f"http://127.0.0.1:{port}/v1")
    api = UvicornThread(create_app(), port).start()
    yield {"base": f"{api.url}/v1", "dir": state.parent}
    api.stop()
    stop()


@pytest.fixture(scope="module")
def fresh_env(tmp_path_factory) -> dict[str, str]:
    """As test_batchctl's: no AWS settings or credentials, an empty HOME (batchctl needs neither)."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("AWS_", "BATCH_API_")) and k not in ("TABLE_NAME", "HOME")}
    return {**env, "HOME": str(tmp_path_factory.mktemp("empty-home"))}


def _ok(run) -> str:
    assert run.returncode == 0, run.stderr
    return run.stdout.strip()


def test_a_quota_raise_through_the_admin_cli_lets_the_paused_batch_finish_at_once(stack, fresh_env):
    # A quota of some fifteen of these requests: the batch uses it up itself and pauses.
    account = _ok(batchctl(stack["dir"], fresh_env, "admin", "create-account", "--tier", "pro",
                           "--batch-access", "true", "--daily-quota-usd", "0.0001"))
    key = _ok(batchctl(stack["dir"], fresh_env, "admin", "create-key", "--account", account))
    requests = [{"custom_id": f"q-{i:02d}", "body": {"model": MODEL, "max_tokens": 16, "messages": [
        {"role": "user", "content": f"Question {i:02d}?"}]}} for i in range(60)]
    with httpx.Client(base_url=stack["base"], headers={"Authorization": f"Bearer {key}"}, trust_env=False,
                      timeout=30) as http:
        created = http.post("/batches", json={"requests": requests})
        assert created.status_code == 200, created.text
        batch = created.json()

        def shown() -> dict:
            return http.get(f"/batches/{batch['id']}").json()

        deadline, last, still_since = time.monotonic() + 60, None, time.monotonic()
        while time.monotonic() < deadline:  # paused: nothing moves for 3 s, and it has not ended
            now = shown()
            assert now["status"] not in ("completed", "failed", "cancelled", "expired"), now
            if now["request_counts"] != last:
                last, still_since = now["request_counts"], time.monotonic()
            elif time.monotonic() - still_since >= 3:
                break
            time.sleep(0.2)
        assert 0 < last["completed"] < 60, last
        raised_at = time.monotonic()
        _ok(batchctl(stack["dir"], fresh_env, "admin", "set", "--account", account, "--daily-quota-usd", "100"))
        while (now := shown())["status"] != "completed":
            assert time.monotonic() - raised_at < RAISE_TAKES_EFFECT_SECONDS, now
            time.sleep(0.2)
        assert now["request_counts"] == {"total": 60, "completed": 60, "failed": 0}
        print(f"paused at {last['completed']}/60; completed {time.monotonic() - raised_at:.1f} s after the raise")


def test_submit_max_cost_sends_the_spending_cap(stack, fresh_env, tmp_path):
    account = _ok(batchctl(stack["dir"], fresh_env, "admin", "create-account", "--tier", "pro",
                           "--batch-access", "true"))
    key = _ok(batchctl(stack["dir"], fresh_env, "admin", "create-key", "--account", account))
    source = tmp_path / "prompts.txt"
    source.write_text("".join(f"Question {i}?\n" for i in range(3)))
    env = {**fresh_env, "FREEINFERENCE_API_KEY": key}
    run = batchctl(stack["dir"], env, "submit", str(source), "--model", MODEL, "--max-cost", "2.50", "--json",
                   "--api-key", key)
    batch = json.loads(_ok(run))
    assert batch["max_cost_usd"] == 2.5, batch
    refused = batchctl(stack["dir"], env, "submit", str(source), "--model", MODEL, "--max-cost", "0")
    assert refused.returncode != 0 and "--max-cost" in refused.stderr
