"""A paused batch's waiting requests are out of their model's `waiting` count (what tells dispatchers, the
console and the quota's wake-ups that retries wait), and a resume puts them back: the count always equals
the waiting requests of running batches, through pause, resume, a cancel or an expiry while paused, and a
worker putting requests back while paused. The pause and resume walk those requests a page at a time: the
call answers within a few seconds and the sweeper carries the walk on."""

from __future__ import annotations

import itertools

from batchinfer.layout import batch_key, retry_due
from batchinfer.records import Request
from batchinfer.scheduling.dispatcher import Dispatcher
from batchinfer.service.accounts import authenticate
from batchinfer.service.steering import pausing as pausing_module
from local.lambda_runtime import invoke
from tests.helpers import chat_request, finish, new_key, ok, settings, step_by_record
from tests.integration.test_pause import MODEL, later, pause, run_dispatched
from tests.invariants import assert_ledger_consistent, budget_of

BATCHES = itertools.count()


def counted(svc) -> int:
    """What the model's `waiting` count must be: its waiting requests but those a pause put off."""
    keys = svc.table.query_all("due_pk = :d", {":d": retry_due(MODEL)}, index="by_due")
    items = [svc.table.get(k["pk"], k["sk"]) for k in keys]
    return sum(1 for i in items if i and i["state"] == "waiting" and not i.get("uncounted"))


def waiting(svc) -> int:
    shown = int(budget_of(svc, MODEL)["waiting"])
    assert shown == counted(svc), (shown, counted(svc))
    return shown


def flaky_batch(api, svc, key: str, n: int) -> dict:
    """A batch whose `n` requests failed once and wait for their retry, and one that completed."""
    before, tag = waiting(svc), next(BATCHES)  # the simulator fails each body's first attempt once
    batch = api.created(key, [chat_request(f"f-{i}", f"[[sim:flaky:1:500]] {tag}-{i}") for i in range(n)]
                        + [chat_request("plain", "Hello")])
    step_by_record(svc)
    assert waiting(svc) == before + n
    return batch


def test_pause_takes_the_waiting_requests_out_of_the_count_and_resume_puts_them_back(api, svc):
    _, key = new_key(svc)
    batch = flaky_batch(api, svc, key, 4)
    ok(pause(api, key, batch["id"]))
    assert waiting(svc) == 0
    assert Dispatcher(svc).claim(svc.catalog.get(MODEL)) == []
    ok(pause(api, key, batch["id"], "resume"))
    assert waiting(svc) == 4
    ok(pause(api, key, batch["id"]))
    ok(pause(api, key, batch["id"], "resume"))
    assert waiting(svc) == 4
    final = finish(svc, batch["id"])
    assert final["status"] == "completed" and final["completed"] == 5 and waiting(svc) == 0
    assert_ledger_consistent(svc, batch["id"], authenticate(svc, key))


def test_a_cancel_while_paused_leaves_the_count_true(api, svc):
    settings(svc, retry_base_seconds=600.0)  # the other batch's retries wait while this one is paused
    _, key = new_key(svc)
    other = flaky_batch(api, svc, key, 2)  # a running batch's waiting requests stay counted throughout
    batch = flaky_batch(api, svc, key, 3)
    assert waiting(svc) == 5
    ok(pause(api, key, batch["id"]))
    assert waiting(svc) == 2
    cancelled = ok(api("POST", f"/v1/batches/{batch['id']}/cancel", key))
    assert cancelled["status"] == "cancelled" and waiting(svc) == 2
    assert [r["status"] for r in ok(api.results(key, batch["id"]))["data"]] == ["failed"] * 3 + ["completed"]
    later(svc, 1200)
    assert finish(svc, other["id"])["status"] == "completed" and waiting(svc) == 0
    for b in (batch, other):
        assert_ledger_consistent(svc, b["id"], authenticate(svc, key))


def test_an_expiry_while_paused_leaves_the_count_true(api, svc):
    _, key = new_key(svc)
    batch = flaky_batch(api, svc, key, 3)
    ok(pause(api, key, batch["id"]))
    assert waiting(svc) == 0
    later(svc, 24 * 3600 + 1)
    final = finish(svc, batch["id"])
    assert final["status"] == "expired" and waiting(svc) == 0
    assert_ledger_consistent(svc, batch["id"], authenticate(svc, key))


def test_requests_a_worker_puts_back_while_paused_are_not_counted(api, svc):
    _, key = new_key(svc)
    batch = api.created(key, [chat_request(f"q-{i}", "Hello") for i in range(3)])
    queued = Dispatcher(svc).claim(svc.catalog.get(MODEL))
    ok(pause(api, key, batch["id"]))
    run_dispatched(svc, queued)  # the worker finds the batch paused: back to waiting, out of the count
    assert [r["status"] for r in ok(api.results(key, batch["id"]))["data"]] == ["queued"] * 3
    assert waiting(svc) == 0
    ok(pause(api, key, batch["id"], "resume"))
    assert waiting(svc) == 3
    assert finish(svc, batch["id"])["status"] == "completed" and waiting(svc) == 0
    assert_ledger_consistent(svc, batch["id"], authenticate(svc, key))


def test_a_large_pause_answers_at_once_and_the_sweeper_finishes_the_walk(api, svc, monkeypatch):
    """The call walks for a few seconds at most (CALL_SECONDS; none here) and answers paused; the sweeper
    carries the walk on a page at a time. A resume while the pause still walks starts its own walk."""
    monkeypatch.setattr(pausing_module, "WALK_PAGE", 2)
    monkeypatch.setattr(pausing_module, "CALL_SECONDS", 0.0)
    _, key = new_key(svc)
    batch = flaky_batch(api, svc, key, 7)
    paused = ok(pause(api, key, batch["id"]))
    assert paused["paused_at"] and waiting(svc) == 7  # nothing moved yet
    assert svc.table.get(*batch_key(batch["id"]))["pause_walk"]["resume"] is False
    assert Dispatcher(svc).claim(svc.catalog.get(MODEL)) == []  # paused all the same: no claim is let through
    invoke("sweeper", {})
    assert "pause_walk" not in svc.table.get(*batch_key(batch["id"])) and waiting(svc) == 0
    # A resume while a pause walks: the pause's walk stops where it was; the resume's brings back all of them.
    ok(pause(api, key, batch["id"], "resume"))
    ok(pause(api, key, batch["id"]))
    pausing_module.carry_on(svc, svc.table.get(*batch_key(batch["id"])), None)
    assert waiting(svc) == 0
    ok(pause(api, key, batch["id"], "resume"))
    assert waiting(svc) == 0
    invoke("sweeper", {})
    assert waiting(svc) == 7
    final = finish(svc, batch["id"])
    assert final["status"] == "completed" and final["completed"] == 8 and waiting(svc) == 0
    assert_ledger_consistent(svc, batch["id"], authenticate(svc, key))


def test_a_put_off_request_made_due_meanwhile_is_put_off_again_and_counted_once(api, svc):
    """A paused batch's request made due again (as the quota's wake-up makes waiting requests due): the next
    claim of it is refused and puts it off again, and the model's count does not move a second time."""
    settings(svc, retry_base_seconds=600.0)
    _, key = new_key(svc)
    other = flaky_batch(api, svc, key, 1)  # keeps the count above zero: dispatchers look at due retries
    batch = flaky_batch(api, svc, key, 2)
    ok(pause(api, key, batch["id"]))
    assert waiting(svc) == 1
    stored = [r for r in svc.table.query_all("pk = :pk AND begins_with(sk, :r)",
                                             {":pk": f"BATCH#{batch['id']}", ":r": "REQ#"}, consistent=True)
              if r["state"] == "waiting"]
    for r in stored:
        Request.redate(svc.table, r, svc.now())
    assert Dispatcher(svc).claim(svc.catalog.get(MODEL)) == []
    expires = svc.table.get(*batch_key(batch["id"]))["expires_at"]
    assert [svc.table.get(r["pk"], r["sk"])["due_at"] for r in stored] == [expires] * 2 and waiting(svc) == 1
    ok(pause(api, key, batch["id"], "resume"))
    assert waiting(svc) == 3
    later(svc, 1200)
    for b in (batch, other):
        assert finish(svc, b["id"])["status"] == "completed"
    assert waiting(svc) == 0
