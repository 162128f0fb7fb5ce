"""Per-account limits, through the API Lambda handler: a request rate per account by tier, counted in DynamoDB
(so every API instance counts the same calls), with OpenAI's `x-ratelimit-*-requests` headers on every call;
and the results long polls one account may hold at once. Over either: a 429 with `retry-after`, in the
envelope of the API the route belongs to. The clock is the services' (moved, never slept on)."""

from __future__ import annotations

import pytest

from batchinfer.layout import long_polls_key
from batchinfer.runtime import build_services
from batchinfer.service import limits
from batchinfer.service.limits import LongPollHold, take_request
from tests.helpers import anthropic_error, error, new_key, ok, req, settings
from tests.integration.test_message_batches import (
    Messages,
    catalog_file,  # noqa: F401  (a fixture)
    entry,
)

GLM = "glm-5.3-flash"


@pytest.fixture
def clock(svc):
    """The services' clock, moved by the test: 1e9 s, plus whatever `clock.move` added."""

    class Clock:
        now = 1_000_000_000.0

        def move(self, seconds: float) -> None:
            self.now += seconds

    moved = Clock()
    svc.clock = lambda: moved.now
    return moved


def rate_headers(reply) -> tuple[int, int, str]:
    return (int(reply.headers["x-ratelimit-limit-requests"]), int(reply.headers["x-ratelimit-remaining-requests"]),
            reply.headers["x-ratelimit-reset-requests"])


# --- The request rate --------------------------------------------------------------------------------------

def test_every_call_says_its_rate_and_one_past_the_bucket_is_a_429_with_retry_after(api, svc, clock):
    # 6 calls a minute, a minute's worth at once: a bucket of 6, a token every 10 s.
    settings(svc, tier_requests_per_minute={"free": 6, "pro": 6000}, request_burst_seconds=60)
    _, key = new_key(svc, tier="free")
    _, other = new_key(svc, tier="free")
    seen = []
    for _ in range(6):
        reply = api("GET", "/v1/models", key)
        assert reply.status == 200, reply.text
        seen.append(rate_headers(reply))
    assert [remaining for _, remaining, _ in seen] == [5, 4, 3, 2, 1, 0]
    assert {limit for limit, _, _ in seen} == {6}
    assert seen[0][2] == "10s" and seen[-1][2] == "1m0s"  # until the bucket is full again

    refused = api("POST", "/v1/batches", key, json_body={"requests": [req("a")]})
    err = error(refused, 429, "Rate limit reached for requests", "6 requests per minute", code="rate_limit_exceeded")
    assert err["type"] == "rate_limit_error"
    assert refused.headers["retry-after"] == "10" and refused.headers["retry-after-ms"] == "10000"
    assert rate_headers(refused)[:2] == (6, 0)
    # Another account's calls are counted on its own bucket.
    assert api("GET", "/v1/models", other).status == 200

    clock.move(10)  # one token back
    assert api("GET", "/v1/batches", key).status == 200
    assert api("GET", "/v1/batches", key).status == 429
    clock.move(60)  # the bucket full again
    assert rate_headers(api("GET", "/v1/batches", key))[1] == 5


def test_the_rate_is_counted_across_instances_in_the_table(api, svc, clock):
    settings(svc, tier_requests_per_minute={"free": 6}, request_burst_seconds=60)
    account, key = new_key(svc, tier="free")
    for _ in range(3):
        assert api("GET", "/v1/models", key).status == 200
    # Another API instance: its own services and no memory of this account, the same table.
    elsewhere = build_services(svc.settings)
    elsewhere.clock = svc.clock
    limits._last_full_at.clear()
    states = [take_request(elsewhere, account) for _ in range(4)]
    assert [s.remaining for s in states[:3]] == [2, 1, 0] and states[3].retry_after == 10
    assert api("GET", "/v1/models", key).status == 429


def test_an_anthropic_route_refuses_in_anthropics_envelope_with_its_headers_too(api, svc, clock):
    settings(svc, message_batches_enabled=True, tier_requests_per_minute={"pro": 6}, request_burst_seconds=60)
    _, key = new_key(svc)
    messages = Messages(api, key)
    for _ in range(6):
        reply = messages("GET")
        assert reply.status == 200, reply.text
    assert reply.headers["anthropic-ratelimit-requests-remaining"] == "0"
    assert reply.headers["anthropic-ratelimit-requests-reset"].endswith("Z")
    refused = messages.create([entry("a")])
    anthropic_error(refused, 429, "rate_limit_error", "Rate limit reached for requests")
    assert refused.headers["retry-after"] == "10" and refused.headers["x-ratelimit-remaining-requests"] == "0"


def test_by_default_twenty_calls_a_second_never_meet_the_limit(api, svc, clock):
    """A console page open and a few batches polled several times a second, on the smallest tier."""
    _, key = new_key(svc, tier="free")
    batch = api.created(key, [req("a")])
    remaining = []
    for i in range(200):  # ten seconds at 20 calls a second
        clock.move(0.05)
        path = ("/v1/models", f"/v1/batches/{batch['id']}", "/v1/batches")[i % 3]
        reply = api("GET", path, key)
        assert reply.status == 200, (i, reply.text)
        remaining.append(rate_headers(reply)[1])
    assert min(remaining) > 0


def test_a_tier_without_a_rate_sends_no_rate_headers(api, svc, clock):
    settings(svc, tier_requests_per_minute={"free": 6})
    _, key = new_key(svc, tier="internal")
    for _ in range(10):
        reply = api("GET", "/v1/models", key)
        assert reply.status == 200 and "x-ratelimit-limit-requests" not in reply.headers


def test_an_unauthenticated_call_takes_no_token(api, svc, clock):
    settings(svc, tier_requests_per_minute={"free": 6}, request_burst_seconds=60)
    _, key = new_key(svc, tier="free")
    error(api("GET", "/v1/models", "hyi-not-a-key"), 401)
    assert rate_headers(api("GET", "/v1/models", key))[1] == 5


# --- Long polls held at once -------------------------------------------------------------------------------

def test_a_long_poll_past_the_accounts_limit_is_a_429_and_a_plain_read_still_answers(api, svc, clock):
    settings(svc, max_long_polls_per_account=2)
    account, key = new_key(svc)
    batch = api.created(key, [req("a")])
    holds = [LongPollHold(svc, account["id"]) for _ in range(2)]
    for hold in holds:  # two polls of this account wait elsewhere
        hold.take()
    refused = api.results(key, batch["id"], order="finished", wait=5)
    err = error(refused, 429, "Too many long polls", "2", code="too_many_long_polls")
    assert err["type"] == "rate_limit_error" and refused.headers["retry-after"] == "5"
    # Without `wait` the page answers at once and takes no hold.
    assert ok(api.results(key, batch["id"], order="finished"))["data"] == []
    # Another account's polls are its own.
    _, other = new_key(svc)
    theirs = api.created(other, [req("b")])
    assert ok(api.results(other, theirs["id"], order="finished", wait=1))["data"] == []
    holds[0].give_back()
    assert ok(api.results(key, batch["id"], order="finished", wait=1))["data"] == []
    assert svc.table.get(*long_polls_key(account["id"]))["held"] == 1  # the poll gave its hold back


def test_a_hold_left_by_an_instance_that_died_is_cleared_once_its_end_has_passed(api, svc, clock):
    settings(svc, max_long_polls_per_account=1)
    account, key = new_key(svc)
    batch = api.created(key, [req("a")])
    LongPollHold(svc, account["id"]).take()  # never given back
    error(api.results(key, batch["id"], order="finished", wait=1), 429, code="too_many_long_polls")
    clock.move(limits.LONG_POLL_HOLD_SECONDS + 1)
    assert ok(api.results(key, batch["id"], order="finished", wait=1))["data"] == []
    item = svc.table.get(*long_polls_key(account["id"]))
    assert item["held"] == 0 and not [k for k in item if k.startswith("p_")]


def test_a_message_batch_long_poll_past_the_limit_answers_in_anthropics_envelope(api, svc, clock):
    settings(svc, message_batches_enabled=True, max_long_polls_per_account=1)
    account, key = new_key(svc)
    messages = Messages(api, key)
    batch = messages.created([entry("a")])
    LongPollHold(svc, account["id"]).take()
    refused = messages("GET", f"/{batch['id']}/results", query={"order": "finished", "wait": "2"})
    anthropic_error(refused, 429, "rate_limit_error", "Too many long polls")
    assert refused.headers["retry-after"] == "5"
