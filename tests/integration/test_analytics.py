"""A batch's analytics (an extension): attempts, retries, errors by code and backend latency percentiles,
read through the HTTP API of an inline batch and of a Message Batch, kept by retries in place and across a
pause."""

from __future__ import annotations

import datetime as dt
import math

from batchinfer.records import Request
from batchinfer.records.analytics import RELATIVE_ERROR
from batchinfer.scheduling.dispatcher import Dispatcher
from tests.helpers import finish, new_key, ok, req, settings, step_by_record, tick
from tests.integration.test_message_batches import Messages, entry
from tests.integration.test_pause import MODEL, pause, run_dispatched
from tests.integration.test_retry import FLAKY, retry


def nearest_rank(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[max(1, math.ceil(q * len(ordered))) - 1]


def sim_latencies_ms(sim_control) -> list[float]:
    """How long the simulated backend took for each request since its last reset."""
    return [1000 * (ended - started) for started, ended in sim_control.get("/_sim/timeline").json()["requests"]]


def test_a_batch_with_known_latencies_and_failures_shows_its_counts_errors_and_percentiles(api, svc, sim_control):
    # Latencies spread by the request (a lognormal draw from each body): mean 0.4 s, from ~50 ms to ~2 s.
    sim_control.put("/_sim/config", json={"latency_seconds": 0.4, "latency_distribution": "lognormal",
                                          "latency_sigma": 1.0})
    settings(svc, retry_base_seconds=0.5, retry_max_seconds=1)
    _, key = new_key(svc)
    requests = ([req(f"ok-{i}", f"Question {i}") for i in range(16)]
                + [req("flaky", FLAKY), req("bad-1", "[[sim:400]] one"), req("bad-2", "[[sim:400]] two"),
                   req("down", "[[sim:fail-always]]")])
    batch = api.created(key, requests)
    assert batch["analytics"] == {
        "started_at": None, "last_finished_at": None, "running_seconds": 0, "requests_per_minute": None,
        "output_tokens_per_second": None, "p50_ms": None, "p95_ms": None, "max_ms": None, "attempts": 0,
        "retries": 0, "errors_by_code": {}, "cached_input_share": None, "cache_saved_usd": 0.0}
    settings(svc, max_attempts=3)  # the always-failing request: three attempts, then failed
    for _ in range(6):
        step_by_record(svc)
        tick(svc, 2)  # the retries' backoff passes
    final = finish(svc, batch["id"], timeout=60)
    assert (final["completed"], final["failed"]) == (17, 3)

    shown = ok(api("GET", f"/v1/batches/{batch['id']}", key))["analytics"]
    # 16 + 1 answered at once; the flaky one failed once then passed; two rejected; one failed three times.
    assert shown["attempts"] == 16 + 2 + 2 + 3
    assert shown["retries"] == 1 + 2
    assert shown["errors_by_code"] == {"invalid_request": 2, "upstream_error": 1 + 3}
    sim = sim_latencies_ms(sim_control)
    assert len(sim) == shown["attempts"]  # every attempt reached the backend and has a latency
    for name, q in (("p50_ms", 0.50), ("p95_ms", 0.95), ("max_ms", 1.0)):  # at least the backend's own time
        assert shown[name] >= nearest_rank(sim, q) * (1 - RELATIVE_ERROR), (name, shown[name], sorted(sim))
    assert shown["p50_ms"] < shown["p95_ms"] <= shown["max_ms"]

    assert shown["started_at"] == final["in_progress_at"]
    assert final["in_progress_at"] <= shown["last_finished_at"] <= final["completed_at"]
    seconds = max(1, shown["last_finished_at"] - shown["started_at"])
    assert shown["running_seconds"] == seconds
    assert shown["requests_per_minute"] == round(20 * 60 / seconds, 2)  # every request ended by an attempt
    assert shown["output_tokens_per_second"] == round(final["output_tokens"] / seconds, 2)
    listed = ok(api("GET", "/v1/batches", key))["data"]
    assert listed[0]["analytics"] == shown


def test_the_percentiles_are_within_the_bucket_error_of_the_latencies_measured(api, svc, sim_control):
    sim_control.put("/_sim/config", json={"latency_seconds": 0.3, "latency_distribution": "lognormal",
                                          "latency_sigma": 1.0})
    settings(svc, max_attempts=1)  # first attempts only: each one's latency is kept with its request's outcome
    _, key = new_key(svc)
    batch = api.created(key, [req(f"q-{i}", f"Question {i}") for i in range(30)] + [req("bad", "[[sim:400]]")])
    finish(svc, batch["id"], timeout=60)
    shown = ok(api("GET", f"/v1/batches/{batch['id']}", key))["analytics"]
    measured = [float(Request.get(svc.table, batch["id"], i)["tally"]["attempt"]["ms"]) for i in range(31)]
    sim = sim_latencies_ms(sim_control)
    # Each latency measured is the backend's own time and the call's: order statistic by order statistic too.
    assert all(ours >= theirs - 1 for ours, theirs in zip(sorted(measured), sorted(sim), strict=True))
    for name, q in (("p50_ms", 0.50), ("p95_ms", 0.95), ("max_ms", 1.0)):
        exact = nearest_rank(measured, q)
        assert abs(shown[name] - exact) <= RELATIVE_ERROR * exact + 0.5, (name, shown[name], exact)
    assert (shown["attempts"], shown["retries"], shown["errors_by_code"]) == (31, 0, {"invalid_request": 1})


def test_a_retry_in_place_keeps_adding_and_its_time_ended_is_not_running_time(api, svc, sim_control):
    settings(svc, max_attempts=1)
    _, key = new_key(svc)
    batch = api.created(key, [req("ok"), req("flaky", FLAKY)])
    finish(svc, batch["id"])
    first = ok(api("GET", f"/v1/batches/{batch['id']}", key))["analytics"]
    assert (first["attempts"], first["retries"], first["errors_by_code"]) == (2, 0, {"upstream_error": 1})
    assert first["requests_per_minute"] == round(2 * 60 / first["running_seconds"], 2)

    tick(svc, 3600)  # an hour ended, then retried in place
    ok(retry(api, key, batch["id"]))
    finish(svc, batch["id"])
    again = ok(api("GET", f"/v1/batches/{batch['id']}", key))["analytics"]
    assert (again["attempts"], again["retries"], again["errors_by_code"]) == (3, 1, {"upstream_error": 1})
    assert again["started_at"] == first["started_at"] and again["last_finished_at"] >= first["last_finished_at"] + 3600
    assert again["running_seconds"] < 60  # the hour it sat ended is left out
    assert again["requests_per_minute"] == round(3 * 60 / again["running_seconds"], 2)


def test_a_pause_is_not_running_time(api, svc, sim_control):
    _, key = new_key(svc)
    batch = api.created(key, [req(f"r-{i}") for i in range(3)])
    run_dispatched(svc, Dispatcher(svc).claim(svc.catalog.get(MODEL), limit=1))  # the first request runs
    ok(pause(api, key, batch["id"]))
    tick(svc, 600)
    ok(pause(api, key, batch["id"], "resume"))
    final = finish(svc, batch["id"])
    shown = ok(api("GET", f"/v1/batches/{batch['id']}", key))["analytics"]
    assert shown["last_finished_at"] - shown["started_at"] >= 600
    assert shown["running_seconds"] < 60  # the ten minutes paused are left out
    assert shown["attempts"] == final["completed"] == 3 and shown["retries"] == 0


def rfc3339(text: str) -> int:
    return int(dt.datetime.strptime(text, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=dt.UTC).timestamp())


def test_a_message_batch_shows_its_analytics_with_rfc3339_times(api, svc):
    settings(svc, max_attempts=1, message_batches_enabled=True)
    _, key = new_key(svc)
    messages = Messages(api, key)
    batch = messages.created([entry("ok"), entry("bad", "[[sim:400]]")])
    assert batch["analytics"]["attempts"] == 0 and batch["analytics"]["started_at"] is None
    finish(svc, batch["id"])
    shown = ok(messages("GET", f"/{batch['id']}"))["analytics"]
    assert (shown["attempts"], shown["retries"], shown["errors_by_code"]) == (2, 0, {"invalid_request": 1})
    assert rfc3339(shown["started_at"]) <= rfc3339(shown["last_finished_at"])
    assert shown["p50_ms"] is not None and shown["p50_ms"] <= shown["max_ms"]
