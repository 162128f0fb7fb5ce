"""Completion webhooks on the local stack, as they run deployed: the ending's event goes to the delivery queue
(moto's SQS, real message delays), the webhooks function's pollers deliver it to receivers on 127.0.0.1, and
every delivery is verified with the `standardwebhooks` library. A receiver that never answers holds only its
own deliveries; one that fails at first gets the same event again, later each time."""

from __future__ import annotations

import time

import httpx
import pytest
from standardwebhooks.webhooks import Webhook

from batchinfer.service import accounts
from tests.e2e.conftest import local_stack

pytestmark = pytest.mark.e2e
TIMEOUT = 1.0


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    with local_stack(tmp_path_factory, batch_webhooks_enabled=True, webhook_allow_loopback=True,
                     webhook_retry_base_seconds=1.0, webhook_timeout_seconds=TIMEOUT) as s:
        yield s


def client_for(stack, key: str | None = None) -> httpx.Client:
    if key is None:
        account = accounts.create_account(stack["svc"], tier="pro", batch_access=True)
        key = accounts.create_key(stack["svc"], account["id"])
    return httpx.Client(base_url=stack["base"], headers={"authorization": f"Bearer {key}"}, timeout=30)


def register(api: httpx.Client, url: str) -> str:
    answer = api.put("/batch_webhook", json={"url": url})
    assert answer.status_code == 200, answer.text
    return answer.json()["secret"]


def run_batch(api: httpx.Client) -> tuple[str, float]:
    """A one-request batch run to its end; returns its id and when its end was seen."""
    created = api.post("/batches", json={"requests": [{"custom_id": "a", "body": {
        "model": "glm-5.3-flash", "messages": [{"role": "user", "content": "hi"}]}}]})
    assert created.status_code == 200, created.text
    batch_id = created.json()["id"]
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if api.get(f"/batches/{batch_id}").json()["status"] == "completed":
            return batch_id, time.monotonic()
        time.sleep(0.1)
    raise AssertionError(f"{batch_id} did not complete")


def wait_for(predicate, seconds: float = 30.0) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.05)
    raise AssertionError("timed out")


def test_a_dead_receiver_delays_no_other_accounts_delivery(stack, receiver):
    slow, fast = client_for(stack), client_for(stack)
    receiver.hang["/dead"] = 30  # never answers in time
    register(slow, receiver.url("/dead"))
    secret = register(fast, receiver.url("/alive"))
    run_batch(slow)
    wait_for(lambda: receiver.at("/dead"))  # its first attempt is under way, and hangs
    batch_id, ended = run_batch(fast)
    wait_for(lambda: receiver.at("/alive"), seconds=10)
    waited = time.monotonic() - ended
    [call] = receiver.at("/alive")
    assert Webhook(secret).verify(call["body"], call["headers"])["data"] == {"id": batch_id}
    # Delivered before the dead receiver's attempt gave up (its timeout), plus the pollers' own pace.
    assert waited < TIMEOUT + 1.5, waited
    wait_for(lambda: len(receiver.at("/dead")) >= 2, seconds=15)  # and the dead one is retried meanwhile
    events = slow.get("/batch_webhook/events").json()["data"]
    assert events[0]["delivery"]["attempts"][0]["error"] == f"no answer within {TIMEOUT:g} s"


def test_a_failing_receiver_gets_the_same_event_later_each_time(stack, receiver):
    api = client_for(stack)
    receiver.plan["/flaky"] = [500, 502]
    secret = register(api, receiver.url("/flaky"))
    batch_id, _ = run_batch(api)
    wait_for(lambda: len(receiver.at("/flaky")) == 3, seconds=30)
    calls = receiver.at("/flaky")
    assert len({c["headers"]["webhook-id"] for c in calls}) == 1
    assert all(Webhook(secret).verify(c["body"], c["headers"])["data"] == {"id": batch_id} for c in calls)
    [event] = api.get("/batch_webhook/events").json()["data"]
    assert event["delivery"]["status"] == "delivered"
    assert [a["status_code"] for a in event["delivery"]["attempts"]] == [500, 502, 200]
    at = [a["at"] for a in event["delivery"]["attempts"]]
    assert 1 <= at[1] - at[0] <= at[2] - at[1], at  # 1 s, then about 2 s (whole seconds, +-20%)
    time.sleep(2)
    assert len(receiver.at("/flaky")) == 3  # delivered: nothing more is sent
