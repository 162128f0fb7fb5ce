"""Start the local stack for a benchmark, and small helpers to submit and wait."""

from __future__ import annotations

import os
import statistics
import sys
import time
from contextlib import contextmanager
from pathlib import Path

os.environ.setdefault("POWERTOOLS_METRICS_DISABLED", "true")  # before Powertools is imported
os.environ.setdefault("POWERTOOLS_TRACE_DISABLED", "true")

import requests  # noqa: E402

from batchinfer.api.app import create_app  # noqa: E402
from batchinfer.settings import Settings  # noqa: E402
from local.run import start  # noqa: E402
from local.servers import UvicornThread, free_port  # noqa: E402
from local.simulated_backend import SimConfig  # noqa: E402

FINAL = ("completed", "failed", "expired", "cancelled")


def command_line(module: str) -> str:
    """How to run this benchmark again, as printed with its results."""
    return f"PYTHONPATH=layers/core/python:. .venv/bin/python -m {module} " + " ".join(sys.argv[1:])


@contextmanager
def local_stack(latency: float = 0.0, budget: int | None = None, pollers: int = 0, **settings):
    """The local stack as `make run` starts it, on free ports, with the catalog's budgets overridden."""
    state = Path(".local/bench")
    state.parent.mkdir(exist_ok=True)
    base = Settings(table_name="bench", bucket_name="bench", stage="bench", **settings)
    svc, key, stop = start(base, free_port(), free_port(), SimConfig(latency_seconds=latency),
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


def chat(custom_id: str, text: str, model: str = "glm-5.3-flash") -> dict:
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
