"""The fault suite's harness: a few steps of the service run by hand (dispatch, worker, sweep), the
simulator's controls and the checks every fault test shares."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections import Counter

from batchinfer.catalog import Catalog
from batchinfer.layout import (
    account_key,
    batch_key,
    model_budget_key,
)
from batchinfer.ledger import queue_message
from batchinfer.operations.openai import batches
from batchinfer.scheduling.dispatcher import Dispatcher
from batchinfer.service.running import run_request
from local.lambda_runtime import invoke, sqs_event
from tests.invariants import stored_requests

GLM, QWEN = "glm-5.3-flash", "qwen3.6-35b"
FINAL = ("completed", "failed", "expired", "cancelled")


class Serialized:
    """Applies each call of a moto client atomically, as the real service does.

    In-process moto is not thread-safe: a transaction that is cancelled restores a deep copy of the whole
    table taken when it began, wiping writes other threads made meanwhile, and it checks conditions and
    applies writes without a lock. The code under test runs DynamoDB calls from several threads (the
    worker runs records concurrently), so each call is made atomic here; interleavings between calls,
    which is what the service must survive, are untouched.
    """

    def __init__(self, inner, lock: threading.RLock) -> None:
        self._inner = inner
        self._lock = lock

    def __getattr__(self, name: str):
        attr = getattr(self._inner, name)
        if not callable(attr):
            return attr

        def call(*args, **kwargs):
            with self._lock:
                return attr(*args, **kwargs)

        return call


class Clock:
    """The services' clock: real time plus an offset tests move forward."""

    def __init__(self) -> None:
        self.offset = 0.0

    def __call__(self) -> float:
        return time.time() + self.offset

    def advance(self, seconds: float) -> None:
        self.offset += seconds


def configure(svc, **settings) -> None:
    svc.settings = svc.settings.model_copy(update=settings)


def set_budgets(svc, budgets: dict[str, int]) -> None:
    svc.catalog = Catalog(models=[m.model_copy(update={"batch_budget": budgets[m.id], "batch_floor": 1})
                                  if m.id in budgets else m for m in svc.catalog.models])


def sim_config(sim_control, **config) -> None:
    answer = sim_control.put("/_sim/config", json=config)
    assert answer.status_code == 200, answer.text


def sim_stats(sim_control, settle: bool = False) -> dict:
    """The simulator's counters; settle=True waits until no request of it is still in flight."""
    deadline = time.monotonic() + 5
    while True:
        stats = sim_control.get("/_sim/stats").json()
        if not settle or stats["in_flight"] == 0 or time.monotonic() > deadline:
            return stats
        time.sleep(0.05)


def submit(svc, who, requests: list[dict]) -> str:
    obj, created = batches.create_batch(svc, who, json.dumps({"requests": requests}).encode(), None)
    assert created and obj["status"] == "validating"
    return obj["id"]


def get_batch(svc, batch_id: str) -> dict:
    return svc.table.get(*batch_key(batch_id))


def requests_by_custom_id(svc, batch_id: str) -> dict[str, dict]:
    return {r["custom_id"]: r for r in stored_requests(svc, batch_id)}


def results_by_custom_id(svc, who, batch_id: str) -> dict[str, dict]:
    return {r["custom_id"]: r for r in batches.results_page(svc, who, batch_id, 1000, None)["data"]}


def receive(svc, model: str, n: int = 10) -> list[dict]:
    answer = svc.queues.sqs.receive_message(QueueUrl=svc.queues.urls[model], MaxNumberOfMessages=n,
                                            WaitTimeSeconds=0)
    return answer.get("Messages", [])


def run_messages(svc, model: str, messages: list[dict], environment: str = "") -> dict:
    """One worker invocation on these SQS messages, as the event source mapping makes it: records reported
    as failed (or all of them, when the handler raises) stay on the queue; the rest are deleted.
    `environment`: the execution environment it runs in; invocations at once need one each, as on Lambda
    (one handler module per environment: its batch processor holds the invocation's records)."""
    if not messages:
        return {"failed": [], "raised": None}
    url = svc.queues.urls[model]
    event = sqs_event("arn:aws:sqs:us-east-1:000000000000:" + url.rsplit("/", 1)[-1], messages)
    try:
        failed = {f["itemIdentifier"] for f in invoke("worker", event, environment).get("batchItemFailures", [])}
        raised = None
    except Exception as error:  # the whole invocation failed: every record comes back later
        failed, raised = {m["MessageId"] for m in messages}, error
    handles = list(dict.fromkeys(m["ReceiptHandle"] for m in messages if m["MessageId"] not in failed))
    done = [{"Id": str(i), "ReceiptHandle": h} for i, h in enumerate(handles)]
    if done:
        svc.queues.sqs.delete_message_batch(QueueUrl=url, Entries=done)
    return {"failed": sorted(failed), "raised": raised}


def run_queued(svc, models=None) -> list[dict]:
    """Poll every model queue until it is empty; one worker invocation per poll."""
    reports = []
    for model in models or list(svc.queues.urls):
        while messages := receive(svc, model):
            reports.append(run_messages(svc, model, messages))
    return reports


def pump(svc, batch_id: str, clock_step: float = 0.0, tolerate: bool = False, rounds: int = 300,
         errors: list | None = None) -> dict:
    """Dispatch, run, sweep until the batch is final. With tolerate=True, an exception a scheduled
    handler lets escape is recorded and the next round goes on, as the next scheduled call would."""
    dispatcher = Dispatcher(svc)
    errors = [] if errors is None else errors

    def work() -> None:
        failed = [r for r in run_queued(svc) if r["failed"]]
        if failed:  # a record the worker could not process (it stays on the queue)
            raise AssertionError(f"worker records failed: {failed}")

    for _ in range(rounds):
        for stage in (dispatcher.pass_once, work, lambda: invoke("sweeper", {})):
            try:
                stage()
            except Exception as error:
                if not tolerate:
                    raise
                errors.append(error)
        batch = get_batch(svc, batch_id)
        if batch["status"] in FINAL:
            return batch
        svc.clock.advance(clock_step)
    raise AssertionError(f"batch {batch_id} not final after {rounds} rounds: {get_batch(svc, batch_id)}")


def account_counters(svc, account_id: str) -> dict:
    item = svc.table.get(*account_key(account_id))
    return {k: item.get(k, 0) for k in ("unfinished_batches", "unfinished_requests", "in_flight")}


def with_backend_url(svc, model_id: str, base_url: str) -> None:
    svc.catalog = Catalog(models=[m.model_copy(update={"backend": m.backend.model_copy(update={"base_url": base_url})})
                                  if m.id == model_id else m for m in svc.catalog.models])


def submit_file(svc, who, requests: list[dict]) -> str:
    """A batch from an uploaded file of these requests (as the OpenAI SDK creates one)."""
    from batchinfer.operations.openai import files

    data = b"".join(json.dumps({"method": "POST", "url": "/v1/chat/completions", **r}).encode() + b"\n"
                    for r in requests)
    upload = files.upload(svc, who, filename="in.jsonl", purpose="batch", data=data, expires_after=None)
    body = {"input_file_id": upload["id"], "endpoint": "/v1/chat/completions", "completion_window": "24h"}
    obj, created = batches.create_batch(svc, who, json.dumps(body).encode(), None)
    assert created and obj["status"] == "validating"
    return obj["id"]


def dispatch_in_groups(svc, model: str, sizes: list[int]) -> list[int]:
    """Claim and send the model's next requests as groups of these sizes (a dispatcher pass would make one
    group of them all); returns the sizes claimed."""
    dispatcher = Dispatcher(svc)
    claimed = []
    for size in sizes:
        units = dispatcher.claim(svc.catalog.get(model), limit=size)
        assert not svc.queues.send(model, [queue_message(u) for u in units])
        claimed.append(sum(len(u.get("positions", [u])) for u in units))
    return claimed


def start_one_running(svc, sim_control, model: str = GLM) -> tuple[threading.Thread, int]:
    """Receive one queued message (a group of one) and run it in a worker thread until the backend holds it."""
    messages = receive(svc, model, n=1)
    assert len(messages) == 1
    body = json.loads(messages[0]["Body"])
    index = body.get("index", body.get("group"))
    # In an execution environment of its own: other invocations run while it holds its request.
    thread = threading.Thread(target=run_messages, args=(svc, model, messages, "worker-running"))
    thread.start()
    deadline = time.monotonic() + 5
    while sim_stats(sim_control)["in_flight"] < 1:
        assert time.monotonic() < deadline, "the request never reached the backend"
        time.sleep(0.01)
    return thread, index


def finalizes(name: str, kwargs: dict) -> bool:
    """The final transaction of settle_batch: it gives the account its unfinished batch back."""
    return name == "transact_write_items" and any(
        "unfinished_batches" in op.get("Update", {}).get("UpdateExpression", "") for op in kwargs["TransactItems"])


def stops(name: str, kwargs: dict) -> bool:
    """The transaction that stops a batch (and removes its lanes)."""
    return name == "transact_write_items" and any(
        "#stop = :stop" in op.get("Update", {}).get("UpdateExpression", "") for op in kwargs["TransactItems"])


def budget_in_flight(svc, model: str = GLM) -> int:
    return int((svc.table.get(*model_budget_key(model)) or {}).get("in_flight", 0))


def slot_leases(svc, model: str = GLM) -> list[dict]:
    return list(svc.table.query_all("pk = :pk AND begins_with(sk, :s)", {":pk": f"MODEL#{model}", ":s": "SLOTS#"},
                                    consistent=True))


def run_pump(svc, slots: int, seconds: float = 30.0) -> Counter:
    """One worker invocation's pump on GLM, as process_and_pull runs it after its message."""
    deadline = time.monotonic() + seconds
    return asyncio.run(run_request.slot_pump(svc, svc.catalog.get(GLM), deadline).run(slots))


def worker_dies_after_answer(monkeypatch, custom_id: str) -> list[str]:
    """The worker process dies once, right after the backend answered `custom_id` and before its outcome is
    written. The list it returns gets the state the outcome would have been written with."""
    real_record = run_request.record_position
    died: list[str] = []

    def dying_record(svc_, item):
        if item["custom_id"] == custom_id and not died:
            died.append(item["state"])
            raise RuntimeError("worker process died")  # the backend answered; the outcome is never written
        return real_record(svc_, item)

    monkeypatch.setattr(run_request, "record_position", dying_record)
    return died
