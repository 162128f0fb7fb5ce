"""Batches on a model's provider batch tier on the local stack, each flow as the README shows it, unchanged but
for `execution`: an inline batch over plain HTTP, a file batch with the official OpenAI SDK, and Message Batches
with the official Anthropic SDK (newest and previous major). The simulated backend serves OpenAI's Batches API
for `glm-5.3-flash` (the default catalog's tier; a Message Batch on it is translated, as it is when it runs
directly) and Anthropic's Message Batches for `claude-sim`, an `anthropic`-kind model with a tier added to the
default catalog. Each flow shows exact results and usage, `cost_usd` at the tier's price and `saved_usd`, and
the simulator shows one tier job holding exactly its requests; nothing in this module calls a model directly.
And `claude-bedrock`'s part runs on the simulated Bedrock batch inference, its input and output in the moto
server's bucket, as under `make run`, and so does an OpenAI SDK embeddings file batch on a Titan text model
(`titan-embed-bedrock`, added with a tier), as an InvokeModel job."""

from __future__ import annotations

import json
import time
from pathlib import Path

import httpx
import pytest

from batchinfer.api.app import create_app
from batchinfer.service import accounts
from batchinfer.settings import Settings
from local.run import LOCAL_BEDROCK_BATCH_ROLE, start
from local.servers import UvicornThread, free_port
from local.simulated_answers import build_anthropic, build_chat, embedding_vector, parse_chat
from local.simulated_backend import SimConfig
from tests.e2e.conftest import SdkRuns
from tests.helpers import bedrock_embedder, catalog_with

pytestmark = pytest.mark.e2e
SDK_SCRIPTS = Path(__file__).with_name("sdk_scripts")
ANTHROPIC_MAJORS = ("newest", "previous")  # openai1's venv has no anthropic
GLM, CLAUDE, TITAN = "glm-5.3-flash", "claude-sim", "titan-embed-bedrock"
TITAN_ID = "amazon.titan-embed-text-v2:0"
# USD per million input and output tokens: (the model's price, its tier's)
PRICES = {GLM: ((0.10, 0.40), (0.05, 0.20)), CLAUDE: ((3.0, 15.0), (1.5, 7.5)), TITAN: ((0.02, 0.0), (0.01, 0.0))}
ACCOUNT = {"tier": "internal", "daily_quota_usd": 1000.0}


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    state = tmp_path_factory.mktemp("tier-stack") / ".local"
    models_file = catalog_with(state.parent, {
        "id": CLAUDE, "backend": {"kind": "anthropic", "base_url": "${SIMULATED_BACKEND_URL}/v1"},
        "batch_budget": 4, "price": {"input_per_mtok": 3.0, "output_per_mtok": 15.0},
        "provider_batch": {"price": {"input_per_mtok": 1.5, "output_per_mtok": 7.5}, "min_requests": 2,
                           "poll_seconds": 1, "guard_seconds": 600}}, bedrock_embedder(
        TITAN, TITAN_ID, "titan", price={"input_per_mtok": 0.02},
        provider_batch={"price": {"input_per_mtok": 0.01}, "min_requests": 100, "poll_seconds": 1,
                        "guard_seconds": 600}))
    settings = Settings(table_name="e2e-tier", bucket_name="e2e-tier", stage="e2e-tier", file_batches_enabled=True,
                        message_batches_enabled=True, embeddings_responses_batches_enabled=True,
                        models_file=str(models_file),
                        bedrock_batch_role_arn=LOCAL_BEDROCK_BATCH_ROLE)
    sim_port = free_port()
    svc, _, stop = start(settings, free_port(), sim_port, SimConfig(), pollers=1, state_dir=state)
    api = UvicornThread(create_app(), free_port()).start()
    yield {"base": f"{api.url}/v1", "root": api.url, "svc": svc, "sim": f"http://127.0.0.1:{sim_port}",
           "bucket": settings.bucket_name}
    api.stop()
    stop()


@pytest.fixture(scope="module")
def runs(stack, sdk_python, tmp_path_factory):
    """The SDK flows, started at once and side by side, each as its own user."""
    folder = tmp_path_factory.mktemp("sdk")
    started = {
        "openai": SdkRuns(stack, sdk_python, SDK_SCRIPTS / "provider_batch_openai.py", ("newest",),
                          folder / "openai", **ACCOUNT),
        "embeddings": SdkRuns(stack, sdk_python, SDK_SCRIPTS / "provider_batch_openai_embeddings.py",
                              ("newest", "previous"), folder / "embeddings", **ACCOUNT,
                              extra={"TIER_MODEL": TITAN}),
        "anthropic": SdkRuns(stack, sdk_python, SDK_SCRIPTS / "provider_batch_anthropic.py", ANTHROPIC_MAJORS,
                             folder / "anthropic", **ACCOUNT,
                             extra=lambda major: {"TIER_MODELS": f"{GLM},{CLAUDE}", "TIER_TAG": major,
                                                  "FREEINFERENCE_ANTHROPIC_BASE_URL": f"{stack['root']}/anthropic"})}
    yield started
    for sdk_runs in started.values():
        sdk_runs.close()


def answer(model: str, content: str, **body) -> tuple[str, int, int]:
    """What the simulated model answers `content` on `model` (a chat completion on GLM, a message on CLAUDE):
    (text, input and output tokens), as it answers a direct call."""
    sent = {"model": model, "messages": [{"role": "user", "content": content}], **body}
    if model == CLAUDE:
        built = build_anthropic(parse_chat(sent, ("max_tokens",)), sent)
        return built["content"][0]["text"], built["usage"]["input_tokens"], built["usage"]["output_tokens"]
    built = build_chat(parse_chat(sent), sent)
    return built["choices"][0]["message"]["content"], built["usage"]["prompt_tokens"], \
        built["usage"]["completion_tokens"]


def spent(model: str, answers: list[tuple[str, int, int]]) -> tuple[list[int], float, float]:
    """The usage of these answers on `model`, their cost at its tier's price and what that saved."""
    tokens_in, tokens_out = sum(a[1] for a in answers), sum(a[2] for a in answers)
    (model_in, model_out), (tier_in, tier_out) = PRICES[model]
    at_tier = (tokens_in * tier_in + tokens_out * tier_out) / 1e6
    return [tokens_in, tokens_out], at_tier, (tokens_in * model_in + tokens_out * model_out) / 1e6 - at_tier


def tier_jobs(sim: str, contents: list[str]) -> list[tuple[str, list[str]]]:
    """The simulator's OpenAI Batches jobs that hold any of these prompts: (endpoint, every prompt the job held)."""
    found = []
    for job in httpx.get(f"{sim}/v1/batches", params={"limit": 100}).json()["data"]:
        text = httpx.get(f"{sim}/v1/files/{job['input_file_id']}/content").text
        held = sorted(message["content"] if isinstance(message["content"], str)
                      else " ".join(part["text"] for part in message["content"])
                      for line in map(json.loads, filter(str.strip, text.splitlines()))
                      for message in line["body"]["messages"])
        if set(held) & set(contents):
            found.append((job["endpoint"], held))
    return found


def message_batch_jobs(sim: str, texts: list[str]) -> list[list[str]]:
    """The simulator's ended Message Batches that answered any of these texts: every text each one answered."""
    found, version = [], {"anthropic-version": "2023-06-01"}
    for job in httpx.get(f"{sim}/v1/messages/batches", params={"limit": 100}, headers=version).json()["data"]:
        if job["processing_status"] != "ended":
            continue
        lines = httpx.get(job["results_url"], headers=version).text.splitlines()
        answered = sorted(block["text"] for entry in map(json.loads, lines) if entry["result"]["type"] == "succeeded"
                          for block in entry["result"]["message"]["content"])
        if set(answered) & set(texts):
            found.append(answered)
    return found


def bedrock_jobs(sim: str, model_id: str) -> list[dict]:
    """The simulated Bedrock's model invocation jobs of one model."""
    listed = httpx.get(f"{sim}/model-invocation-jobs", params={"maxResults": 1000}).json()
    return [job for job in listed["invocationJobSummaries"] if job["modelId"] == model_id]


def no_direct_calls(sim: str) -> None:
    """Nothing in this module has called a model directly (chat completions, messages, ... by path)."""
    assert httpx.get(f"{sim}/_sim/stats").json()["by_path"] == {}


def test_inline_batch_over_plain_http_runs_on_the_tier_at_its_price(stack, runs):
    # `runs`: the SDK flows start first, so their interpreters start up while this one runs.
    account = accounts.create_account(stack["svc"], batch_access=True, **ACCOUNT)
    auth = {"Authorization": f"Bearer {accounts.create_key(stack['svc'], account['id'])}"}
    contents = {"a": "Hi", "b": "Bye"}
    requests = [{"custom_id": custom_id, "body": {"model": GLM, "messages": [{"role": "user", "content": text}]}}
                for custom_id, text in contents.items()]
    with httpx.Client(base_url=stack["base"], headers=auth, timeout=30) as client:
        refused = client.post("/batches", json={"execution": "cheap", "requests": requests})
        assert refused.status_code == 400 and "execution" in refused.json()["error"]["message"], refused.text
        created = client.post("/batches", json={"execution": "provider_batch", "requests": requests})
        assert created.status_code == 200, created.text
        batch = created.json()
        assert batch["execution"] == "provider_batch", batch
        deadline = time.monotonic() + 60
        while batch["status"] not in ("completed", "failed", "expired", "cancelled") and time.monotonic() < deadline:
            time.sleep(0.5)
            batch = client.get(f"/batches/{batch['id']}").json()
        results = client.get(f"/batches/{batch['id']}/results", params={"limit": 100}).json()["data"]
        output = client.get(f"/batches/{batch['id']}/output.jsonl")

    assert batch["status"] == "completed" and batch["execution"] == "provider_batch", batch
    assert batch["request_counts"] == {"total": 2, "completed": 2, "failed": 0}, batch
    expected = {custom_id: answer(GLM, text) for custom_id, text in contents.items()}
    shown = {r["custom_id"]: r["response"]["body"]["choices"][0]["message"]["content"] for r in results}
    assert shown == {custom_id: text for custom_id, (text, _, _) in expected.items()}, results
    assert output.status_code == 200
    lines = [json.loads(line) for line in output.text.splitlines()]
    assert [(line["custom_id"], line["response"]["status_code"]) for line in lines] == [("a", 200), ("b", 200)]
    usage, cost_usd, saved_usd = spent(GLM, list(expected.values()))
    assert [batch["usage"]["input_tokens"], batch["usage"]["output_tokens"]] == usage, batch
    assert batch["cost_usd"] == pytest.approx(cost_usd, abs=1e-9), batch
    assert batch["saved_usd"] == pytest.approx(saved_usd, abs=1e-9), batch
    assert tier_jobs(stack["sim"], list(contents.values())) == [("/v1/chat/completions", sorted(contents.values()))]
    no_direct_calls(stack["sim"])


def test_openai_sdk_file_batch_runs_on_the_tier_at_its_price(stack, runs):
    seen = runs["openai"].result("newest")
    kind, status, message = seen["refused"]
    assert (kind, status) == ("BadRequestError", 400) and "execution" in message, seen
    assert seen["created_execution"] == "provider_batch", seen
    assert seen["status"] == "completed" and seen["counts"] == [4, 4, 0], seen
    assert seen["execution"] == "provider_batch", seen
    contents = [f"Tier question {i}." for i in range(4)]
    expected = [answer(GLM, content) for content in contents]
    assert seen["output"] == [[f"t-{i}", text] for i, (text, _, _) in enumerate(expected)], seen
    usage, cost_usd, saved_usd = spent(GLM, expected)
    assert seen["usage"] == usage, seen
    assert seen["cost_usd"] == pytest.approx(cost_usd, abs=1e-9), seen
    assert seen["saved_usd"] == pytest.approx(saved_usd, abs=1e-9), seen
    assert tier_jobs(stack["sim"], contents) == [("/v1/chat/completions", contents)]
    no_direct_calls(stack["sim"])


@pytest.mark.parametrize("model", [GLM, CLAUDE])
@pytest.mark.parametrize("major", ANTHROPIC_MAJORS)
def test_anthropic_sdk_message_batch_runs_on_the_tier_at_its_price(stack, runs, major, model):
    """On GLM (an `openai`-kind model) the Message Batch goes to OpenAI's Batches API translated; on CLAUDE
    (`anthropic`-kind) to Anthropic's Message Batches."""
    seen = runs["anthropic"].result(major)
    kind, status, message = seen["refused"]
    assert (kind, status) == ("BadRequestError", 400) and "execution" in message, seen
    assert seen["created_execution"][model] == "provider_batch", seen
    batch = seen["batches"][model]
    assert batch["status"] == "ended" and batch["counts"] == [0, 3, 0, 0, 0], batch
    assert batch["execution"] == "provider_batch", batch
    contents = [f"Message tier {i} ({major} {model})." for i in range(3)]
    expected = [answer(model, content, max_tokens=64) for content in contents]
    assert batch["results"] == [[f"m-{i}", "succeeded", text, "end_turn", tokens_in, tokens_out]
                                for i, (text, tokens_in, tokens_out) in enumerate(expected)], batch
    usage, cost_usd, saved_usd = spent(model, expected)
    assert batch["usage"] == usage, batch
    assert batch["cost_usd"] == pytest.approx(cost_usd, abs=1e-9), batch
    assert batch["saved_usd"] == pytest.approx(saved_usd, abs=1e-9), batch
    if model == GLM:
        assert tier_jobs(stack["sim"], contents) == [("/v1/chat/completions", contents)]
    else:
        assert message_batch_jobs(stack["sim"], [text for text, _, _ in expected]) == \
            [sorted(text for text, _, _ in expected)]
    no_direct_calls(stack["sim"])


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
    jobs = bedrock_jobs(stack["sim"], "us.anthropic.claude-haiku-4-5-20251001-v1:0")
    assert [(job["totalRecordCount"], job["roleArn"], job["modelInvocationType"]) for job in jobs] == [
        (100, LOCAL_BEDROCK_BATCH_ROLE, "Converse")], jobs
    paths = httpx.get(stack["sim"] + "/_sim/stats").json()["by_path"]
    assert not [p for p in paths if p.startswith("/model/")], paths  # nothing ran directly
    assert shown["saved_usd"] > 0 and shown["cost_usd"] == pytest.approx(shown["saved_usd"], abs=1e-9)


@pytest.mark.parametrize("major", ["newest", "previous"])
def test_openai_sdk_embeddings_file_batch_on_a_titan_model_runs_as_a_bedrock_job_at_its_price(stack, runs, major):
    """A Titan text model's embeddings go to Bedrock's batch inference as an InvokeModel job, one record per
    text, over the moto server's bucket; each vector is the one a direct call gets."""
    seen = runs["embeddings"].result(major)
    assert seen["created_execution"] == "provider_batch", seen
    assert seen["status"] == "completed" and seen["counts"] == [100, 100, 0], seen
    assert seen["execution"] == "provider_batch", seen
    for i in range(100):
        assert seen["output"][f"e-{i}"][0] == [embedding_vector(TITAN_ID, f"Passage {i} to index.")], i
    tokens = sum(tokens for _, tokens in seen["output"].values())
    assert seen["usage"] == [tokens, 0] and tokens > 0, seen
    (model_price, _), (tier_price, _) = PRICES[TITAN]
    assert seen["cost_usd"] == pytest.approx(tokens * tier_price / 1e6, abs=1e-12), seen
    assert seen["saved_usd"] == pytest.approx(tokens * (model_price - tier_price) / 1e6, abs=1e-12), seen
    jobs = bedrock_jobs(stack["sim"], TITAN_ID)
    assert jobs and all((job["modelInvocationType"], job["totalRecordCount"], job["status"]) ==
                        ("InvokeModel", 100, "Completed") for job in jobs), jobs
    no_direct_calls(stack["sim"])
