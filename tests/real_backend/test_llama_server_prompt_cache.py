"""The service's prompt cache order on llama.cpp's own server (`llama-server`, 4 slots, each with a prompt cache
of its own; `make llama-server` builds it), running the `prefix` model made at test time.

The files are bench/prompt_cache.py's: 8 system prompts of ~500 words (about 2,250 tokens of the model's small
vocabulary) with 6 questions each, answers of 4 tokens, written prompt by prompt (grouped) and shuffled. The
reference is a direct client sending the grouped file in submission order, 4 requests at a time, to a fresh
server. Then the server is started again (every cache empty) and both files go through the service as OpenAI
file batches, the model's catalog `prompt_cache: slot` and its batch budget 4. What the server evaluated is
its own count: `llamacpp:prompt_tokens_total` on its /metrics (prompt tokens processed, cached ones left out),
read before and after each run, and the same as the sum of its answers' `timings.prompt_n`.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass

import httpx
import openai
import pytest
import yaml

from bench.prompt_cache import files, requests_of
from local.llama_server import BUILD_HINT, LLAMA_SERVER, REAL_PYTHON, SLOTS, LlamaCppServer, make_model
from tests.e2e.conftest import local_stack
from tests.real_backend.conftest import CHAT_PRICE

MODEL, ALIAS = "prefix-chat", "prefix-llama"
CHAT = "/v1/chat/completions"
GOAL = 0.4  # the service's evaluated prompt tokens on the grouped file, at most this share of submission order's
FINAL = ("completed", "failed", "expired", "cancelled")


@dataclass
class Measured:
    """One file run to its end on a server: what the server evaluated meanwhile (its /metrics), what its answers
    say they evaluated (`timings.prompt_n`), and the custom_ids in the order the results came back."""

    evaluated: int
    prompt_n: int
    custom_ids: list[str]
    status: str = "completed"


async def send_in_order(url: str, bodies: list[dict]) -> list[dict]:
    """A direct client: the bodies in submission order, `SLOTS` at a time, as a semaphore lets them go."""
    limit = asyncio.Semaphore(SLOTS)
    async with httpx.AsyncClient(timeout=600) as client:
        async def one(body: dict) -> dict:
            async with limit:
                answer = await client.post(url, json={**body, "model": ALIAS})
                answer.raise_for_status()
                return answer.json()

        return list(await asyncio.gather(*(one(b) for b in bodies)))


def file_batch(stack: dict, requests: list[dict], timeout: float = 900) -> tuple[str, list[dict]]:
    """The requests as an OpenAI file batch, run to its end: its final status and its output file's lines."""
    client = openai.OpenAI(base_url=stack["base"], api_key=stack["key"], max_retries=0, timeout=120)
    lines = "".join(json.dumps({"custom_id": r["custom_id"], "method": "POST", "url": CHAT, "body": r["body"]})
                    + "\n" for r in requests)
    upload = client.files.create(file=("requests.jsonl", lines.encode(), "application/jsonl"), purpose="batch")
    batch = client.batches.create(input_file_id=upload.id, endpoint=CHAT, completion_window="24h")
    deadline = time.monotonic() + timeout
    while batch.status not in FINAL:
        assert time.monotonic() < deadline, f"batch {batch.id} still {batch.status} after {timeout} s"
        time.sleep(0.5)
        batch = client.batches.retrieve(batch.id)
    output = client.files.content(batch.output_file_id).text if batch.output_file_id else ""
    return batch.status, [json.loads(line) for line in output.splitlines()]


def catalog_text(server_url: str) -> str:
    """One model on the server: slot-ordered prompt cache, 4 requests in flight at most (its 4 slots)."""
    return yaml.safe_dump({"models": [{
        "id": MODEL, "backend": {"kind": "openai", "base_url": f"{server_url}/v1", "model": ALIAS},
        "batch_budget": SLOTS, "batch_floor": 1, "prompt_cache": "slot", "price": CHAT_PRICE,
        "endpoints": [CHAT]}]}, sort_keys=False)


@pytest.fixture(scope="module")
def server(tmp_path_factory) -> Iterator[LlamaCppServer]:
    if not os.access(LLAMA_SERVER, os.X_OK):
        pytest.fail(f"{LLAMA_SERVER} does not exist: {BUILD_HINT}", pytrace=False)
    if not os.access(REAL_PYTHON, os.X_OK):
        pytest.fail(f"{REAL_PYTHON} does not exist: run `make test-real-backend`", pytrace=False)
    model = make_model(tmp_path_factory.mktemp("model") / "prefix-llama.gguf", shape="prefix")
    running = LlamaCppServer(model, tmp_path_factory.mktemp("logs") / "llama-server.log", ALIAS).start()
    yield running
    running.stop()


@pytest.fixture(scope="module")
def measured(server, tmp_path_factory) -> dict[str, Measured]:
    """The direct client on the grouped file (a fresh server), then both files through the service (the server
    started again: every cache empty), each measured by the server's counter around it."""
    figures: dict[str, Measured] = {}
    grouped = requests_of(files()["grouped"], "grouped", model=MODEL)
    before = server.prompt_tokens_evaluated()
    answers = asyncio.run(send_in_order(server.url + CHAT, [r["body"] for r in grouped]))
    figures["direct"] = Measured(server.prompt_tokens_evaluated() - before,
                                 sum(a["timings"]["prompt_n"] for a in answers), [r["custom_id"] for r in grouped])
    server.restart()
    catalog = tmp_path_factory.mktemp("catalog") / "models.yaml"
    catalog.write_text(catalog_text(server.url))
    with local_stack(tmp_path_factory, pollers=SLOTS, models_file=str(catalog),
                     file_batches_enabled=True) as stack:
        for name, order in files().items():
            before = server.prompt_tokens_evaluated()
            status, lines = file_batch(stack, requests_of(order, name, model=MODEL))
            figures[name] = Measured(
                server.prompt_tokens_evaluated() - before,
                sum(line["response"]["body"]["timings"]["prompt_n"] for line in lines if line.get("response")),
                [line["custom_id"] for line in lines], status)
    print({name: (m.evaluated, m.prompt_n) for name, m in figures.items()})
    return figures


@pytest.mark.parametrize("name", ["grouped", "shuffled"])
def test_every_request_completes_and_results_come_back_in_submission_order(measured, name):
    run = measured[name]
    assert run.status == "completed"
    assert run.custom_ids == [r["custom_id"] for r in requests_of(files()[name], name)]


def test_the_grouped_file_makes_the_server_evaluate_a_fraction_of_what_submission_order_does(measured):
    direct, service = measured["direct"], measured["grouped"]
    assert service.evaluated <= GOAL * direct.evaluated, (
        f"the service made llama-server evaluate {service.evaluated} prompt tokens of the grouped file, "
        f"{service.evaluated / direct.evaluated:.3f} of submission order's {direct.evaluated} (goal <= {GOAL})")


def test_the_shuffled_file_costs_the_server_no_more_than_the_grouped_one(measured):
    """The service's order does not depend on the file's: each prefix is evaluated about once either way."""
    grouped, shuffled = measured["grouped"], measured["shuffled"]
    assert shuffled.evaluated <= GOAL * measured["direct"].evaluated, (shuffled.evaluated, grouped.evaluated)


@pytest.mark.parametrize("name", ["direct", "grouped", "shuffled"])
def test_the_servers_counter_is_the_sum_of_its_answers_timings(measured, name):
    """/metrics' prompt_tokens_total and the answers' timings.prompt_n count the same tokens: the results carry
    the server's answers as it sent them, and nothing was evaluated for a request whose answer was lost."""
    assert measured[name].evaluated == measured[name].prompt_n
