"""Results as they finish (`order=finished`, a cursor, long polling) and results filtered by status or custom id:
extensions beyond the OpenAI and Anthropic APIs, through the HTTP API."""

from __future__ import annotations

import json
import time

import pytest

from batchinfer.layout import batch_key
from batchinfer.records.finished_order import entry_number
from tests.helpers import anthropic_error, error, finish, new_key, ok, req, services_in_use, settings, step_by_record
from tests.integration.test_message_batches import (
    Messages,
    catalog_file,  # noqa: F401  (a fixture)
    entry,
)
from tests.integration.test_retry import FLAKY, retry


def feed(api, key: str, batch_id: str, **query) -> dict:
    return ok(api.results(key, batch_id, order="finished", **query))


def read_all(api, key: str, batch_id: str, cursor: str | None = None, limit: int = 2) -> tuple[list[dict], str]:
    """Every page from `cursor` on until has_more is false: (the results, the last cursor)."""
    seen = []
    while True:
        page = feed(api, key, batch_id, limit=limit, **({"after": cursor} if cursor else {}))
        assert len(page["data"]) <= limit and page["first_id"] is None
        seen += page["data"]
        cursor = page["last_id"]
        if not page["has_more"]:
            return seen, cursor


def test_finished_results_come_once_each_in_the_order_they_finished_while_the_batch_runs(api, svc):
    _, key = new_key(svc)
    batch = api.created(key, [req(f"r{i}") for i in range(7)])
    empty = feed(api, key, batch["id"])
    assert (empty["data"], empty["has_more"], empty["batch_status"]) == ([], False, "validating")
    assert empty["last_id"].startswith("feed_")

    seen, cursor = read_all(api, key, batch["id"], empty["last_id"])
    assert seen == []
    step_by_record(svc)  # a first round: the batch's requests run and are counted
    during, cursor = read_all(api, key, batch["id"], cursor)
    assert during and all(r["status"] == "completed" and r["response"]["status_code"] == 200 for r in during)
    finish(svc, batch["id"])
    rest, cursor = read_all(api, key, batch["id"], cursor)
    everything = during + rest
    assert sorted(r["custom_id"] for r in everything) == sorted(f"r{i}" for i in range(7))  # once each
    assert feed(api, key, batch["id"], after=cursor) == {
        "object": "list", "data": [], "first_id": None, "last_id": cursor, "has_more": False,
        "batch_status": "completed"}
    # The same results as in submission order, read from the start in one page.
    whole = feed(api, key, batch["id"], limit=100)
    assert [r["custom_id"] for r in whole["data"]] == [r["custom_id"] for r in everything]
    plain = ok(api.results(key, batch["id"]))
    assert {r["custom_id"]: r for r in plain["data"]} == {r["custom_id"]: r for r in everything}
    # The default results stay in submission order with result IDs as cursors.
    assert [r["custom_id"] for r in plain["data"]] == [f"r{i}" for i in range(7)]
    assert plain["last_id"] == "batch_req_7" and "batch_status" not in plain


def test_an_empty_page_is_held_up_to_wait_seconds_but_not_once_the_batch_has_ended(api, svc):
    _, key = new_key(svc)
    batch = api.created(key, [req("a")])
    started = time.monotonic()
    held = feed(api, key, batch["id"], wait=1)
    assert held["data"] == [] and time.monotonic() - started >= 0.9
    finish(svc, batch["id"])
    started = time.monotonic()
    page = feed(api, key, batch["id"], wait=25, after=held["last_id"])
    assert [r["custom_id"] for r in page["data"]] == ["a"] and time.monotonic() - started < 5
    started = time.monotonic()
    end = feed(api, key, batch["id"], wait=25, after=page["last_id"])
    assert end["data"] == [] and end["batch_status"] == "completed" and time.monotonic() - started < 5


def test_a_cancelled_batch_ends_its_feed_with_the_requests_that_never_ran(api, svc):
    _, key = new_key(svc)
    batch = api.created(key, [req(f"r{i}") for i in range(4)])
    ok(api("POST", f"/v1/batches/{batch['id']}/cancel", key))
    finish(svc, batch["id"])
    seen, _ = read_all(api, key, batch["id"], limit=3)
    assert [(r["custom_id"], r["status"]) for r in seen] == [(f"r{i}", "cancelled") for i in range(4)]


def test_a_request_retried_in_place_appears_again_with_its_new_result(api, svc):
    settings(svc, max_attempts=1)
    _, key = new_key(svc)
    batch = api.created(key, [req("ok"), req("flaky", FLAKY)])
    finish(svc, batch["id"])
    first, cursor = read_all(api, key, batch["id"])
    assert sorted((r["custom_id"], r["status"]) for r in first) == [("flaky", "failed"), ("ok", "completed")]
    ok(retry(api, key, batch["id"]))
    assert feed(api, key, batch["id"], after=cursor)["data"] == []  # queued again: nothing new has finished
    finish(svc, batch["id"])
    again, _ = read_all(api, key, batch["id"], cursor)
    assert [(r["custom_id"], r["status"]) for r in again] == [("flaky", "completed")]
    # A reader starting after the retry sees each request once, with its result as it is now.
    fresh, _ = read_all(api, key, batch["id"])
    assert sorted((r["custom_id"], r["status"]) for r in fresh) == [("flaky", "completed"), ("ok", "completed")]


def test_status_and_custom_id_keep_only_their_results_with_an_exact_has_more(api, svc):
    settings(svc, max_attempts=1)
    _, key = new_key(svc)
    batch = api.created(key, [req("bad-1", "[[sim:400]]"), req("ok-1"), req("bad-2", "[[sim:400]]"), req("ok-2"),
                              req("ok-3")])
    queued = ok(api.results(key, batch["id"], status="queued"))
    assert len(queued["data"]) == 5 and queued["has_more"] is False
    assert ok(api.results(key, batch["id"], status="failed"))["data"] == []
    finish(svc, batch["id"])
    page = ok(api.results(key, batch["id"], status="failed", limit=1))
    assert [r["custom_id"] for r in page["data"]] == ["bad-1"] and page["has_more"] is True
    page = ok(api.results(key, batch["id"], status="failed", limit=1, after=page["last_id"]))
    # The last failed one: has_more is false although completed results follow it.
    assert [r["custom_id"] for r in page["data"]] == ["bad-2"] and page["has_more"] is False
    assert page["first_id"] == page["last_id"] == "batch_req_3"
    one = ok(api.results(key, batch["id"], custom_id="ok-2"))
    assert [(r["custom_id"], r["status"], r["id"]) for r in one["data"]] == [("ok-2", "completed", "batch_req_4")]
    assert ok(api.results(key, batch["id"], custom_id="ok-2", status="failed"))["data"] == []
    assert ok(api.results(key, batch["id"], custom_id="nobody"))["data"] == []
    assert ok(api.results(key, batch["id"], custom_id="ok-2", after="batch_req_4"))["data"] == []
    finished_failed = feed(api, key, batch["id"], status="failed")
    assert sorted(r["custom_id"] for r in finished_failed["data"]) == ["bad-1", "bad-2"]


def test_bad_values_are_refused_with_the_parameter_named(api, svc):
    _, key = new_key(svc)
    batch = api.created(key, [req("a")])
    results = f"/v1/batches/{batch['id']}/results"
    for query, param in (({"status": "done"}, "status"), ({"order": "finished", "wait": "26"}, "wait"),
                         ({"order": "finished", "wait": "-1"}, "wait"), ({"order": "finished", "wait": "x"}, "wait"),
                         ({"wait": "5"}, "wait"), ({"order": "sideways"}, "order"),
                         ({"order": "finished", "after": "batch_req_1"}, "after"),
                         ({"order": "finished", "after": "feed_!!"}, "after"),
                         ({"order": "finished", "status": "nope"}, "status"),
                         ({"status": "failed", "after": "nope"}, "after"),
                         ({"order": "finished", "limit": "0"}, "limit")):
        error(api("GET", results, key, query=query), 400, param=param)
    error(api("GET", "/v1/batches/batch_nope/results", key, query={"order": "finished"}), 404)


@pytest.fixture
def message_batches(api, svc, sim, catalog_file):  # noqa: F811
    with services_in_use(svc, sim.url, "feed", models_file=str(catalog_file),
                         message_batches_enabled=True) as services:
        _, key = new_key(services)
        yield key, services


def test_a_message_batch_pages_its_results_as_they_finish_and_its_jsonl_is_unchanged(api, message_batches):
    key, services = message_batches
    for prefix in ("/anthropic", ""):
        messages = Messages(api, key, prefix=prefix)
        batch = messages.created([entry("a"), entry("b")])
        # The plain results still wait for the batch's end.
        anthropic_error(messages("GET", f"/{batch['id']}/results"), 400, "invalid_request_error")
        page = ok(messages("GET", f"/{batch['id']}/results", query={"order": "finished"}))
        assert (page["data"], page["has_more"], page["batch_status"]) == ([], False, "in_progress")
        finish(services, batch["id"])
        page = ok(messages("GET", f"/{batch['id']}/results", query={"order": "finished", "after": page["last_id"]}))
        assert sorted(line["custom_id"] for line in page["data"]) == ["a", "b"]
        assert {line["result"]["type"] for line in page["data"]} == {"succeeded"}
        assert page["batch_status"] == "ended" and page["has_more"] is False
        assert [line["custom_id"] for line in messages.results(batch["id"])] == ["a", "b"]
        anthropic_error(messages("GET", f"/{batch['id']}/results", query={"order": "finished", "wait": "99"}), 400,
                        "invalid_request_error", "wait")


def test_the_log_holds_one_entry_per_counted_close(api, svc):
    """What the write path adds: one small entry per group's close (not one per request)."""
    _, key = new_key(svc)
    batch = api.created(key, [req(f"r{i}") for i in range(30)])
    finish(svc, batch["id"])
    pk, _ = batch_key(batch["id"])
    entries = list(svc.table.query_all("pk = :pk AND begins_with(sk, :f)", {":pk": pk, ":f": "FEED#"},
                                       consistent=True))
    assert [entry_number(e) for e in entries] == list(range(1, len(entries) + 1))  # contiguous
    assert {frozenset(e) for e in entries} == {frozenset({"pk", "sk", "members", "ttl"})}  # nothing else
    assert sorted(m[0] for e in entries for m in e["members"]) == list(range(30))
    assert len(entries) < 30 and max(len(json.dumps(e["members"])) for e in entries) < 2000
