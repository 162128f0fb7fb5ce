"""The api function's own latency metric (`ApiLatency`, which its p99 alarm reads): one value per request
in its EMF output, except for a results page held open with `wait` (a long poll, up to 25 s by design)."""

from __future__ import annotations

import json
import time

import pytest

from batchinfer.catalog import METRIC_API_LATENCY
from batchinfer.observability import metrics
from tests.helpers import new_key, ok, req
from tests.integration.test_message_batches import (
    Messages,
    catalog_file,  # noqa: F401  (a fixture)
    entry,
)
from tests.integration.test_results_feed import message_batches  # noqa: F401  (a fixture)


@pytest.fixture
def latencies(monkeypatch, capsys):
    """latencies(): the ApiLatency values the api function's EMF lines published since the last call."""
    monkeypatch.setenv("POWERTOOLS_METRICS_DISABLED", "false")
    metrics.clear_metrics()
    capsys.readouterr()

    def published() -> list[float]:
        values: list[float] = []
        for line in capsys.readouterr().out.splitlines():
            blob = json.loads(line) if line.startswith("{") else {}
            if "_aws" in blob and METRIC_API_LATENCY in blob:
                found = blob[METRIC_API_LATENCY]
                values += found if isinstance(found, list) else [found]
        return values

    return published


def test_a_long_poll_publishes_no_latency_and_every_other_request_does(api, svc, latencies):
    _, key = new_key(svc)
    batch = api.created(key, [req("a")])
    assert len(latencies()) == 1
    assert ok(api.results(key, batch["id"], order="finished"))["data"] == []
    assert len(latencies()) == 1
    started = time.monotonic()
    held = ok(api.results(key, batch["id"], order="finished", wait=1))
    assert held["data"] == [] and time.monotonic() - started >= 0.9  # held: a long poll
    assert latencies() == []
    ok(api.results(key, batch["id"], order="finished", wait=0))  # not held
    (value,) = latencies()
    assert 0 < value < 1000


def test_a_message_batch_long_poll_publishes_no_latency(api, message_batches, latencies):  # noqa: F811
    key, _ = message_batches
    messages = Messages(api, key)
    batch = messages.created([entry("a")])
    latencies()
    started = time.monotonic()
    held = messages("GET", f"/{batch['id']}/results", query={"order": "finished", "wait": "1"})
    assert held.status == 200 and time.monotonic() - started >= 0.9
    assert latencies() == []
