"""How far behind the sweeper is (SweepLagSeconds, the sweeper-lag alarm): each run reports how late the most
overdue item it found was, from what it queries and reads anyway. On a frozen clock, so the seconds are exact."""

from __future__ import annotations

from batchinfer.records import WebhookEvent
from batchinfer.scheduling.dispatcher import Dispatcher
from batchinfer.service.background.sweep import Overdue, sweep_once
from tests.helpers import chat_request, new_key, settings

GLM = "glm-5.3-flash"


def frozen(svc) -> int:
    now = svc.now()
    svc.clock = lambda: now
    return now


def at(svc, when: int) -> None:
    svc.clock = lambda: when


def swept(svc, **kwargs) -> int | None:
    overdue = Overdue()
    sweep_once(svc, overdue=overdue, **kwargs)
    return overdue.seconds


def test_a_run_with_nothing_overdue_reports_zero_and_one_that_looked_at_nothing_reports_none(svc):
    frozen(svc)
    assert swept(svc) == 0
    assert swept(svc, deadline=0.0) is None  # past its deadline: the run starts nothing, so it knows nothing


def test_the_most_overdue_lease_or_webhook_relay_is_reported(api, svc):
    settings(svc, lease_seconds=60)
    t0 = frozen(svc)
    account, key = new_key(svc)
    bid = api.created(key, [chat_request("l-0", "x")])["id"]
    assert Dispatcher(svc).claim(svc.catalog.get(GLM), limit=1)  # its message is lost: the lease runs out at t0+60
    at(svc, t0 + 150)
    assert swept(svc) == 90  # recovered now, 90 s after its lease ran out

    svc.table.transact([WebhookEvent.create(svc.table, WebhookEvent.new(
        event_id="evt_0", account_id=account["id"], event_type="batch.completed", batch_id=bid, url=None,
        now=t0, relay_at=t0 + 30, keep_until=t0 + 3600))])
    at(svc, t0 + 400)
    assert swept(svc) == 370  # the relay, due at t0+30, is the most overdue item now


def test_a_batch_the_sweeper_expires_late_reports_how_late(api, svc):
    settings(svc, batch_completion_window_seconds=60)
    t0 = frozen(svc)
    _, key = new_key(svc)
    bid = api.created(key, [chat_request("e-0", "x")])["id"]
    at(svc, t0 + 60 + 300)
    assert swept(svc) == 300
    assert api("GET", f"/v1/batches/{bid}", key).json()["status"] == "expired"
