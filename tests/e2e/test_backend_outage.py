"""A backend that goes away and comes back, on the local stack: the requests that failed meanwhile are retried
and every one of them completes within a few backoff intervals of the backend's return, on one slot and on
several, at no cost for the connections it refused."""

from __future__ import annotations

import time

import pytest
import requests

from batchinfer.catalog import Catalog
from local.servers import UvicornThread, free_port
from local.simulated_backend import SimConfig
from local.simulated_backend import create_app as create_sim
from tests.e2e.conftest import local_stack

pytestmark = pytest.mark.e2e
GLM = "glm-5.3-flash"
BACK_WITHIN_SECONDS = 30


def _backend(port: int) -> UvicornThread:
    return UvicornThread(create_sim(SimConfig(latency_seconds=0.05)), port).start()


@pytest.mark.parametrize("slots", [1, 4])
def test_every_request_completes_soon_after_the_backend_comes_back(tmp_path_factory, monkeypatch, slots):
    port = free_port()
    backend = _backend(port)
    monkeypatch.setenv("SIMULATED_BACKEND_URL", backend.url)
    with local_stack(tmp_path_factory) as stack:
        svc = stack["svc"]
        svc.catalog = Catalog(models=[m.model_copy(update={"batch_budget": slots}) if m.id == GLM else m
                                      for m in svc.catalog.models])
        backend.stop()  # the outage: every connection is refused
        s = requests.Session()
        s.headers["Authorization"] = f"Bearer {stack['key']}"
        body = {"requests": [{"custom_id": f"o-{i}", "body": {
            "model": GLM, "messages": [{"role": "user", "content": f"after the outage {i}"}]}} for i in range(8)]}
        created = s.post(f"{stack['base']}/batches", json=body)
        assert created.status_code == 200, created.text
        batch_id = created.json()["id"]
        time.sleep(5)
        backend = _backend(port)
        back = time.monotonic()
        try:
            while time.monotonic() - back < BACK_WITHIN_SECONDS:
                batch = s.get(f"{stack['base']}/batches/{batch_id}").json()
                if batch["status"] not in ("validating", "in_progress", "finalizing"):
                    break
                time.sleep(0.2)
            took = time.monotonic() - back
            results = s.get(f"{stack['base']}/batches/{batch_id}/results").json()["data"]
        finally:
            backend.stop()
    assert batch["status"] == "completed", (batch, took)
    assert batch["request_counts"] == {"total": 8, "completed": 8, "failed": 0}
    assert took < BACK_WITHIN_SECONDS, took
    print(f"slots={slots}: every request done {took:.1f} s after the backend came back")
    assert sorted(r["custom_id"] for r in results) == [f"o-{i}" for i in range(8)]
    # The refused connections carried nothing: no attempt's cost is unknown.
    assert batch["cost_unknown_attempts"] == 0, batch
