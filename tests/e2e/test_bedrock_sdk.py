"""The README's three scripts (an inline batch with `requests`, a file batch with the OpenAI SDK, a Message Batch
with the Anthropic SDK) against the default catalog's Bedrock model on the local stack, the SDKs at each major:
only the base URL, the key, the poll and the model name change. The worker calls the simulated Bedrock runtime
through boto3 (SigV4 with the local stack's dummy credentials) while moto serves DynamoDB, S3 and SQS."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import requests

from tests.conftest import SDK_MAJORS
from tests.e2e.conftest import local_stack
from tests.e2e.test_local_stack import SPEC_BASE, sdk_env, wait_final

pytestmark = pytest.mark.e2e
EXAMPLES = Path(__file__).with_name("spec_examples")
MODEL, CLAUDE_ID = "claude-bedrock", "us.anthropic.claude-haiku-4-5-20251001-v1:0"
ANTHROPIC_MAJORS = ("newest", "previous")
ANSWERS = (f"q-0 Simulated answer from {CLAUDE_ID} to: Summarize the plot of Hamlet",
           f"q-1 Simulated answer from {CLAUDE_ID} to: Name three prime numbers.")


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    with local_stack(tmp_path_factory, file_batches_enabled=True, message_batches_enabled=True,
                     interactive_streaming_enabled=True) as running:
        yield running


def script(name: str, base: str) -> str:
    source = (EXAMPLES / name).read_text()
    assert source.count('"glm-5.3-flash"') == 1, name
    return (source.replace(SPEC_BASE.removesuffix("/v1"), base.removesuffix("/v1"))
            .replace("time.sleep(30)", "time.sleep(0.3)").replace('"glm-5.3-flash"', f'"{MODEL}"'))


def session(stack) -> requests.Session:
    s = requests.Session()
    s.headers["Authorization"] = f"Bearer {stack['key']}"
    return s


def newest_batch(stack) -> dict:
    return session(stack).get(f"{stack['base']}/batches", params={"limit": 1}).json()["data"][0]


def check_usage_and_cost(stack, batch: dict) -> None:
    """The batch's tokens are its results' and its cost is the catalog's price of them."""
    s = session(stack)
    final = wait_final(s, stack["base"], batch["id"])
    results = s.get(f"{stack['base']}/batches/{batch['id']}/results").json()["data"]
    usages = [r["response"]["body"]["usage"] for r in results]
    assert all(u["prompt_tokens"] > 0 and u["completion_tokens"] > 0 for u in usages), usages
    price = stack["svc"].catalog.get(MODEL).price
    cost = sum(u["prompt_tokens"] * price.input_per_mtok + u["completion_tokens"] * price.output_per_mtok
               for u in usages) / 1e6
    assert abs(final["cost_usd"] - cost) < 1e-9 and final["cost_unknown_attempts"] == 0, final
    assert final["usage"]["total_tokens"] == sum(u["total_tokens"] for u in usages)


def test_the_inline_requests_script_on_bedrock(stack):
    out = subprocess.run([sys.executable, "-c", script("inline_python_example.py", stack["base"])],
                         capture_output=True, text=True, timeout=120,
                         env={**os.environ, "FREEINFERENCE_API_KEY": stack["key"]})
    assert out.returncode == 0, out.stderr
    lines = out.stdout.strip().splitlines()
    assert len(lines) == 2 and all(line.startswith(a) for line, a in zip(lines, ANSWERS, strict=True)), lines
    check_usage_and_cost(stack, newest_batch(stack))


@pytest.mark.parametrize("sdk_major", SDK_MAJORS)
def test_the_openai_file_script_on_bedrock(stack, tmp_path, sdk_python, sdk_major):
    out = subprocess.run([sdk_python(sdk_major), "-c", script("file_openai_example.py", stack["base"])],
                         capture_output=True, text=True, timeout=180, cwd=tmp_path, env=sdk_env(stack))
    assert out.returncode == 0, out.stderr
    lines = out.stdout.strip().splitlines()
    first = re.fullmatch(r"(\w+) \w*\((.*)\)", lines[0] if lines else "")
    assert first and first[1] == "completed", lines
    assert dict(re.findall(r"(\w+)=(\d+)", first[2])) == {"completed": "2", "failed": "0", "total": "2"}, lines
    assert len(lines) == 3 and all(line.startswith(a) for line, a in zip(lines[1:], ANSWERS, strict=True)), lines
    check_usage_and_cost(stack, newest_batch(stack))


@pytest.mark.parametrize("sdk_major", ANTHROPIC_MAJORS)
def test_the_anthropic_message_batch_script_on_bedrock(stack, tmp_path, sdk_python, sdk_major):
    source = script("anthropic_message_batches_example.py", stack["base"])
    out = subprocess.run([sdk_python(sdk_major), "-c", source], capture_output=True, text=True, timeout=180,
                         cwd=tmp_path, env=sdk_env(stack))
    assert out.returncode == 0, out.stderr
    lines = out.stdout.strip().splitlines()
    assert re.search(r"succeeded=2", lines[0]) and re.search(r"errored=0", lines[0]), lines
    assert len(lines) == 3 and all(line.startswith(a) for line, a in zip(lines[1:], ANSWERS, strict=True)), lines
    check_message_batch_usage_and_cost(stack)


def check_message_batch_usage_and_cost(stack) -> None:
    """The newest Message Batch's tokens (an extension field) are its results' and its cost the catalog's
    price of them."""
    s = session(stack)
    s.headers["anthropic-version"] = "2023-06-01"
    batches = f"{stack['base']}/messages/batches"
    batch = s.get(batches, params={"limit": 1}).json()["data"][0]
    assert batch["processing_status"] == "ended", batch
    lines = s.get(f"{batches}/{batch['id']}/results").text.strip().splitlines()
    usages = [json.loads(line)["result"]["message"]["usage"] for line in lines]
    assert len(usages) == 2 and all(u["input_tokens"] > 0 and u["output_tokens"] > 0 for u in usages), usages
    price = stack["svc"].catalog.get(MODEL).price
    cost = sum(u["input_tokens"] * price.input_per_mtok + u["output_tokens"] * price.output_per_mtok
               for u in usages) / 1e6
    assert abs(batch["cost_usd"] - cost) < 1e-9 and batch["cost_unknown_attempts"] == 0, batch
    assert batch["usage"]["input_tokens"] == sum(u["input_tokens"] for u in usages), batch
    assert batch["usage"]["output_tokens"] == sum(u["output_tokens"] for u in usages), batch


def test_both_sdks_stream_a_bedrock_answer_as_it_comes(stack):
    """ConverseStream relayed: the OpenAI SDK's chunks and the Anthropic SDK's message stream (newest majors,
    in this interpreter)."""
    import anthropic
    import openai

    client = openai.OpenAI(base_url=stack["base"], api_key=stack["key"])
    chunks = list(client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "Count"}],
                                                 stream=True, stream_options={"include_usage": True}))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text.startswith(f"Simulated answer from {CLAUDE_ID} to: Count") and chunks[-1].usage.completion_tokens > 0
    messages = anthropic.Anthropic(base_url=stack["base"].removesuffix("/v1") + "/anthropic", api_key=stack["key"])
    with messages.messages.stream(model=MODEL, max_tokens=64, messages=[{"role": "user", "content": "Count"}]) as s:
        final = s.get_final_message()
    assert final.content[0].text.startswith(f"Simulated answer from {CLAUDE_ID}") and final.stop_reason == "end_turn"
    assert final.usage.output_tokens > 0
