"""A batch paused on its account (the day's quota used up, batch access off) goes on as soon as an operator
raises the quota or restores the access (`batchctl admin set`, i.e. `accounts.update_account`), not at 00:00
UTC: through the HTTP API and the real dispatcher, worker and sweeper handlers."""

from __future__ import annotations

from batchinfer.domain import next_utc_midnight
from batchinfer.layout import batch_key
from batchinfer.scheduling.dispatcher import Dispatcher
from batchinfer.service import accounts
from tests.helpers import new_key, ok, req, sim_requests, step_by_record, tick

GLM = "glm-5.3-flash"
LONG = {"model": GLM, "messages": [{"role": "user", "content": "word " * 2000}]}  # $0.0002 of input


def _run_queued(svc) -> None:
    """The worker handler on what the dispatcher queued, nothing else (no new claim, no sweep)."""
    from local.lambda_runtime import invoke, sqs_event

    sqs = svc.queues.sqs
    for url in svc.queues.urls.values():
        arn = "arn:aws:sqs:us-east-1:000000000000:" + url.rsplit("/", 1)[-1]
        while got := sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=1).get("Messages", []):
            assert invoke("worker", sqs_event(arn, got)).get("batchItemFailures", []) == []
            sqs.delete_message(QueueUrl=url, ReceiptHandle=got[0]["ReceiptHandle"])


def _paused(api, svc, key: str, batch_id: str, sim_control) -> int:
    before = sim_requests(sim_control)
    for _ in range(3):
        step_by_record(svc)
    shown = ok(api("GET", f"/v1/batches/{batch_id}", key))
    # Not started (`validating` while none of its requests was ever claimed), or started and waiting.
    assert shown["status"] in ("validating", "in_progress"), shown
    assert shown["request_counts"]["completed"] == 0, shown
    assert sim_requests(sim_control) == before  # nothing of it ran
    return before


def _finishes_without_waiting_for_midnight(svc, batch_id: str, rounds: int = 6) -> dict:
    midnight = next_utc_midnight(svc.now())
    for _ in range(rounds):
        step_by_record(svc)
        batch = svc.table.get(*batch_key(batch_id))
        if batch["status"] == "completed":
            assert svc.now() < midnight
            return batch
    raise AssertionError(f"batch {batch_id} still {batch['status']} after the change")


def test_a_quota_raise_lets_requests_that_waited_for_midnight_run_at_once(api, svc, sim_control):
    account, key = new_key(svc, daily_quota_usd=1e-4)
    batch = api.created(key, [req(f"q-{i}") for i in range(6)])
    Dispatcher(svc).pass_once()  # claimed (and queued) while the quota had room
    ok(api("POST", "/v1/chat/completions", key, json_body=LONG))  # the day's quota is used up from here
    _run_queued(svc)  # the worker's check before the start: they wait for 00:00 UTC
    waiting = [i for i in svc.table.query_all("pk = :pk AND begins_with(sk, :r)",
                                              {":pk": f"BATCH#{batch['id']}", ":r": "REQ#"}, consistent=True)]
    assert waiting and {i["state"] for i in waiting} == {"waiting"}
    assert {int(i["due_at"]) for i in waiting} == {next_utc_midnight(svc.now())}
    tick(svc, 2)
    before = _paused(api, svc, key, batch["id"], sim_control)
    accounts.update_account(svc, account["id"], daily_quota_usd=100)  # what `batchctl admin set` calls
    final = _finishes_without_waiting_for_midnight(svc, batch["id"])
    assert final["completed"] == 6
    assert sim_requests(sim_control) == before + 6


def test_restored_batch_access_lets_waiting_requests_run_before_the_recheck(api, svc, sim_control):
    account, key = new_key(svc)
    batch = api.created(key, [req(f"a-{i}") for i in range(4)])
    Dispatcher(svc).pass_once()
    accounts.update_account(svc, account["id"], batch_access=False)
    _run_queued(svc)
    before = _paused(api, svc, key, batch["id"], sim_control)
    accounts.update_account(svc, account["id"], batch_access=True)
    final = _finishes_without_waiting_for_midnight(svc, batch["id"], rounds=3)  # the clock never moved
    assert final["completed"] == 4
    assert sim_requests(sim_control) == before + 4


def test_a_quota_still_used_up_after_the_change_keeps_the_batch_paused(api, svc, sim_control):
    account, key = new_key(svc, daily_quota_usd=1e-4)
    batch = api.created(key, [req("x")])
    ok(api("POST", "/v1/chat/completions", key, json_body=LONG))
    tick(svc, 2)
    _paused(api, svc, key, batch["id"], sim_control)
    accounts.update_account(svc, account["id"], daily_quota_usd=1.5e-4)  # raised, still below what was spent
    _paused(api, svc, key, batch["id"], sim_control)
