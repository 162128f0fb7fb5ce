"""Completion webhooks as a user sees them: registration through the API Lambda handler (Mangum), an event
for every ending, deliveries signed per Standard Webhooks (verified with the `standardwebhooks` library) to a
real HTTP receiver on 127.0.0.1, retries with growing delays, and every address class a webhook may not reach.

Deliveries are made one at a time by calling the webhooks function on the delivery queue's messages, with the
service's clock moved on by the test (tests/e2e/test_webhooks_local.py runs them on the local stack's queue,
with real delays and concurrent records)."""

from __future__ import annotations

import json
import logging

import pytest
from standardwebhooks.webhooks import Webhook, WebhookVerificationError

from batchinfer.layout import batch_key
from batchinfer.records import WebhookEvent
from batchinfer.service.background import webhooks
from batchinfer.service.background.sweep import sweep_once
from local.lambda_runtime import invoke, sqs_event
from tests.helpers import error, finish, new_key, ok, req, settings, tick
from tests.integration.test_files import create_from, jsonl, line, upload
from tests.integration.test_message_batches import V1, entry

CANARY = "CANARY-7f3a9-do-not-leak"
PUBLIC = "93.184.216.34"


@pytest.fixture
def hooks(svc, receiver):
    receiver.calls.clear()
    receiver.plan.clear()
    receiver.hang.clear()
    settings(svc, batch_webhooks_enabled=True, webhook_allow_loopback=True, webhook_retry_base_seconds=10.0,
             webhook_timeout_seconds=2.0, file_batches_enabled=True, message_batches_enabled=True)
    return receiver


def register(api, key: str, url: str, **extra) -> dict:
    return ok(api("PUT", "/v1/batch_webhook", key, json_body={"url": url, **extra}))


def deliver_queued(svc) -> int:
    """Run the webhooks function on every message due on the delivery queue now; returns how many."""
    sqs, url = svc.queues.sqs, svc.queues.webhook_url
    arn = "arn:aws:sqs:us-east-1:000000000000:" + url.rsplit("/", 1)[-1]
    ran = 0
    while got := sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=1).get("Messages", []):
        assert invoke("webhooks", sqs_event(arn, got)).get("batchItemFailures", []) == []
        sqs.delete_message(QueueUrl=url, ReceiptHandle=got[0]["ReceiptHandle"])
        ran += 1
    return ran


def drain_queue(svc) -> None:
    svc.queues.sqs.purge_queue(QueueUrl=svc.queues.webhook_url)


def verified(call: dict, secret: str) -> dict:
    return Webhook(secret).verify(call["body"], call["headers"])


def events(api, key: str, **query) -> dict:
    return ok(api("GET", "/v1/batch_webhook/events", key, query=query or None))


def run_pending(svc, key_events) -> None:
    """Make every pending event's attempts until none is pending: the clock is moved to each next attempt and
    the event's message handed to the delivery (as the delayed SQS message would be)."""
    for _ in range(50):
        pending = [e for e in key_events() if e["delivery"]["status"] == "pending"]
        if not pending:
            return
        for e in pending:
            wait = (e["delivery"]["next_attempt_at"] or 0) - svc.now()
            if wait > 0:
                tick(svc, wait)
            item = svc.table.get(*e["_key"])
            webhooks.deliver(svc, {"pk": item["pk"], "sk": item["sk"]})
    raise AssertionError("events still pending")


# --- Registration -----------------------------------------------------------------------------------------

def test_register_show_change_rotate_and_delete(api, svc, hooks):
    _, key = new_key(svc)
    error(api("GET", "/v1/batch_webhook", key), 404, "No batch webhook is set", code="webhook_not_found")
    first = register(api, key, hooks.url("/a"))
    assert first["object"] == "batch_webhook" and first["url"] == hooks.url("/a")
    secret = first["secret"]
    assert secret.startswith("whsec_") and len(secret) > 30
    shown = ok(api("GET", "/v1/batch_webhook", key))
    assert "secret" not in shown and shown["url"] == hooks.url("/a")
    assert secret not in json.dumps(svc.table.get(f"ACCOUNT#{shown_account(svc, key)}", "WEBHOOK"))  # sealed
    # Changing the URL keeps the secret (and does not show it again).
    moved = register(api, key, hooks.url("/b"))
    assert "secret" not in moved and moved["secret_created_at"] == first["secret_created_at"]
    # A rotation shows a new secret; deliveries are then signed with both for a day.
    rotated = register(api, key, hooks.url("/b"), rotate_secret=True)
    assert rotated["secret"].startswith("whsec_") and rotated["secret"] != secret
    batch = api.created(key, [req("a")])
    finish(svc, batch["id"])
    deliver_queued(svc)
    [call] = hooks.at("/b")
    assert verified(call, rotated["secret"])["data"] == {"id": batch["id"]}
    assert verified(call, secret)["type"] == "batch.completed"  # the old secret still verifies, for now
    assert len(call["headers"]["webhook-signature"].split(" ")) == 2
    # A day later only the new secret signs.
    tick(svc, 24 * 3600 + 1)
    batch = api.created(key, [req("b")])
    finish(svc, batch["id"])
    deliver_queued(svc)
    last = hooks.at("/b")[-1]
    assert verified(last, rotated["secret"])["data"] == {"id": batch["id"]}
    with pytest.raises(WebhookVerificationError):
        verified(last, secret)
    # Delete: gone, and its secret with it.
    assert ok(api("DELETE", "/v1/batch_webhook", key)) == {"object": "batch_webhook.deleted", "url": hooks.url("/b"),
                                                           "deleted": True}
    error(api("GET", "/v1/batch_webhook", key), 404)
    error(api("DELETE", "/v1/batch_webhook", key), 404)
    again = register(api, key, hooks.url("/b"))
    assert again["secret"] not in (secret, rotated["secret"])


def shown_account(svc, key: str) -> str:
    from batchinfer.service.accounts import authenticate

    return authenticate(svc, key).account_id


def test_bad_registrations_change_nothing(api, svc, hooks):
    _, key = new_key(svc)
    error(api("PUT", "/v1/batch_webhook", key, json_body={}), 400, "url", param="url")
    error(api("PUT", "/v1/batch_webhook", key, json_body={"url": hooks.url(), "colour": "red"}), 400, param="colour")
    error(api("PUT", "/v1/batch_webhook", key, json_body={"url": 5}), 400, param="url")
    error(api("PUT", "/v1/batch_webhook", key, body="not json", headers={"content-type": "application/json"}), 400)
    error(api("GET", "/v1/batch_webhook", key), 404)
    settings(svc, batch_webhooks_enabled=False)
    error(api("PUT", "/v1/batch_webhook", key, json_body={"url": hooks.url()}), 400, "Batch webhooks are not enabled",
          code="webhooks_disabled")
    error(api.create(key, [req("a")], webhook_url=hooks.url()), 400, "Batch webhooks are not enabled",
          param="webhook_url")
    assert ok(api("GET", "/v1/batches", key))["data"] == []


FORBIDDEN = [
    ("http://example.com/hook", "https://"),
    ("https://127.0.0.1/hook", "loopback"),
    ("https://localhost/hook", "does not resolve to a public address"),
    ("https://[::1]/hook", "loopback"),
    ("https://10.1.2.3/hook", "private"),
    ("https://172.16.0.1/hook", "private"),
    ("https://192.168.0.10/hook", "private"),
    ("https://169.254.169.254/latest/meta-data", "metadata"),
    ("https://[fd00:ec2::254]/", "metadata"),
    ("https://169.254.10.10/", "link-local"),
    ("https://[fe80::1]/", "link-local"),
    ("https://100.64.0.7/", "CGNAT"),
    ("https://198.18.0.1/", "benchmarking"),
    ("https://192.0.2.10/", "documentation"),
    ("https://[2001:db8::1]/", "documentation"),
    ("https://[3fff::1]/", "documentation"),
    ("https://[2002:cb00:7101::1]/", "6to4 form of 203.0.113.1"),
    ("https://[64:ff9b:1::808:808]/", "local-use NAT64"),
    ("https://224.0.0.251/", "multicast"),
    ("https://[ff02::1]/", "multicast"),
    ("https://0.0.0.0/", "unspecified"),
    ("https://[::]/", "unspecified"),
    ("https://240.0.0.1/", "reserved"),
    ("https://[fc00::1]/", "private"),
    ("https://[::ffff:10.0.0.1]/", "IPv4-mapped"),
    ("https://[::ffff:0:7f00:1]/", "IPv4-translated"),
    ("https://[64:ff9b::a9fe:a9fe]/", "NAT64"),
    ("https://[2002:c0a8:101::1]/", "6to4"),
    ("https://[2001:0:4136:e378:8000:63bf:f5ff:fffe]/", "Teredo"),
    ("https://2130706433/", "non-canonical"),
    ("https://0x7f.0.0.1/", "non-canonical"),
    ("https://017700000001/", "non-canonical"),
    ("https://127.1/", "non-canonical"),
    ("https://0x7f000001/", "non-canonical"),
    ("https://user:pw@example.com/", "user name"),
    ("https://intranet.example/", "'intranet.example' does not resolve to a public address"),
    ("https://missing.example/", "'missing.example' does not resolve to a public address"),
    ("ftp://example.com/", "https://"),
    ("https:///nohost", "no host"),
]


@pytest.mark.parametrize(("url", "why"), FORBIDDEN, ids=[u for u, _ in FORBIDDEN])
def test_every_forbidden_address_class_is_refused_at_registration(api, svc, hooks, url, why):
    settings(svc, webhook_allow_loopback=False)
    svc.resolve = lambda host, port: {"intranet.example": ["10.9.8.7", PUBLIC], "localhost": ["127.0.0.1", "::1"],
                                      "missing.example": []}.get(host, [PUBLIC])
    _, key = new_key(svc)
    err = error(api("PUT", "/v1/batch_webhook", key, json_body={"url": url}), 400, why, code="invalid_webhook_url",
                param="url")
    assert err["message"].startswith("Invalid 'url': ")
    if "does not resolve" in why:
        # What a name resolved to is never echoed, nor why it was refused: the check reads no internal DNS out.
        for leak in ("10.9.8.7", "127.0.0.1", "::1", PUBLIC, "private", "loopback", "resolves to"):
            assert leak not in err["message"]
    error(api("GET", "/v1/batch_webhook", key), 404)


def test_a_public_url_is_accepted_and_loopback_only_with_the_switch(api, svc, hooks):
    settings(svc, webhook_allow_loopback=False)
    svc.resolve = lambda host, port: [PUBLIC]
    _, key = new_key(svc)
    assert register(api, key, "https://hooks.example.com/batches")["secret"].startswith("whsec_")
    error(api("PUT", "/v1/batch_webhook", key, json_body={"url": hooks.url()}), 400, "loopback")
    settings(svc, webhook_allow_loopback=True)
    assert register(api, key, hooks.url())["url"] == hooks.url()
    # With the switch on, other private classes stay refused.
    error(api("PUT", "/v1/batch_webhook", key, json_body={"url": "https://10.0.0.1/"}), 400, "private")


def test_a_host_that_resolves_public_then_private_is_refused_at_delivery(api, svc, hooks):
    """DNS rebinding: checked at registration (public), checked again at the delivery (now private): nothing
    is sent, the attempt says why, and it is retried like any failed attempt."""
    answers = iter([[PUBLIC], ["10.0.0.5"], ["10.0.0.5"]])
    svc.resolve = lambda host, port: next(answers)
    _, key = new_key(svc)
    register(api, key, "https://rebind.example.com/hook")
    batch = api.created(key, [req("a")])
    finish(svc, batch["id"])
    deliver_queued(svc)
    assert hooks.calls == []
    [event] = events(api, key)["data"]
    [attempt] = event["delivery"]["attempts"]
    assert attempt["status_code"] is None and "does not resolve to a public address" in attempt["error"]
    assert "10.0.0.5" not in attempt["error"] and "private" not in attempt["error"]
    assert event["delivery"]["status"] == "pending" and event["delivery"]["next_attempt_at"] > attempt["at"]


def test_the_delivery_connects_to_the_checked_address_with_the_hostname_in_host(api, svc, hooks):
    """The name resolves (stub) to 127.0.0.1 once, when checked; the connection goes to that address, with
    the hostname in Host. (A second lookup would answer a private address and be refused.)"""
    looked_up: list[str] = []

    def resolve(host: str, port: int) -> list[str]:
        looked_up.append(host)
        return ["127.0.0.1"] if len(looked_up) % 2 else ["10.0.0.9"]

    svc.resolve = resolve
    _, key = new_key(svc)
    secret = register(api, key, f"http://hooks.example.test:{hooks.server.port}/named")["secret"]
    looked_up.append("-")  # the registration's lookup; the delivery's is the next, answered 127.0.0.1
    batch = api.created(key, [req("a")])
    finish(svc, batch["id"])
    deliver_queued(svc)
    [call] = hooks.at("/named")
    assert call["headers"]["host"] == f"hooks.example.test:{hooks.server.port}"
    assert verified(call, secret)["data"]["id"] == batch["id"]


# --- Events -----------------------------------------------------------------------------------------------

def test_every_ending_produces_exactly_one_event(api, svc, hooks, sim_control):
    account, key = new_key(svc)
    secret = register(api, key, hooks.url("/all"))["secret"]
    completed = api.created(key, [req("a")])
    finish(svc, completed["id"])
    cancelled = api.created(key, [req("b")])
    ok(api("POST", f"/v1/batches/{cancelled['id']}/cancel", key))
    expired = api.created(key, [req("c")])
    bad = ok(upload(api, key, jsonl(line("x"), "{not json")))
    failed = ok(create_from(api, key, bad["id"]))
    tick(svc, 86400 + 1)  # the window of `expired` closes before it started
    finish(svc, expired["id"])
    finish(svc, failed["id"])
    message_batch = ok(api("POST", "/v1/messages/batches", key, json_body={"requests": [entry("m")]},
                           headers={"anthropic-version": V1}))
    finish(svc, message_batch["id"])
    for _ in range(3):  # more sweeps: a settled batch is never announced again
        sweep_once(svc)
    deliver_queued(svc)
    got = {verified(c, secret)["data"]["id"]: verified(c, secret)["type"] for c in hooks.at("/all")}
    assert got == {completed["id"]: "batch.completed", cancelled["id"]: "batch.cancelled",
                   expired["id"]: "batch.expired", failed["id"]: "batch.failed",
                   message_batch["id"]: "message_batch.ended"}
    assert len(hooks.at("/all")) == 5
    listed = events(api, key)["data"]
    assert {e["data"]["id"] for e in listed} == set(got) and len(listed) == 5
    assert listed[0]["data"]["id"] == message_batch["id"] and listed[-1]["data"]["id"] == completed["id"]
    assert [e["id"] for e in listed] == sorted((e["id"] for e in listed), reverse=True)  # newest first
    for e in listed:
        body = json.loads(next(c["body"] for c in hooks.calls if verified(c, secret)["id"] == e["id"]))
        assert body == {"id": e["id"], "object": "event", "type": e["type"], "created_at": e["created_at"],
                        "data": {"id": e["data"]["id"]}}
        assert e["delivery"]["status"] == "delivered" and e["delivery"]["next_attempt_at"] is None
        [attempt] = e["delivery"]["attempts"]
        assert attempt["status_code"] == 200 and attempt["error"] is None and attempt["url"] == hooks.url("/all")
    # Paging, newest first.
    page = events(api, key, limit="2")
    assert [e["id"] for e in page["data"]] == [e["id"] for e in listed[:2]] and page["has_more"] is True
    rest = events(api, key, limit="10", after=page["last_id"])
    assert [e["id"] for e in rest["data"]] == [e["id"] for e in listed[2:]] and rest["has_more"] is False
    error(api("GET", "/v1/batch_webhook/events", key, query={"limit": "0"}), 400, param="limit")
    error(api("GET", "/v1/batch_webhook/events", key, query={"after": "batch_1"}), 400, param="after")
    # Another account sees none of them.
    _, other = new_key(svc)
    assert events(api, other)["data"] == []


def test_no_webhook_no_event_and_a_batch_of_its_own_url(api, svc, hooks):
    _, key = new_key(svc)
    quiet = api.created(key, [req("a")])
    finish(svc, quiet["id"])
    assert deliver_queued(svc) == 0 and events(api, key)["data"] == []
    # A batch's own webhook_url needs the account's secret.
    error(api.create(key, [req("a")], webhook_url=hooks.url("/own")), 400, "PUT /v1/batch_webhook",
          code="webhook_secret_missing", param="webhook_url")
    secret = register(api, key, hooks.url("/account"))["secret"]
    error(api.create(key, [req("a")], webhook_url="https://10.0.0.1/x"), 400, "private", param="webhook_url")
    own = api.created(key, [req("a")], webhook_url=hooks.url("/own"))
    assert own["webhook_url"] == hooks.url("/own")
    finish(svc, own["id"])
    deliver_queued(svc)
    [call] = hooks.at("/own")
    assert verified(call, secret)["data"] == {"id": own["id"]}
    assert hooks.at("/account") == []
    # A file batch too.
    uploaded = ok(upload(api, key, jsonl(line("f"))))
    from_file = ok(create_from(api, key, uploaded["id"], webhook_url=hooks.url("/file")))
    finish(svc, from_file["id"])
    deliver_queued(svc)
    assert verified(hooks.at("/file")[0], secret)["type"] == "batch.completed"


def test_a_failing_receiver_gets_retries_with_growing_delays_and_the_same_id_capped_at_8(api, svc, hooks):
    _, key = new_key(svc)
    secret = register(api, key, hooks.url("/down"))["secret"]
    hooks.plan["/down"] = [500] * 20
    batch = api.created(key, [req("a")])
    finish(svc, batch["id"])
    deliver_queued(svc)

    def listed():
        return [{**e, "_key": (f"ACCOUNT#{shown_account(svc, key)}", "WHEVENT#" + e["id"])}
                for e in events(api, key)["data"]]

    run_pending(svc, listed)
    [event] = events(api, key)["data"]
    attempts = event["delivery"]["attempts"]
    assert event["delivery"]["status"] == "failed" and len(attempts) == 8 == len(hooks.at("/down"))
    assert all(a["status_code"] == 500 and a["error"] == "answered 500" for a in attempts)
    ids = {c["headers"]["webhook-id"] for c in hooks.at("/down")}
    assert ids == {event["id"]}
    for c in hooks.at("/down"):
        verified(c, secret)  # every attempt signed
    gaps = [b["at"] - a["at"] for a, b in zip(attempts, attempts[1:], strict=False)]
    assert all(later > earlier for earlier, later in zip(gaps, gaps[1:], strict=False)), gaps
    for n, gap in enumerate(gaps):  # base 10 s doubled per attempt, +-20% jitter
        assert 10 * 2 ** n * 0.8 - 1 <= gap <= 10 * 2 ** n * 1.2 + 1, gaps
    # Nothing more is tried, whatever comes back from the queue.
    item = svc.table.get(f"ACCOUNT#{shown_account(svc, key)}", "WHEVENT#" + event["id"])
    assert webhooks.deliver(svc, {"pk": item["pk"], "sk": item["sk"]}) == "stale"
    assert len(hooks.at("/down")) == 8


def test_a_receiver_that_recovers_gets_the_event_once_it_answers(api, svc, hooks):
    _, key = new_key(svc)
    secret = register(api, key, hooks.url("/flaky"))["secret"]
    hooks.plan["/flaky"] = [503, 500]
    batch = api.created(key, [req("a")])
    finish(svc, batch["id"])
    deliver_queued(svc)
    item = WebhookEvent.of_account(svc.table, shown_account(svc, key), 1, None)[0][0]
    for _ in range(2):
        tick(svc, svc.table.get(item["pk"], item["sk"])["next_attempt_at"] - svc.now())
        webhooks.deliver(svc, {"pk": item["pk"], "sk": item["sk"]})
    [event] = events(api, key)["data"]
    assert event["delivery"]["status"] == "delivered"
    assert [a["status_code"] for a in event["delivery"]["attempts"]] == [503, 500, 200]
    assert [verified(c, secret)["id"] for c in hooks.at("/flaky")] == [event["id"]] * 3


def test_a_lost_queue_message_is_sent_again_by_the_sweeper(api, svc, hooks):
    _, key = new_key(svc)
    secret = register(api, key, hooks.url("/lost"))["secret"]
    batch = api.created(key, [req("a")])
    finish(svc, batch["id"])
    drain_queue(svc)  # the first delivery's message is lost
    deliver_queued(svc)
    assert hooks.at("/lost") == []
    sweep_once(svc)
    assert deliver_queued(svc) == 0  # not yet: the message may still be on its way
    tick(svc, svc.settings.webhook_relay_seconds + 1)
    assert sweep_once(svc)["webhook_events_resent"] == 1
    deliver_queued(svc)
    [call] = hooks.at("/lost")
    assert verified(call, secret)["data"] == {"id": batch["id"]}
    assert sweep_once(svc)["webhook_events_resent"] == 0
    assert deliver_queued(svc) == 0 and len(hooks.at("/lost")) == 1


def test_a_removed_webhook_skips_the_events_not_yet_delivered(api, svc, hooks):
    _, key = new_key(svc)
    register(api, key, hooks.url("/gone"))
    batch = api.created(key, [req("a")])
    finish(svc, batch["id"])
    ok(api("DELETE", "/v1/batch_webhook", key))
    deliver_queued(svc)
    assert hooks.at("/gone") == []
    [event] = events(api, key)["data"]
    assert event["delivery"]["status"] == "skipped" and "removed" in event["delivery"]["reason"]


def test_nothing_of_a_prompt_or_result_in_any_event_or_log_line(api, svc, hooks, caplog):
    # The service's own loggers at DEBUG, every other at INFO (botocore logs whole AWS calls at DEBUG).
    caplog.set_level(logging.INFO)
    caplog.set_level(logging.DEBUG, logger="batchinfer")
    _, key = new_key(svc)
    secret = register(api, key, hooks.url("/canary"))["secret"]
    hooks.plan["/canary"] = [500]
    batch = api.created(key, [req(f"id-{CANARY}", f"Say {CANARY}")], metadata={"tag": CANARY})
    finish(svc, batch["id"])
    deliver_queued(svc)
    item = WebhookEvent.of_account(svc.table, shown_account(svc, key), 1, None)[0][0]
    tick(svc, item["next_attempt_at"] - svc.now())
    webhooks.deliver(svc, {"pk": item["pk"], "sk": item["sk"]})
    assert len(hooks.at("/canary")) == 2
    seen = [c["body"] + json.dumps(c["headers"]) for c in hooks.at("/canary")]
    seen.append(json.dumps(events(api, key)))
    seen.append(json.dumps(svc.table.get(item["pk"], item["sk"]), default=str))
    seen += [r.getMessage() for r in caplog.records]
    assert any("webhook event" in line for line in seen)  # the delivery did log
    leaks = [line for line in seen if CANARY in line or secret in line]
    assert not leaks, leaks[:3]
    assert svc.table.get(*batch_key(batch["id"]))["metadata"] == {"tag": CANARY}  # the canary was there
