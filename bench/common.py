"""Start the local stack for a benchmark, small helpers to submit and wait, and the seeding of a large
batch's results (clones of a small real run's) for the benchmarks that measure finalization."""

from __future__ import annotations

import json
import os
import shlex
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

os.environ.setdefault("POWERTOOLS_METRICS_DISABLED", "true")  # before Powertools is imported
os.environ.setdefault("POWERTOOLS_TRACE_DISABLED", "true")

import requests  # noqa: E402

from batchinfer.api.app import create_app  # noqa: E402
from batchinfer.domain import RequestState  # noqa: E402
from batchinfer.layout import batch_key, lane_key, request_key  # noqa: E402
from batchinfer.records import Budget  # noqa: E402
from batchinfer.scheduling.capacity import budget_shards  # noqa: E402
from batchinfer.service.reading import results
from batchinfer.settings import Settings  # noqa: E402
from batchinfer.storage.dynamo import serialize  # noqa: E402
from local.run import start  # noqa: E402
from local.servers import UvicornThread, free_port, wait_until_answering  # noqa: E402
from local.simulated_backend import SimConfig  # noqa: E402

FINAL = ("completed", "failed", "expired", "cancelled")
MODEL = "glm-5.3-flash"


def command_line(module: str) -> str:
    """How to run this benchmark again, as printed with its results."""
    return f"PYTHONPATH=layers/core/python:. .venv/bin/python -m {module} " + shlex.join(sys.argv[1:])


@contextmanager
def backend_process(latency: float):
    """The simulated backend in a process of its own, as a real backend is (not a thread of the stack's process,
    whose calls then wait for the stack's threads): the stack's catalog points at it while the block runs."""
    port = free_port()
    process = subprocess.Popen([sys.executable, "-m", "local.simulated_backend", "--port", str(port),
                                "--latency", str(latency)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_until_answering(f"{url}/_sim/stats", process, "the simulated backend")
        with backend_at(url):
            yield url
    finally:
        process.terminate()
        process.wait(timeout=10)


@contextmanager
def backend_at(url: str) -> Iterator[str]:
    """The default catalog's backends point at `url` (SIMULATED_BACKEND_URL) while the block runs: a stack
    started in it calls that server."""
    previous = os.environ.get("SIMULATED_BACKEND_URL")
    os.environ["SIMULATED_BACKEND_URL"] = url
    try:
        yield url
    finally:
        if previous is None:
            os.environ.pop("SIMULATED_BACKEND_URL", None)
        else:
            os.environ["SIMULATED_BACKEND_URL"] = previous


@contextmanager
def local_stack(latency: float = 0.0, budget: int | None = None, pollers: int = 0, sim: dict | None = None,
                **settings):
    """The local stack as `make run` starts it, on free ports, with the catalog's budgets overridden; `sim`:
    more of the simulated backend's settings (a latency distribution)."""
    state = Path(".local/bench")
    state.parent.mkdir(exist_ok=True)
    base = Settings(table_name="bench", bucket_name="bench", stage="bench", **settings)
    svc, key, stop = start(base, free_port(), free_port(), SimConfig(latency_seconds=latency, **(sim or {})),
                           pollers=pollers or budget or 0, state_dir=state)
    if budget is not None:
        for model in svc.catalog.runnable:
            model.batch_budget = budget
    api = UvicornThread(create_app(), free_port()).start()
    session = requests.Session()
    session.headers["Authorization"] = f"Bearer {key}"
    try:
        yield svc, session, f"{api.url}/v1"
    finally:
        api.stop()
        stop()


def chat(custom_id: str, text: str, model: str = MODEL) -> dict:
    return {"custom_id": custom_id, "body": {"model": model, "messages": [{"role": "user", "content": text}]}}


def create(session: requests.Session, base: str, requests_: list[dict]) -> dict:
    answer = session.post(f"{base}/batches", json={"requests": requests_}, timeout=120)
    answer.raise_for_status()
    return answer.json()


def wait(session: requests.Session, base: str, batch_id: str, poll: float = 0.1, timeout: float = 3600) -> dict:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        batch = session.get(f"{base}/batches/{batch_id}", timeout=30).json()
        if batch["status"] in FINAL:
            return batch
        time.sleep(poll)
    raise TimeoutError(batch_id)


def median(values: list[float]) -> float:
    return statistics.median(values)


# --- Seeding a finished batch -------------------------------------------------------------------------
# Running tens of thousands of requests through moto takes hours, so the benchmarks of what happens when a
# large batch ends write its results directly: clones of a small real batch's stored request items.

def real_results(svc, session, base: str, prompt: str, failing: int = 0, size: int = 20
                 ) -> tuple[list[dict], list[dict]]:
    """The stored request items of a small batch run for real on the stack, (completed, failed): `size`
    requests, the last `failing` of them refused by the simulator (400, not retried). Then every model's
    batch budget is set to 0, so that nothing of a batch created afterwards is dispatched."""
    texts = [f"{prompt} {i}" + (" [[sim:400]]" if i >= size - failing else "") for i in range(size)]
    template = wait(session, base, create(session, base, [chat(f"t-{i}", t) for i, t in enumerate(texts)])["id"],
                    poll=0.2)
    items = list(svc.table.query_all("pk = :pk AND begins_with(sk, :r)",
                                     {":pk": f"BATCH#{template['id']}", ":r": "REQ#"}, consistent=True))
    shards = {model.id: budget_shards(svc, model) for model in svc.catalog.runnable}
    for model in svc.catalog.runnable:
        model.batch_budget = 0
    # A worker's slot pump that ran the small batch may still hold slots, and it claims from a batch created
    # now until its next budget poll sees the 0 or its work runs out: a group it claimed then holds slots of
    # the seeded batch, which never settles. Every slot back first, then nothing is dispatched.
    deadline = time.monotonic() + 60
    while any(Budget.get(svc.table, model_id, True, n).get("in_flight", 0) for model_id, n in shards.items()):
        if time.monotonic() > deadline:
            raise RuntimeError("batch slots still held a minute after the budgets went to 0")
        time.sleep(0.1)
    completed = [i for i in items if i["state"] == RequestState.COMPLETED]
    failed = [i for i in items if i["state"] == RequestState.FAILED]
    assert (len(completed), len(failed)) == (size - failing, failing), (len(completed), len(failed))
    return completed, failed


def seed_results(svc, batch_id: str, completed: list[dict], failed: list[dict] | None = None,
                 failed_every: int = 0) -> dict:
    """Give every request of a stored batch (one model, nothing of it dispatched) a request item cloned from
    `completed`, or for every `failed_every`-th from `failed`, 25 per BatchWriteItem; then leave the batch
    item as the last worker's settlement leaves it (every request counted, nothing open or in flight, the
    lane gone): the sweeper finalizes it. Returns the counts written."""
    stored = svc.table.get(*batch_key(batch_id))
    (model,) = stored["lanes"]
    if stored.get("in_flight") or stored["lanes"][model]["next"]:  # its items would be overwritten under it
        raise RuntimeError(f"{batch_id} had requests dispatched before its results were seeded: {stored['lanes']}")
    n = stored["total"]
    client, pending = svc.table.client, []
    totals = {"completed": 0, "failed": 0, "in": 0, "out": 0, "bytes": 0}
    for i, entry in enumerate(results.index_entries(svc, batch_id, 0, n)):
        if failed_every and i % failed_every == failed_every - 1:
            item = failed[i % len(failed)]
            totals["failed"] += 1
        else:
            item = completed[i % len(completed)]
            totals["completed"] += 1
            usage = json.loads(item["response"]["body_text"])["usage"]  # stored as the backend sent it
            totals["in"] += usage["prompt_tokens"]
            totals["out"] += usage["completion_tokens"]
            totals["bytes"] += len(json.dumps(item["response"], separators=(",", ":")))
        pk, sk = request_key(batch_id, i)
        pending.append({"PutRequest": {"Item": serialize({
            **item, "pk": pk, "sk": sk, "batch_id": batch_id, "index": i, "custom_id": entry.custom_id,
            "offset": entry.offset, "length": entry.length})}})
        if len(pending) == 25 or i == n - 1:
            request = {svc.table.name: pending}
            while request:
                request = client.batch_write_item(RequestItems=request).get("UnprocessedItems")
            pending = []
    svc.table.delete(*lane_key(model, stored["created_at"], batch_id))
    svc.table.update(*batch_key(batch_id),
                     "SET #status = :p, in_progress_at = :now, lanes.#m.#next = :n, completed = :c, failed = :f, "
                     "input_tokens = :i, output_tokens = :o, result_bytes = :b",
                     vals={":p": "in_progress", ":now": svc.now(), ":n": n, ":c": totals["completed"],
                           ":f": totals["failed"], ":i": totals["in"], ":o": totals["out"], ":b": totals["bytes"]},
                     names={"#m": model})
    return totals
