"""Scheduling with no HTTP server: batches run through the real dispatcher, worker and slot pump on in-process
moto, every backend call answered by the deterministic fake backend (tests/fake_provider.py). What the
scheduler promises holds whatever the backend's timing: every request is answered exactly once, a 429 is
retried until it succeeds, and a model never has more calls in flight than its budget."""

from __future__ import annotations

import asyncio
import json

import pytest
from moto import mock_aws

from batchinfer.layout import batch_key, request_sk
from batchinfer.operations.openai import batches
from batchinfer.runtime import use_services

# The scheduler's public entry points, in one place: the dispatcher, and a worker invocation's run of its
# message (then its pump pulling more work while the budget has room).
from batchinfer.scheduling.dispatcher import Dispatcher
from batchinfer.service.accounts import authenticate
from batchinfer.service.running.run_request import process_and_pull
from batchinfer.storage.aws import client
from tests.fake_provider import BACKEND, KIND, NO_SERVER, FakeBackend, on_fake
from tests.helpers import chat_request, drive, make_services, new_key

GLM = "glm-5.3-flash"
QWEN = "qwen3.6-35b"


@pytest.fixture
def fake() -> FakeBackend:
    return BACKEND.reset()


@pytest.fixture
def fake_svc(fake):
    """Services on a fresh in-process moto with every model on the fake backend: no simulated backend is
    started, and the models' URL has no server behind it."""
    client.cache_clear()
    with mock_aws():
        services = make_services(NO_SERVER)
        services.catalog = on_fake(services.catalog, {GLM: 4, QWEN: 4})
        use_services(services)
        yield services
        use_services(None)
    client.cache_clear()


def submit(svc, requests: list[dict]) -> tuple[object, str]:
    who = authenticate(svc, new_key(svc, tier="internal")[1])
    obj, created = batches.create_batch(svc, who, json.dumps({"requests": requests}).encode(), None)
    assert created
    return who, obj["id"]


def attempts(svc, batch_id: str, n: int) -> list[int]:
    pk, _ = batch_key(batch_id)
    return [int(svc.table.get(pk, request_sk(i)).get("attempt", 0)) for i in range(n)]


def test_the_models_are_on_the_fake_backend(fake_svc):
    assert {m.backend.kind for m in fake_svc.catalog.runnable} == {KIND}
    assert {m.backend.base_url for m in fake_svc.catalog.runnable} == {NO_SERVER}


def test_a_batch_runs_through_the_dispatcher_and_workers_each_request_once(fake_svc, fake):
    prompts = [f"prompt {i}" for i in range(30)]
    who, batch_id = submit(fake_svc, [chat_request(f"c-{i}", p, model=GLM if i % 2 else QWEN)
                                      for i, p in enumerate(prompts)])

    final = drive(fake_svc, batch_id)

    assert final["status"] == "completed" and final["completed"] == 30 and final["failed"] == 0
    assert fake.counts() == {p: 1 for p in prompts}
    assert all(fake.max_in_flight[m] <= 4 for m in (GLM, QWEN)), fake.max_in_flight
    page = batches.results_page(fake_svc, who, batch_id, 100, None)
    answers = {r["custom_id"]: r["response"]["body"]["choices"][0]["message"]["content"] for r in page["data"]}
    assert answers == {f"c-{i}": f"fake answer to {p}" for i, p in enumerate(prompts)}


def test_the_pump_keeps_the_model_within_its_budget_and_runs_each_request_once(fake_svc, fake):
    """Two batches on a model of budget 4, each call taking 50 ms: the dispatcher claims the budget's 4 slots
    and sends what it claimed; the worker invocation of each message runs it, then its pump keeps those slots
    busy with the rest of both batches, claimed ahead, until there is none."""
    fake_svc.settings = fake_svc.settings.model_copy(update={"worker_pull": True})
    fake.reset(latency=0.05)
    prompts = {b: [f"batch {b} prompt {i}" for i in range(16)] for b in range(2)}
    batch_ids = [submit(fake_svc, [chat_request(f"c-{i}", p, model=GLM) for i, p in enumerate(ps)])[1]
                 for ps in prompts.values()]

    assert Dispatcher(fake_svc).pass_once() == 4  # the budget's 4 slots, claimed once
    url = fake_svc.queues.urls[GLM]
    messages = fake_svc.queues.sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10)["Messages"]

    async def invocations() -> list:
        return await asyncio.gather(*(process_and_pull(fake_svc, json.loads(m["Body"]), 60.0) for m in messages))

    outcomes = asyncio.run(invocations())

    assert sum(o["completed"] for o in outcomes) == 32, outcomes
    assert 2 <= fake.max_in_flight[GLM] <= 4, fake.max_in_flight  # calls overlapped, never past the budget
    assert fake.counts() == {p: 1 for ps in prompts.values() for p in ps}
    for batch_id in batch_ids:
        final = drive(fake_svc, batch_id)
        assert final["status"] == "completed" and final["completed"] == 16, final
    assert len(fake.calls) == 32  # finishing the batches ran nothing again


def test_a_scripted_429_is_retried_until_it_succeeds_and_a_400_is_not(fake_svc, fake):
    fake.reset(script={"prompt 2": [429], "prompt 4": [429, 500], "prompt 6": [400]})
    prompts = [f"prompt {i}" for i in range(8)]
    who, batch_id = submit(fake_svc, [chat_request(f"c-{i}", p, model=GLM) for i, p in enumerate(prompts)])

    final = drive(fake_svc, batch_id, clock_step=5)  # retries are due a second or more later

    assert final["status"] == "completed" and final["completed"] == 7 and final["failed"] == 1
    assert fake.counts() == {p: {"prompt 2": 2, "prompt 4": 3}.get(p, 1) for p in prompts}
    assert [c.status for c in fake.calls if c.text == "prompt 4"] == [429, 500, 200]
    assert attempts(fake_svc, batch_id, 8) == [1, 1, 2, 1, 3, 1, 1, 1]
    page = {r["custom_id"]: r for r in batches.results_page(fake_svc, who, batch_id, 100, None)["data"]}
    assert page["c-2"]["status"] == "completed" and page["c-4"]["status"] == "completed"
    assert page["c-6"]["status"] == "failed"


def test_an_exception_in_the_provider_is_an_unknown_outcome_retried(fake_svc, fake):
    fake.reset(script={"prompt 1": [RuntimeError("a bug in the provider")], "prompt 3": [None]})
    prompts = [f"prompt {i}" for i in range(4)]
    _, batch_id = submit(fake_svc, [chat_request(f"c-{i}", p, model=GLM) for i, p in enumerate(prompts)])

    final = drive(fake_svc, batch_id, clock_step=5)

    assert final["status"] == "completed" and final["completed"] == 4
    assert fake.counts() == {"prompt 0": 1, "prompt 1": 2, "prompt 2": 1, "prompt 3": 2}
    assert final["cost_unknown_attempts"] == 2  # the call that raised and the one that timed out
