"""The local stack as `make run` starts it, used as a user would: curl, requests, batchctl."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
import requests

from batchinfer.api.app import create_app
from batchinfer.settings import Settings
from local.run import start
from local.servers import UvicornThread, free_port
from tests.conftest import SDK_MAJORS, pinned

pytestmark = pytest.mark.e2e
EXAMPLES = Path(__file__).with_name("spec_examples")
SDK_SCRIPTS = Path(__file__).with_name("sdk_scripts")
ROOT = Path(__file__).resolve().parents[2]
SPEC_BASE = "https://freeinference.org/v1"


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    state = tmp_path_factory.mktemp("stack") / ".local"
    # Every export goes through S3 and a presigned redirect, as large ones do on AWS.
    settings = Settings(table_name="e2e", bucket_name="e2e", stage="e2e", export_redirect_bytes=1,
                        file_batches_enabled=True)
    svc, key, stop = start(settings, free_port(), free_port(), pollers=2, state_dir=state)
    api = UvicornThread(create_app(), free_port()).start()
    yield {"base": f"{api.url}/v1", "key": key, "svc": svc, "dir": state.parent}
    api.stop()
    stop()


def session_for(stack) -> requests.Session:
    s = requests.Session()
    s.headers["Authorization"] = f"Bearer {stack['key']}"
    return s


def wait_final(s: requests.Session, base: str, batch_id: str, timeout: float = 60) -> dict:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        batch = s.get(f"{base}/batches/{batch_id}").json()
        if batch["status"] in ("completed", "failed", "expired", "cancelled"):
            return batch
        time.sleep(0.2)
    raise AssertionError(f"{batch_id} did not finish")


def test_spec_curl_create_example(stack):
    script = (EXAMPLES / "create_batch_curl.sh").read_text().replace(SPEC_BASE, stack["base"])
    out = subprocess.run(["bash", "-c", script], capture_output=True, text=True, timeout=60,
                         env={**os.environ, "FREEINFERENCE_API_KEY": stack["key"]})
    batch = json.loads(out.stdout)
    assert batch["object"] == "batch" and batch["request_counts"]["total"] == 2
    assert batch["metadata"] == {"project": "eval-42"}
    final = wait_final(session_for(stack), stack["base"], batch["id"])
    assert final["status"] == "completed" and final["request_counts"] == {"total": 2, "completed": 2, "failed": 0}
    # The same call again (same Idempotency-Key, same body) gives the same batch back.
    again = json.loads(subprocess.run(["bash", "-c", script], capture_output=True, text=True, timeout=60,
                                      env={**os.environ, "FREEINFERENCE_API_KEY": stack["key"]}).stdout)
    assert again["id"] == batch["id"]


def test_spec_python_example_runs_unchanged(stack):
    """The spec's Python example; only the base URL, the key and the poll interval (30 s there) change."""
    source = (EXAMPLES / "inline_python_example.py").read_text()
    assert SPEC_BASE in source and "time.sleep(30)" in source
    script = source.replace(SPEC_BASE, stack["base"]).replace("time.sleep(30)", "time.sleep(0.3)")
    out = subprocess.run([sys.executable, "-c", script], capture_output=True,
                         text=True, timeout=120, env={**os.environ, "FREEINFERENCE_API_KEY": stack["key"]})
    assert out.returncode == 0, out.stderr
    lines = out.stdout.strip().splitlines()
    assert len(lines) == 2
    assert lines[0].startswith("q-0 Simulated answer from glm-5.3-flash to: Summarize the plot of Hamlet")
    assert lines[1].startswith("q-1 Simulated answer from glm-5.3-flash to: Name three prime numbers.")


def sdk_env(stack) -> dict[str, str]:
    """The environment of an SDK script: the stack's base URL and key, and no PYTHONPATH (the SDK venvs need
    nothing of the service)."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    return {**env, "FREEINFERENCE_BASE_URL": stack["base"], "FREEINFERENCE_API_KEY": stack["key"]}


@pytest.mark.parametrize("sdk_major", SDK_MAJORS)
def test_spec_openai_file_script_runs_unchanged(stack, tmp_path, sdk_python, sdk_major):
    """The spec's OpenAI SDK script (upload, create from the file, poll, read both result files), with the
    official `openai` SDK at its newest and its previous major; only the base URL, the key and the poll interval
    change."""
    python = sdk_python(sdk_major)
    source = (EXAMPLES / "file_openai_example.py").read_text()
    assert SPEC_BASE in source and "time.sleep(30)" in source
    script = source.replace(SPEC_BASE, stack["base"]).replace("time.sleep(30)", "time.sleep(0.3)")
    out = subprocess.run([python, "-c", script], capture_output=True, text=True, timeout=120,
                         cwd=tmp_path, env=sdk_env(stack))
    assert out.returncode == 0, out.stderr
    lines = out.stdout.strip().splitlines()
    # `print(batch.status, batch.request_counts)`: the counts' repr is the SDK's, e.g.
    # "BatchRequestCounts(completed=2, failed=0, total=2)"; only its fields are checked.
    first = re.fullmatch(r"(\w+) \w*\((.*)\)", lines[0] if lines else "")
    assert first and first[1] == "completed", lines
    assert dict(re.findall(r"(\w+)=(\d+)", first[2])) == {"completed": "2", "failed": "0", "total": "2"}, lines
    assert lines[1].startswith("q-0 Simulated answer from glm-5.3-flash to: Summarize the plot of Hamlet")
    assert lines[2].startswith("q-1 Simulated answer from glm-5.3-flash to: Name three prime numbers.")
    assert len(lines) == 3  # no error file: everything succeeded


@pytest.mark.parametrize("sdk_major", SDK_MAJORS)
def test_openai_sdk_pages_files_and_batches_one_item_at_a_time(stack, tmp_path, sdk_python, sdk_major):
    """`for f in client.files.list(limit=1)` and `for b in client.batches.list(limit=1)` (the SDK follows
    `after=<last id>` until `has_more` is false) end, and yield every item of the one-page listing once, in its
    order, with the SDK at its newest and its previous major."""
    python = sdk_python(sdk_major)
    out = subprocess.run([python, str(SDK_SCRIPTS / "list_paging.py")], capture_output=True, text=True,
                         timeout=120, cwd=tmp_path, env=sdk_env(stack))
    assert out.returncode == 0, out.stderr
    seen = json.loads(out.stdout)
    assert seen["openai"].split(".")[0] == pinned(sdk_major)["openai"].split(".")[0], seen["openai"]
    assert all(b and b[0] == "completed" and b[1] for b in seen["batches"].values()), seen["batches"]
    for kind, own in (("files", seen["uploads"] + [b[1] for b in seen["batches"].values()]),
                      ("batches", list(seen["batches"]))):
        one_page, paged = seen[f"{kind}_one_page"], seen[f"{kind}_paged"]
        assert seen[f"{kind}_one_page_has_more"] is False
        assert set(own) <= set(one_page) and len(set(one_page)) == len(one_page), (kind, own, one_page)
        assert seen[f"{kind}_first_page"] == [1, True], kind  # limit=1 is honoured: one item, more to come
        assert paged == one_page, (kind, paged, one_page)  # ends, every item once, nothing skipped


@pytest.mark.parametrize("sdk_major", SDK_MAJORS)
def test_openai_sdk_reads_the_batch_model(stack, tmp_path, sdk_python, sdk_major):
    """`batch.model` through the SDK: the file's one model (an alias named by its catalog id) once validated,
    null before and for an inline batch over two models; openai 1.x keeps it as an extra field."""
    python = sdk_python(sdk_major)
    out = subprocess.run([python, str(SDK_SCRIPTS / "batch_model.py")], capture_output=True, text=True,
                         timeout=120, cwd=tmp_path, env=sdk_env(stack))
    assert out.returncode == 0, out.stderr
    seen = json.loads(out.stdout)
    assert seen["openai"].split(".")[0] == pinned(sdk_major)["openai"].split(".")[0], seen["openai"]
    assert seen["modelled"] is (sdk_major != "openai1"), seen
    assert seen["created"] is None and seen["file"] == ["completed", "glm-5.3-flash"], seen
    assert seen["mixed"] is None, seen


def test_cancel_delete_and_idempotency_flows(stack):
    s, base = session_for(stack), stack["base"]
    body = {"requests": [{"custom_id": f"c-{i}", "body": {"model": "qwen-35b", "messages": [
        {"role": "user", "content": f"count {i}"}]}} for i in range(300)]}
    created = s.post(f"{base}/batches", json=body, headers={"Idempotency-Key": "flow-1"})
    assert created.status_code == 200
    batch_id = created.json()["id"]
    assert s.post(f"{base}/batches", json={**body, "metadata": {"x": "y"}},
                  headers={"Idempotency-Key": "flow-1"}).status_code == 409
    cancelled = s.post(f"{base}/batches/{batch_id}/cancel")
    assert cancelled.status_code == 200 and cancelled.json()["status"] in ("cancelling", "cancelled")
    final = wait_final(s, base, batch_id)
    assert final["status"] == "cancelled"
    counts = final["request_counts"]
    lines = [json.loads(x) for x in s.get(f"{base}/batches/{batch_id}/output.jsonl").text.splitlines()]
    assert [x["custom_id"] for x in lines] == [f"c-{i}" for i in range(300)]
    page = s.get(f"{base}/batches/{batch_id}/results", params={"limit": 1000}).json()["data"]
    statuses = [r["status"] for r in page]
    assert statuses.count("completed") == counts["completed"] and statuses.count("failed") == counts["failed"]
    assert statuses.count("cancelled") == 300 - counts["completed"] - counts["failed"] > 0
    deleted = s.delete(f"{base}/batches/{batch_id}")
    assert deleted.json() == {"id": batch_id, "object": "batch.deleted", "deleted": True}
    assert s.get(f"{base}/batches/{batch_id}").status_code == 404
    assert s.post(f"{base}/batches", json=body, headers={"Idempotency-Key": "flow-1"}).status_code == 410


def test_batchctl_admin_against_running_stack(stack):
    def batchctl(*args: str) -> str:
        out = subprocess.run([str(ROOT / "batchctl"), *args], capture_output=True, text=True, timeout=60,
                             cwd=stack["dir"])
        assert out.returncode == 0, out.stderr
        return out.stdout.strip()

    account = batchctl("admin", "create-account", "--tier", "pro")
    assert account.startswith("acct_") and "\n" not in account
    key = batchctl("admin", "create-key", "--account", account)
    assert key.startswith("hyi-") and "\n" not in key
    s = requests.Session()
    s.headers["X-API-Key"] = key
    body = {"requests": [{"custom_id": "a", "body": {"model": "glm-5.3-flash",
                                                     "messages": [{"role": "user", "content": "hi"}]}}]}
    assert s.post(f"{stack['base']}/batches", json=body).status_code == 403  # pro has no batch access by default
    batchctl("admin", "set", "--account", account, "--batch-access", "true")
    assert s.post(f"{stack['base']}/batches", json=body).status_code == 200
    batchctl("admin", "revoke-key", key)
    assert s.get(f"{stack['base']}/batches").status_code == 401


def test_redirected_downloads_never_send_the_api_key_to_storage(stack, monkeypatch):
    """A file download is a 302 to a short-lived storage URL (as every large one is on AWS). The official SDK
    follows it, and the service's key must not travel with it: the storage side sees no Authorization."""
    from openai import OpenAI
    from starlette.applications import Starlette
    from starlette.responses import Response
    from starlette.routing import Route

    seen: list[dict] = []

    async def storage(request):  # stands in for S3: records what arrives, serves the object's bytes
        seen.append(dict(request.headers))
        return Response(svc.blobs.get(request.path_params["key"]), media_type="application/octet-stream")

    svc = stack["svc"]
    fake_s3 = UvicornThread(Starlette(routes=[Route("/{key:path}", storage)]), free_port()).start()
    try:
        monkeypatch.setattr(svc.blobs, "presigned_get",
                            lambda key, seconds=300: f"{fake_s3.url}/{key}?X-Amz-Signature=x")
        client = OpenAI(base_url=stack["base"], api_key=stack["key"])
        data = b'{"custom_id": "a", "method": "POST", "url": "/v1/chat/completions", "body": {"model": "glm-5.3-flash"'
        data += b', "messages": [{"role": "user", "content": "hi"}]}}\n'
        uploaded = client.files.create(file=("in.jsonl", data, "application/jsonl"), purpose="batch")
        assert client.files.content(uploaded.id).content == data
    finally:
        fake_s3.stop()
    assert len(seen) == 1 and "authorization" not in seen[0] and "x-api-key" not in seen[0], seen
