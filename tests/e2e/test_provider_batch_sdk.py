"""Batches on a model's provider batch tier on the local stack (the simulated backend serves OpenAI's Batches
API for `glm-5.3-flash`), each flow as the README shows it, unchanged but for `execution`: an inline batch over
plain HTTP, a file batch with the official OpenAI SDK, and a Message Batch with the official Anthropic SDK
(newest and previous major; translated to OpenAI's tier, as it is when it runs directly). Each shows exact
results and usage, `cost_usd` at the tier's price and `saved_usd`, and the simulator shows one tier job holding
exactly its requests; nothing in this module calls the model directly."""

from __future__ import annotations

import json
import time
from pathlib import Path

import httpx
import pytest

from batchinfer.api.app import create_app
from batchinfer.service import accounts
from batchinfer.settings import Settings
from local.run import start
from local.servers import UvicornThread, free_port
from local.simulated_answers import build_chat, parse_chat
from local.simulated_backend import SimConfig
from tests.e2e.conftest import SdkRuns

pytestmark = pytest.mark.e2e
SDK_SCRIPTS = Path(__file__).with_name("sdk_scripts")
ANTHROPIC_MAJORS = ("newest", "previous")  # openai1's venv has no anthropic
MODEL = "glm-5.3-flash"
MODEL_PRICE, TIER_PRICE = (0.10, 0.40), (0.05, 0.20)  # USD per million input and output tokens (default catalog)
ACCOUNT = {"tier": "internal", "daily_quota_usd": 1000.0}


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    state = tmp_path_factory.mktemp("tier-stack") / ".local"
    settings = Settings(table_name="e2e-tier", bucket_name="e2e-tier", stage="e2e-tier", file_batches_enabled=True,
                        message_batches_enabled=True)
    sim_port = free_port()
    svc, _, stop = start(settings, free_port(), sim_port, SimConfig(), pollers=1, state_dir=state)
    api = UvicornThread(create_app(), free_port()).start()
    yield {"base": f"{api.url}/v1", "root": api.url, "svc": svc, "sim": f"http://127.0.0.1:{sim_port}"}
    api.stop()
    stop()


@pytest.fixture(scope="module")
def runs(stack, sdk_python, tmp_path_factory):
    """The SDK flows, started at once and side by side, each as its own user."""
    folder = tmp_path_factory.mktemp("sdk")
    started = {
        "openai": SdkRuns(stack, sdk_python, SDK_SCRIPTS / "provider_batch_openai.py", ("newest",),
                          folder / "openai", **ACCOUNT),
        "anthropic": SdkRuns(stack, sdk_python, SDK_SCRIPTS / "provider_batch_anthropic.py", ANTHROPIC_MAJORS,
                             folder / "anthropic", extra=lambda major: {"TIER_MODEL": MODEL, "TIER_TAG": major,
                                                   "FREEINFERENCE_ANTHROPIC_BASE_URL": f"{stack['root']}/anthropic"},
                             **ACCOUNT)}
    yield started
    for sdk_runs in started.values():
        sdk_runs.close()


def answer(content: str, **body) -> tuple[str, int, int]:
    """What the simulated model answers a chat completion of `content` on MODEL: (text, input and output
    tokens), as it answers a direct call."""
    sent = {"model": MODEL, "messages": [{"role": "user", "content": content}], **body}
    built = build_chat(parse_chat(sent), sent)
    return built["choices"][0]["message"]["content"], built["usage"]["prompt_tokens"], \
        built["usage"]["completion_tokens"]


def cost(tokens_in: int, tokens_out: int, price: tuple[float, float]) -> float:
    return (tokens_in * price[0] + tokens_out * price[1]) / 1e6


def tier_jobs(sim: str, contents: list[str]) -> list[tuple[str, list[str]]]:
    """The simulator's tier jobs that hold any of these prompts: (endpoint, every prompt the job held)."""
    found = []
    for job in httpx.get(f"{sim}/v1/batches", params={"limit": 100}).json()["data"]:
        text = httpx.get(f"{sim}/v1/files/{job['input_file_id']}/content").text
        lines = [json.loads(line) for line in text.splitlines() if line.strip()]
        held = sorted(message["content"] if isinstance(message["content"], str)
                      else " ".join(part["text"] for part in message["content"])
                      for line in lines for message in line["body"]["messages"])
        if set(held) & set(contents):
            found.append((job["endpoint"], held))
    return found


def no_direct_calls(sim: str) -> None:
    """Nothing in this module has called a model directly (chat completions, messages, ... by path)."""
    assert httpx.get(f"{sim}/_sim/stats").json()["by_path"] == {}


def test_inline_batch_over_plain_http_runs_on_the_tier_at_its_price(stack, runs):
    # `runs`: the SDK flows start first, so their interpreters start up while this one runs.
    account = accounts.create_account(stack["svc"], batch_access=True, **ACCOUNT)
    auth = {"Authorization": f"Bearer {accounts.create_key(stack['svc'], account['id'])}"}
    contents = {"a": "Hi", "b": "Bye"}
    requests = [{"custom_id": custom_id, "body": {"model": MODEL, "messages": [{"role": "user", "content": text}]}}
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

    assert batch["status"] == "completed", batch
    assert batch["request_counts"] == {"total": 2, "completed": 2, "failed": 0}, batch
    expected = {custom_id: answer(text) for custom_id, text in contents.items()}
    shown = {r["custom_id"]: r["response"]["body"]["choices"][0]["message"]["content"] for r in results}
    assert shown == {custom_id: text for custom_id, (text, _, _) in expected.items()}, results
    assert output.status_code == 200
    lines = [json.loads(line) for line in output.text.splitlines()]
    assert [(line["custom_id"], line["response"]["status_code"]) for line in lines] == [("a", 200), ("b", 200)]
    tokens_in, tokens_out = (sum(e[1] for e in expected.values()), sum(e[2] for e in expected.values()))
    assert (batch["usage"]["input_tokens"], batch["usage"]["output_tokens"]) == (tokens_in, tokens_out), batch
    assert batch["cost_usd"] == pytest.approx(cost(tokens_in, tokens_out, TIER_PRICE), abs=1e-9), batch
    saved = cost(tokens_in, tokens_out, MODEL_PRICE) - cost(tokens_in, tokens_out, TIER_PRICE)
    assert batch["saved_usd"] == pytest.approx(saved, abs=1e-9), batch
    assert tier_jobs(stack["sim"], list(contents.values())) == [("/v1/chat/completions", sorted(contents.values()))]
    no_direct_calls(stack["sim"])


def test_openai_sdk_file_batch_runs_on_the_tier_at_its_price(stack, runs):
    seen = runs["openai"].result("newest")
    kind, status, message = seen["refused"]
    assert (kind, status) == ("BadRequestError", 400) and "execution" in message, seen
    assert seen["created_execution"] == "provider_batch", seen
    assert seen["status"] == "completed" and seen["counts"] == [4, 4, 0], seen
    contents = [f"Tier question {i}." for i in range(4)]
    assert seen["output"] == [[f"t-{i}", answer(content)[0]] for i, content in enumerate(contents)], seen
    tokens_in, tokens_out = (sum(answer(c)[1] for c in contents), sum(answer(c)[2] for c in contents))
    assert seen["usage"] == [tokens_in, tokens_out], seen
    assert seen["cost_usd"] == pytest.approx(cost(tokens_in, tokens_out, TIER_PRICE), abs=1e-9), seen
    saved = cost(tokens_in, tokens_out, MODEL_PRICE) - cost(tokens_in, tokens_out, TIER_PRICE)
    assert seen["saved_usd"] == pytest.approx(saved, abs=1e-9), seen
    assert tier_jobs(stack["sim"], contents) == [("/v1/chat/completions", contents)]
    no_direct_calls(stack["sim"])


@pytest.mark.parametrize("major", ANTHROPIC_MAJORS)
def test_anthropic_sdk_message_batch_runs_on_the_openai_tier_at_its_price(stack, runs, major):
    seen = runs["anthropic"].result(major)
    kind, status, message = seen["refused"]
    assert (kind, status) == ("BadRequestError", 400) and "execution" in message, seen
    assert seen["created_execution"] == "provider_batch", seen
    assert seen["status"] == "ended" and seen["counts"] == [0, 3, 0, 0, 0], seen
    contents = [f"Message tier {i} ({major})." for i in range(3)]
    expected = [answer(content, max_tokens=64) for content in contents]
    assert seen["results"] == [[f"m-{i}", "succeeded", text, "end_turn", tokens_in, tokens_out]
                               for i, (text, tokens_in, tokens_out) in enumerate(expected)], seen
    tokens_in, tokens_out = sum(e[1] for e in expected), sum(e[2] for e in expected)
    assert seen["usage"] == [tokens_in, tokens_out], seen
    assert seen["cost_usd"] == pytest.approx(cost(tokens_in, tokens_out, TIER_PRICE), abs=1e-9), seen
    saved = cost(tokens_in, tokens_out, MODEL_PRICE) - cost(tokens_in, tokens_out, TIER_PRICE)
    assert seen["saved_usd"] == pytest.approx(saved, abs=1e-9), seen
    assert tier_jobs(stack["sim"], contents) == [("/v1/chat/completions", contents)]
    no_direct_calls(stack["sim"])
