"""Backend errors: retried, refused, invalid, and a backend that fails 30 % of the time."""

from __future__ import annotations

from batchinfer.operations.openai import batches
from batchinfer.providers import openai_compat
from batchinfer.service.accounts import authenticate
from local.servers import free_port
from tests.faults.harness import (
    GLM,
    QWEN,
    configure,
    pump,
    requests_by_custom_id,
    results_by_custom_id,
    sim_config,
    sim_stats,
    submit,
    submit_file,
    with_backend_url,
)
from tests.helpers import chat_request, new_key
from tests.invariants import assert_ledger_consistent, stored_requests

# --- Errors the backend answers with ---------------------------------------------------------------------------


def test_transient_backend_errors_are_retried_until_they_pass(svc, sim_control):
    # A timeout a plain call never meets on a busy machine (it counts each attempt exactly), and a sleep past it.
    configure(svc, backend_timeout_seconds=2.0)
    sim_config(sim_control, timeout_sleep_seconds=4)
    _, key = new_key(svc)
    who = authenticate(svc, key)
    requests = [chat_request("r429", "[[sim:flaky:2:429]] alpha"), chat_request("r500", "[[sim:flaky:3:500]] beta"),
                chat_request("rtimeout", "[[sim:flaky:1:timeout]] gamma"), chat_request("plain", "delta")]
    batch_id = submit(svc, who, requests)

    final = pump(svc, batch_id, clock_step=2)

    assert final["status"] == "completed"
    assert_ledger_consistent(svc, batch_id, who, [r["custom_id"] for r in requests])
    stored = requests_by_custom_id(svc, batch_id)
    assert {c: r["state"] for c, r in stored.items()} == dict.fromkeys(stored, "completed")
    assert {c: r["attempt"] for c, r in stored.items()} == {"r429": 3, "r500": 4, "rtimeout": 2, "plain": 1}
    assert final["completed"] == 4 and final["failed"] == 0
    # Only the timed-out attempt may have run without us knowing its cost; 429s and 500s were refused.
    assert final["cost_unknown_attempts"] == 1
    stats = sim_stats(sim_control, settle=True)
    assert stats["total_requests"] == 10
    assert stats["by_status"].get("429") == 2 and stats["by_status"].get("500") == 3
    assert stats["by_status"].get("200") == 4


def test_request_failing_every_attempt_fails_after_eight(svc, sim_control):
    _, key = new_key(svc)
    who = authenticate(svc, key)
    requests = [chat_request("ok-1", "one"), chat_request("bad", "[[sim:fail-always]] two"),
                chat_request("ok-2", "three")]
    batch_id = submit(svc, who, requests)

    final = pump(svc, batch_id, clock_step=2)

    assert final["status"] == "completed"  # a batch completes even when some of its requests failed
    assert_ledger_consistent(svc, batch_id, who, [r["custom_id"] for r in requests])
    stored = requests_by_custom_id(svc, batch_id)
    assert stored["bad"]["state"] == "failed" and stored["bad"]["attempt"] == 8
    results = results_by_custom_id(svc, who, batch_id)
    assert results["bad"]["status"] == "failed"
    assert results["bad"]["error"]["code"] == "upstream_error" and results["bad"]["error"]["status"] == 500
    for ok in ("ok-1", "ok-2"):
        assert stored[ok]["attempt"] == 1 and results[ok]["status"] == "completed"
    assert final["completed"] == 2 and final["failed"] == 1 and final["cost_unknown_attempts"] == 0
    stats = sim_stats(sim_control)
    assert stats["by_status"].get("500") == 8 and stats["total_requests"] == 10


def test_invalid_request_fails_at_once(svc, sim_control):
    _, key = new_key(svc)
    who = authenticate(svc, key)
    requests = [chat_request("bad", "[[sim:400]] nope"), chat_request("ok", "fine")]
    batch_id = submit(svc, who, requests)

    final = pump(svc, batch_id, clock_step=2)

    assert_ledger_consistent(svc, batch_id, who, ["bad", "ok"])
    stored = requests_by_custom_id(svc, batch_id)
    assert stored["bad"]["state"] == "failed" and stored["bad"]["attempt"] == 1
    error = results_by_custom_id(svc, who, batch_id)["bad"]["error"]
    assert error["code"] == "invalid_request" and error["status"] == 400
    assert final["completed"] == 1 and final["failed"] == 1 and final["cost_unknown_attempts"] == 0
    assert sim_stats(sim_control)["by_status"] == {"200": 1, "400": 1}


# --- A backend that refuses connections ------------------------------------------------------------------------


def test_a_backend_that_refuses_connections_costs_nothing_and_fails_as_unavailable(svc, sim_control):
    """A connection the backend refused never carried the request: its attempts are retried at no cost, none
    counts as cost unknown, and the request ends `service_unavailable` once its attempts run out."""
    configure(svc, max_attempts=3)
    with_backend_url(svc, GLM, f"http://127.0.0.1:{free_port()}/v1")  # nothing listens there
    _, key = new_key(svc)
    who = authenticate(svc, key)
    requests = [chat_request("refused", "one"), chat_request("other", "two", model=QWEN)]
    batch_id = submit(svc, who, requests)

    final = pump(svc, batch_id, clock_step=2)

    assert final["status"] == "completed"
    assert_ledger_consistent(svc, batch_id, who, [r["custom_id"] for r in requests])
    assert requests_by_custom_id(svc, batch_id)["refused"]["attempt"] == 3
    result = results_by_custom_id(svc, who, batch_id)["refused"]
    assert result["status"] == "failed" and result["response"] is None
    assert result["error"]["code"] == "service_unavailable" and "status" not in result["error"]
    assert "connect" in result["error"]["message"]
    assert final["completed"] == 1 and final["failed"] == 1
    assert final["cost_unknown_attempts"] == 0 and float(final["cost_usd"]) > 0  # the other request's cost


# --- A backend that fails 30 % of the time ---------------------------------------------------------------------


def test_noisy_backend_every_request_ends_and_adds_up(svc, sim_control, monkeypatch):
    configure(svc, backend_timeout_seconds=0.3)
    sim_config(sim_control, rate_429=0.1, rate_500=0.1, rate_timeout=0.1, timeout_sleep_seconds=1, seed=7)
    _, key = new_key(svc)
    who = authenticate(svc, key)
    requests = [chat_request(f"n-{i}", f"noisy {i}", model=GLM if i % 2 else QWEN) for i in range(40)]
    batch_id = submit(svc, who, requests)
    unanswered = []  # attempts the worker saw no answer to (the simulator may still have answered late)
    real_call = openai_compat.call

    async def watched_call(*args, **kwargs):
        attempt = await real_call(*args, **kwargs)
        if attempt.status_code is None:
            unanswered.append(attempt)
        return attempt

    monkeypatch.setattr(openai_compat, "call", watched_call)

    final = pump(svc, batch_id, clock_step=2)

    assert final["status"] == "completed"
    assert_ledger_consistent(svc, batch_id, who, [r["custom_id"] for r in requests])
    stored = stored_requests(svc, batch_id)
    results = batches.results_page(svc, who, batch_id, 1000, None)["data"]
    for item, result in zip(stored, results, strict=True):
        assert item["state"] in ("completed", "failed")
        assert 1 <= item["attempt"] <= 8
        if item["state"] == "failed":  # only retryable errors happen here: they fail after every attempt
            assert item["attempt"] == 8 and result["error"]["code"] in ("rate_limited", "upstream_error", "timeout")
    stats = sim_stats(sim_control, settle=True)
    attempts = sum(r["attempt"] for r in stored)
    # Every answered attempt reached the backend and nothing else did; an attempt that timed out on a busy
    # machine may have given up before its request arrived.
    assert attempts - len(unanswered) <= stats["total_requests"] <= attempts
    assert sum(r["attempt"] > 1 for r in stored) >= 5, "the faults should have forced retries"
    timed_out = stats["total_requests"] - sum(stats["by_status"].get(code, 0) for code in ("200", "429", "500"))
    # Of those, the ones sent are of unknown cost; a connection that was never made (a connect timing out on a
    # busy machine) carried nothing, and costs nothing.
    sent = [a for a in unanswered if a.sent]
    assert final["cost_unknown_attempts"] == len(sent) >= timed_out > 0, (final, stats)


def test_noisy_backend_file_batch_writes_one_line_per_request(svc, sim_control):
    """Retries, final failures and timeouts in a batch from a file: its result files hold each request once,
    successes in the output file and every other request in the error file, as /results shows them."""
    configure(svc, backend_timeout_seconds=0.3, file_batches_enabled=True, max_attempts=2)
    sim_config(sim_control, rate_429=0.15, rate_500=0.15, rate_timeout=0.1, timeout_sleep_seconds=1, seed=11)
    _, key = new_key(svc)
    who = authenticate(svc, key)
    requests = [chat_request(f"f-{i}", f"noisy file {i}", model=GLM) for i in range(30)]
    requests[5] = chat_request("f-5", "[[sim:400]] refuse this", model=GLM)
    batch_id = submit_file(svc, who, requests)
    final = pump(svc, batch_id, clock_step=2)
    assert final["status"] == "completed" and final["output_file_id"] and final["error_file_id"]
    assert_ledger_consistent(svc, batch_id, who, [r["custom_id"] for r in requests])
    assert final["failed"] >= 2  # the invalid request, and at least one that failed both attempts
