"""Anthropic Message Batches on the local stack, with the official `anthropic` SDK at its newest (2.x) and its
previous (1.x) major, each in its own interpreter: the specification's script, the everyday flows (errored
requests, cancel, delete, idempotency, paging), the results stream's bytes, and large results served from
storage through a redirect."""

from __future__ import annotations

import json
import os
import re
import subprocess
import time
from pathlib import Path

import anthropic
import httpx
import pytest

from batchinfer.service import accounts
from local.servers import UvicornThread, free_port
from tests.conftest import pinned
from tests.e2e.conftest import local_stack

pytestmark = pytest.mark.e2e
EXAMPLES = Path(__file__).with_name("spec_examples")
SDK_SCRIPTS = Path(__file__).with_name("sdk_scripts")
SPEC_BASE = "https://freeinference.org/anthropic"
ANTHROPIC_MAJORS = ("newest", "previous")  # not "openai1": that venv has no anthropic
PREFIXES = ("/anthropic", "")  # the base URL Anthropic clients are given, and the service's own
STREAMED_BYTES = 64 * 1024 * 1024  # results below this stream from the API; `redirecting` lowers it to 1 byte
V1, V2 = "2023-06-01", "2026-10-21"
MODEL = "glm-5.3-flash"


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    # One stack for the module: the stack's services are process-wide (use_services), so two cannot run at
    # once. `redirecting` switches it to sending every result stream through storage for one test.
    with local_stack(tmp_path_factory, message_batches_enabled=True,
                     export_redirect_bytes=STREAMED_BYTES) as running:
        yield running


@pytest.fixture
def redirecting(stack):
    """Every batch that ends meanwhile has its results written to S3 and served by a 302 to a presigned URL,
    as large ones are on AWS (export_redirect_bytes=1)."""
    svc = stack["svc"]
    before = svc.settings
    svc.settings = before.model_copy(update={"export_redirect_bytes": 1})
    yield stack
    svc.settings = before


def root(stack) -> str:
    """The stack's URL without /v1: what an Anthropic client's base_url starts with."""
    return stack["base"].removesuffix("/v1")


def fresh_key(stack) -> str:
    """A key of a new account with batch access: each test sees only its own Message Batches."""
    account = accounts.create_account(stack["svc"], tier="internal", batch_access=True, daily_quota_usd=1000.0)
    return accounts.create_key(stack["svc"], account["id"])


def sdk_env(home: Path, **extra: str) -> dict[str, str]:
    """An SDK script's environment: no PYTHONPATH (the SDK venvs need nothing of the service), none of the
    ANTHROPIC_* variables the SDK would also read, and a HOME of its own (2.x reads config files under it)."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH" and not k.startswith("ANTHROPIC_")}
    return {**env, "HOME": str(home), **extra}


class Started:
    """An SDK script running in the background in its major's interpreter (each takes seconds to import the SDK
    and wait for its batches, so the module starts them all at once and each test reads its own)."""

    def __init__(self, python: str, args: list[str], env: dict[str, str], cwd: Path, keys: dict[str, str]) -> None:
        self.keys = keys  # the key it runs under at each base URL
        self.proc = subprocess.Popen([python, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                     cwd=cwd, env=env)
        self.result: tuple[str, str] | None = None

    def stdout(self, timeout: float = 120) -> str:
        if self.result is None:
            try:
                self.result = self.proc.communicate(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.stop()
                raise AssertionError(f"{self.proc.args[1:]} did not finish within {timeout} s") from None
        out, err = self.result
        assert self.proc.returncode == 0, err
        return out

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.result = self.proc.communicate()


def http(stack, key: str, version: str = V2, prefix: str = "/anthropic") -> httpx.Client:
    """A raw client with the headers the SDK of that anthropic-version sends (2.x Bearer, 1.x X-Api-Key)."""
    auth = {"Authorization": f"Bearer {key}"} if version == V2 else {"X-Api-Key": key}
    return httpx.Client(base_url=root(stack) + prefix, headers={**auth, "anthropic-version": version}, timeout=30)


def wait_ended(client: anthropic.Anthropic, batch_id: str, timeout: float = 45):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        batch = client.messages.batches.retrieve(batch_id)
        if batch.processing_status == "ended":
            return batch
        time.sleep(0.2)
    raise AssertionError(f"{batch_id} did not end")


def request(custom_id: str, content: str = "Hello", model: str = MODEL, **extra) -> dict:
    return {"custom_id": custom_id,
            "params": {"model": model, "max_tokens": 64, "messages": [{"role": "user", "content": content}],
                       **extra}}


# --- SDK scripts, each major in its own interpreter ---------------------------------------------------

def spec_runs(stack, keys: dict[str, str]) -> str:
    """A program that runs the spec's script at each base URL (`prefix`) under that prefix's key, twice (as a
    user's retry of the whole script would run it), with only the base URL, the key and the 30 s poll changed,
    and prints {prefix: [first run's output, second run's output]}. One interpreter per major runs them all:
    importing the SDK takes seconds of CPU."""
    source = (EXAMPLES / "anthropic_message_batches_example.py").read_text()
    assert source.count(SPEC_BASE) == 1 and source.count("time.sleep(30)") == 1
    runs = [(prefix, key, source.replace(SPEC_BASE, root(stack) + prefix).replace("time.sleep(30)", "time.sleep(0.3)"))
            for prefix, key in keys.items()]
    return f"""import contextlib, io, json, os
outputs = {{}}
for prefix, key, script in {runs!r}:
    os.environ["FREEINFERENCE_API_KEY"] = key
    for _ in range(2):
        with contextlib.redirect_stdout(io.StringIO()) as out:
            exec(compile(script, "anthropic_message_batches_example.py", "exec"), {{"__name__": "__main__"}})
        outputs.setdefault(prefix, []).append(out.getvalue())
print(json.dumps(outputs))
"""


@pytest.fixture(scope="module")
def started(stack, sdk_python, tmp_path_factory):
    """The module's SDK programs, started at once (they spend their time importing the SDK and waiting for
    batches), each major in its own interpreter and each run under a key of its own account: the spec's script
    at both base URLs, and the flows script. A major whose venv is missing or stale fails its own tests with
    sdk_python's message, not the other major's."""
    runs: dict[tuple[str, str], Started | BaseException] = {}
    for major in ANTHROPIC_MAJORS:
        try:
            python = sdk_python(major)
        except pytest.fail.Exception as missing:
            runs["spec", major] = runs["flows", major] = missing
            continue
        home, keys = tmp_path_factory.mktemp("spec"), {prefix: fresh_key(stack) for prefix in PREFIXES}
        runs["spec", major] = Started(python, ["-c", spec_runs(stack, keys)], sdk_env(home), home, keys)
        home, key = tmp_path_factory.mktemp("flows"), fresh_key(stack)
        runs["flows", major] = Started(
            python, [str(SDK_SCRIPTS / "message_batches_flows.py")],
            sdk_env(home, FREEINFERENCE_API_KEY=key, FREEINFERENCE_ANTHROPIC_BASE_URL=root(stack) + "/anthropic"),
            home, {"/anthropic": key})

    def get(kind: str, major: str) -> Started:
        run = runs[kind, major]
        if isinstance(run, BaseException):
            raise run
        return run

    yield get
    for run in runs.values():
        if isinstance(run, Started):
            run.stop()


@pytest.mark.parametrize("prefix", PREFIXES, ids=["anthropic-base-url", "service-base-url"])
@pytest.mark.parametrize("sdk_major", ANTHROPIC_MAJORS)
def test_spec_anthropic_script_runs_unchanged(stack, started, sdk_major, prefix):
    """The spec's Anthropic SDK script (create with an Idempotency-Key, poll, print the counts, read the
    results), with only the base URL, the key and the poll interval changed, at both base URLs. Its second run
    prints the same: the Idempotency-Key gives back the same batch, so the account holds one Message Batch."""
    run = started("spec", sdk_major)
    first, second = json.loads(run.stdout())[prefix]
    lines = first.strip().splitlines()
    # `print(batch.request_counts)`: the SDK's repr, e.g. "MessageBatchRequestCounts(canceled=0, errored=0, ...)";
    # only its fields are checked.
    counts = re.fullmatch(r"\w+\((.*)\)", lines[0] if lines else "")
    assert counts, lines
    assert dict(re.findall(r"(\w+)=(\d+)", counts[1])) == {
        "processing": "0", "succeeded": "2", "errored": "0", "canceled": "0", "expired": "0"}, lines
    assert lines[1].startswith("q-0 Simulated answer from glm-5.3-flash to: Summarize the plot of Hamlet"), lines
    assert lines[2].startswith("q-1 Simulated answer from glm-5.3-flash to: Name three prime numbers."), lines
    assert len(lines) == 3, lines
    assert second == first  # the second run read the same, already ended batch
    with http(stack, run.keys[prefix], prefix=prefix) as raw:
        listed = raw.get("/v1/messages/batches").json()
    assert len(listed["data"]) == 1 and listed["has_more"] is False, listed  # one batch for both runs


@pytest.mark.parametrize("sdk_major", ANTHROPIC_MAJORS)
def test_sdk_flows(stack, started, sdk_major):
    """Per-request errors, results only once ended, cancel, delete, idempotent create and auto-paging, as the
    SDK of each major sees them (2.x at anthropic-version 2026-10-21, 1.x at 2023-06-01)."""
    seen = json.loads(started("flows", sdk_major).stdout())
    newest = sdk_major == "newest"
    assert seen["anthropic"].split(".")[0] == pinned(sdk_major)["anthropic"].split(".")[0], seen["anthropic"]
    assert seen["ended"] is True, seen

    # Created: every request processing, no results yet.
    processing = {"processing": 5, "succeeded": 0, "errored": 0, "canceled": 0, "expired": 0}
    assert seen["mixed_created"] == ["in_progress", processing, None], seen["mixed_created"]

    # Only the invalid requests errored, each with Anthropic's error type and a message naming the fault;
    # results come in submission order.
    results = {r["custom_id"]: r for r in seen["mixed_results"]}
    assert list(results) == ["ok-1", "unknown-model", "sampling", "thinking", "ok-2"]
    for ok, prompt in (("ok-1", "Summarize the plot of Hamlet"), ("ok-2", "Name three prime numbers.")):
        assert results[ok]["type"] == "succeeded" and results[ok]["model"] == MODEL, results[ok]
        assert results[ok]["text"].startswith(f"Simulated answer from {MODEL} to: {prompt}"), results[ok]
    assert results["unknown-model"] == {"custom_id": "unknown-model", "type": "errored",
                                        "error_type": "not_found_error", "message": "model: no-such-model"}
    assert results["thinking"]["type"] == "errored", results["thinking"]
    assert results["thinking"]["error_type"] == "invalid_request_error"
    assert results["thinking"]["message"].startswith("thinking"), results["thinking"]
    if newest:  # 2026-10-21 has no sampling parameters: that request errors, naming it
        assert results["sampling"] == {
            "custom_id": "sampling", "type": "errored", "error_type": "invalid_request_error",
            "message": "temperature: not a parameter of the Messages API at anthropic-version 2026-10-21."}
    else:  # 2023-06-01 has them: it runs
        assert results["sampling"]["type"] == "succeeded", results["sampling"]
    succeeded = 2 if newest else 3
    assert seen["mixed_counts"] == {"processing": 0, "succeeded": succeeded, "errored": 5 - succeeded,
                                    "canceled": 0, "expired": 0}
    assert seen["mixed_results_url"].startswith(root(stack) + "/anthropic/v1/messages/batches/msgbatch_")
    # The batch's tokens (an extension) are those of its succeeded results; its known cost is above 0.
    tokens = [r["tokens"] for r in results.values() if r["type"] == "succeeded"]
    usage, cost = seen["mixed_spend"]
    assert usage == {"input_tokens": sum(t[0] for t in tokens), "output_tokens": sum(t[1] for t in tokens),
                     "total_tokens": sum(map(sum, tokens))}, (usage, tokens)
    assert isinstance(cost, float) and cost > 0, cost

    # Before it has ended: results() raises without a second request (results_url is null), and delete is a
    # 400; cancel then makes it canceling, or ended if nothing of it was running.
    big = seen["big_total"]
    assert seen["big_before_cancel"] == ["in_progress", {**processing, "processing": big}, None]
    name, status, message = seen["results_before_end"]
    assert (name, status) == ("AnthropicError", None) and "results_url" in message, seen["results_before_end"]
    name, status, message = seen["delete_before_end"]
    assert (name, status) == ("BadRequestError", 400) and "has not ended" in message, seen["delete_before_end"]
    assert seen["big_after_cancel"][0] in ("canceling", "ended") and seen["big_after_cancel"][1] is True
    final = seen["big_final"]
    assert final["processing"] == 0 and final["errored"] == final["expired"] == 0, final
    assert final["succeeded"] + final["canceled"] == big, final  # the local stack is fast: canceled may be 0
    assert seen["big_result_ids"] == [f"big-{i}" for i in range(big)]
    types = seen["big_result_types"]
    assert types.count("succeeded") == final["succeeded"] and types.count("canceled") == final["canceled"]

    # One Idempotency-Key, the same body twice: one batch; a different body under it: 409.
    first, again = seen["idempotent_ids"]
    assert first == again and first.startswith("msgbatch_")
    assert seen["idempotent_conflict"][:2] == ["ConflictError", 409], seen["idempotent_conflict"]

    # Listing: newest first; limit=1 is honoured, and auto-paging ends having yielded every batch once.
    newest_first = seen["created_newest_first"]
    assert seen["first_page"] == [1, True]
    assert seen["listed_one_page"] == newest_first
    assert seen["listed_paged"] == newest_first

    # Deleting an ended batch: it then reads as not found, and is no longer listed.
    assert seen["deleted"] == [first, "message_batch_deleted"]
    assert seen["retrieve_deleted"][:2] == ["NotFoundError", 404], seen["retrieve_deleted"]
    assert seen["listed_paged_after_delete"] == newest_first[1:]


# --- The results stream's bytes -----------------------------------------------------------------------

@pytest.mark.parametrize(("version", "prefix"), [(V2, "/anthropic"), (V1, "")],
                         ids=["bearer-2026-10-21", "x-api-key-2023-06-01"])
def test_results_stream_is_lf_jsonl_in_submission_order(stack, version, prefix):
    """GET results_url as the SDK sends it (Accept: application/binary): application/x-jsonl, one LF-terminated
    line per request in submission order, no CR and no blank line (the SDK's line decoder breaks on both)."""
    ids = [f"r-{(i * 7) % 30:02d}" for i in range(30)]  # submission order is not sorted order
    requests = [request(c, f"Item {c}.") if i % 5 else request(c, model="no-such-model") for i, c in enumerate(ids)]
    with http(stack, fresh_key(stack), version, prefix) as raw:
        created = raw.post("/v1/messages/batches", json={"requests": requests})
        assert created.status_code == 200, created.text
        batch_id = created.json()["id"]
        deadline = time.monotonic() + 45
        while (batch := raw.get(f"/v1/messages/batches/{batch_id}").json())["processing_status"] != "ended":
            assert time.monotonic() < deadline, batch
            time.sleep(0.2)
        assert batch["results_url"] == f"{root(stack)}{prefix}/v1/messages/batches/{batch_id}/results"
        reply = raw.get(batch["results_url"], headers={"Accept": "application/binary"})
    assert reply.status_code == 200, reply.text
    assert reply.headers["content-type"].split(";")[0].strip() == "application/x-jsonl", reply.headers
    body = reply.content
    assert b"\r" not in body and b"\n\n" not in body and not body.startswith(b"\n"), body[:200]
    assert body.endswith(b"\n")
    lines = [json.loads(line) for line in body[:-1].split(b"\n")]
    assert [line["custom_id"] for line in lines] == ids
    assert [line["result"]["type"] for line in lines] == ["errored" if i % 5 == 0 else "succeeded"
                                                          for i in range(30)]
    assert batch["request_counts"] == {"processing": 0, "succeeded": 24, "errored": 6, "canceled": 0, "expired": 0}


# --- Large results: a redirect to storage ---------------------------------------------------------------

def test_large_results_come_from_storage_and_the_sdk_reads_them_all(redirecting):
    """Results written to S3 when the batch ended: results_url answers 302 to a presigned URL on another host,
    and the newest SDK's results() follows it and yields every entry, in submission order."""
    assert anthropic.__version__.split(".")[0] == pinned("newest")["anthropic"].split(".")[0]
    stack, key = redirecting, fresh_key(redirecting)
    client = anthropic.Anthropic(base_url=root(stack) + "/anthropic", api_key=key)
    total = 40
    batch = client.messages.batches.create(requests=[
        request(f"big-{i}", f"[[sim:big:3000]] Item {i}.", max_tokens=4096) for i in range(total)])
    ended = wait_ended(client, batch.id)
    assert ended.request_counts.succeeded == total
    with http(stack, key) as raw:
        reply = raw.get(ended.results_url, headers={"Accept": "application/binary"})
    assert reply.status_code == 302, reply.text
    location = httpx.URL(reply.headers["location"])
    assert (location.host, location.port) != (httpx.URL(root(stack)).host, httpx.URL(root(stack)).port), location
    entries = list(client.messages.batches.results(batch.id))
    assert [e.custom_id for e in entries] == [f"big-{i}" for i in range(total)]
    assert all(e.result.type == "succeeded" and len(e.result.message.content[0].text) > 2000 for e in entries)


def test_redirected_results_never_send_the_api_key_to_storage(redirecting, monkeypatch):
    """The newest SDK (2.x, `Authorization: Bearer`) follows the results redirect to storage on another host,
    and the key does not travel with it: the storage side sees no Authorization."""
    from starlette.applications import Starlette
    from starlette.responses import Response
    from starlette.routing import Route

    # The 1.x SDK sends the key as `X-Api-Key`, a custom header: httpx drops only Authorization on a redirect
    # to another origin and forwards custom headers, so 1.x sends its key to storage too; the README documents
    # this. It is not asserted here either way.
    stack, key = redirecting, fresh_key(redirecting)
    svc = stack["svc"]
    seen: list[dict] = []

    async def storage(request):  # stands in for S3: records what arrives, serves the object's bytes
        seen.append(dict(request.headers))
        return Response(svc.blobs.get(request.path_params["key"]), media_type="application/octet-stream")

    client = anthropic.Anthropic(base_url=root(stack) + "/anthropic", api_key=key)
    batch = client.messages.batches.create(requests=[request("a", "Hello."), request("b", "Again.")])
    wait_ended(client, batch.id)
    fake_s3 = UvicornThread(Starlette(routes=[Route("/{key:path}", storage)]), free_port()).start()
    try:
        monkeypatch.setattr(svc.blobs, "presigned_get",
                            lambda key, seconds=300: f"{fake_s3.url}/{key}?X-Amz-Signature=x")
        entries = list(client.messages.batches.results(batch.id))
    finally:
        fake_s3.stop()
    assert [(e.custom_id, e.result.type) for e in entries] == [("a", "succeeded"), ("b", "succeeded")]
    assert len(seen) == 1 and "authorization" not in seen[0], seen
    assert key not in json.dumps(seen), seen
