"""Faults around a batch's spending cap: the cap reached while requests are in flight, and while the cost of
attempts is unknown (their worker died). What starts never takes what the batch committed past the cap,
what runs finishes and is counted, the batch then stops as a cancel does, and the ledger's invariants hold
(tests/invariants.py, which checks the cap against the usage the simulator reported)."""

from __future__ import annotations

import asyncio
import json

import pytest

from batchinfer import ledger
from batchinfer.layout import batch_key, group_key
from batchinfer.scheduling.dispatcher import Dispatcher
from batchinfer.service.accounts import Principal
from batchinfer.service.background.sweep import sweep_once
from batchinfer.service.running.run_request import process_group
from tests.helpers import chat_request, finish, new_key, ok, sim_requests, tick
from tests.invariants import assert_ledger_consistent

GLM = "glm-5.3-flash"


def _requests(n: int) -> list[dict]:
    return [chat_request(f"r-{i:02d}", f"Question {i:02d}?", max_tokens=5) for i in range(n)]


def _worst(svc, request: dict) -> float:
    line = json.dumps({"custom_id": request["custom_id"], "body": request["body"]}, separators=(",", ":"))
    return svc.catalog.get(GLM).cost_usd(len(line.encode()) + 1, request["body"]["max_tokens"])


def _queued_group(svc, batch_id: str) -> tuple[dict, dict]:
    """The group message the dispatcher queued, taken off its queue, and the group item."""
    url = svc.queues.urls[GLM]
    got = svc.queues.sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=1)["Messages"]
    svc.queues.sqs.delete_message(QueueUrl=url, ReceiptHandle=got[0]["ReceiptHandle"])
    message = json.loads(got[0]["Body"])
    assert message["batch_id"] == batch_id and "group" in message, message
    return message, svc.table.get(*group_key(batch_id, int(message["group"])))


def _batch(svc, batch_id: str) -> dict:
    return svc.table.get(*batch_key(batch_id))


def _capped_batch(api, svc, n: int, worst_cases: float) -> tuple[dict, str, dict, float]:
    account, key = new_key(svc)
    requests = _requests(n)
    worst = _worst(svc, requests[0])
    assert all(_worst(svc, r) == pytest.approx(worst) for r in requests)
    batch = ok(api("POST", "/v1/batches", key, json_body={"requests": requests, "max_cost_usd": worst_cases * worst}))
    return account, key, batch, worst


def test_cap_reached_with_requests_in_flight_lets_them_finish_and_starts_nothing_past_it(api, svc, sim_control):
    account, key, batch, worst = _capped_batch(api, svc, 10, 2.5)
    Dispatcher(svc).pass_once()  # 16 slots free, but only two worst cases fit under the cap
    claimed = _batch(svc, batch["id"])
    assert claimed["lanes"][GLM]["next"] == 2 and claimed["in_flight"] == 2
    assert float(claimed["committed_usd"]) == pytest.approx(2 * worst)
    message, group = _queued_group(svc, batch["id"])
    running = ledger.start_group(svc, group)  # both in flight now
    Dispatcher(svc).pass_once()  # slots are free, the cap is not: nothing more is claimed
    sweep_once(svc)  # nor is the batch stopped while what runs may settle below its worst case
    assert _batch(svc, batch["id"])["lanes"][GLM]["next"] == 2 and not _batch(svc, batch["id"]).get("stop")
    before = sim_requests(sim_control)
    outcome = asyncio.run(process_group(svc, {**message, "token": running["token"]}, claimed=running,
                                        batch=claimed))
    assert outcome == {"completed": 2}
    assert sim_requests(sim_control) == before + 2
    final = finish(svc, batch["id"], timeout=60)
    shown = ok(api("GET", f"/v1/batches/{batch['id']}", key))
    assert shown["status"] == "cancelled" and shown["error"]["code"] == "max_cost_reached", shown
    assert shown["request_counts"]["completed"] >= 2
    assert 0 < shown["cost_usd"] <= shown["max_cost_usd"]
    assert shown["cost_usd"] + worst > shown["max_cost_usd"]  # it stopped only when the next could not fit
    assert_ledger_consistent(svc, batch["id"], Principal(account=account, key_hash=""))
    assert final["cost_unknown_attempts"] == 0


def test_attempts_of_unknown_cost_keep_their_worst_case_counted(api, svc, sim_control):
    account, key, batch, worst = _capped_batch(api, svc, 6, 2.5)
    Dispatcher(svc).pass_once()
    _, group = _queued_group(svc, batch["id"])
    ledger.start_group(svc, group)  # started; then its worker dies before any outcome is written
    tick(svc, svc.settings.lease_seconds + 1)
    sweep_once(svc)  # the lease is recovered: both attempts may have reached the backend, cost unknown
    recovered = _batch(svc, batch["id"])
    assert recovered["cost_unknown_attempts"] == 2 and recovered["in_flight"] == 0
    # Their worst case stays committed: with 2 of 2.5 worst cases held, nothing more may start, ever.
    assert float(recovered["committed_usd"]) == pytest.approx(2 * worst)
    before = sim_requests(sim_control)
    final = finish(svc, batch["id"], timeout=60)
    assert sim_requests(sim_control) == before  # not one more call
    shown = ok(api("GET", f"/v1/batches/{batch['id']}", key))
    assert shown["status"] == "cancelled" and shown["error"]["code"] == "max_cost_reached", shown
    assert shown["request_counts"] == {"total": 6, "completed": 0, "failed": 2}  # the two that ran, lost
    assert shown["cost_usd"] == 0 and float(final["committed_usd"]) == pytest.approx(2 * worst)
    assert_ledger_consistent(svc, batch["id"], Principal(account=account, key_hash=""))
