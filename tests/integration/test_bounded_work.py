"""Bounded work, resumable: every scheduled run stops starting work at its deadline and the next run goes on
where it stopped; a delete answers at once and the sweeper purges in later runs, whatever the batch's size.

Deadlines run on a fake clock (each look at it is one tick), so how much a run does is fixed, not timed."""

from __future__ import annotations

import json
import time
import types
from collections import Counter

import pytest

from batchinfer.errors import ApiError
from batchinfer.layout import (
    account_key,
    batch_key,
    export_object,
    lanes_of,
    model_budget_key,
    request_sk,
    result_object,
    retry_due,
)
from batchinfer.operations.anthropic import message_batches
from batchinfer.service import lifecycle
from batchinfer.service.accounts import authenticate
from batchinfer.service.background import finalize, sweep, webhooks
from batchinfer.service.background.sweep import sweep_once
from local.lambda_runtime import FakeContext, load_handler
from tests.helpers import chat_request, error, finish, new_key, ok, s3_keys, settings, step_by_record, tiny

GLM = "glm-5.3-flash"
NOTHING_DONE = {"recovered": 0, "settled": 0, "expired": 0, "purged": 0, "webhook_events_resent": 0}


class Ticks:
    """A fake time.monotonic for the modules that watch a deadline: every look advances it by one."""

    def __init__(self) -> None:
        # Far below any real time.monotonic(): a deadline the handler takes from the real clock lies ahead of
        # the fake one on any machine, however recently it booted.
        self.value = -1e6

    def monotonic(self) -> float:
        self.value += 1
        return self.value

    def deadline(self, looks: int) -> float:
        """A deadline that many looks from now."""
        return self.value + looks


@pytest.fixture
def ticks(monkeypatch) -> Ticks:
    clock = Ticks()
    fake = types.SimpleNamespace(monotonic=clock.monotonic, time=time.time, sleep=time.sleep)
    for module in (lifecycle, sweep, finalize, webhooks):
        monkeypatch.setattr(module, "time", fake)
    return clock


def batch_items(svc, batch_id: str) -> list[dict]:
    """Everything under the batch's partition: the batch item, its groups and request items."""
    pk, _ = batch_key(batch_id)
    return list(svc.table.query_all("pk = :pk", {":pk": pk}, consistent=True))


def lanes_of_batch(svc, batch_id: str) -> list[dict]:
    pk, prefix = lanes_of(GLM)
    return [lane for lane in svc.table.query_all("pk = :pk AND begins_with(sk, :l)", {":pk": pk, ":l": prefix})
            if lane["batch_id"] == batch_id]


def write_request_items(svc, batch: dict, n: int, waiting: int) -> None:
    """Request items as the worker leaves them, written directly (far quicker than running them): `waiting`
    of them wait for a retry and count in the model's `waiting`, the others completed."""
    pk, _ = batch_key(batch["id"])
    items = []
    for i in range(n):
        item = {"pk": pk, "sk": request_sk(i), "batch_id": batch["id"], "index": i, "custom_id": str(i), "model": GLM,
                "account_id": batch["account_id"], "token": f"t{i}", "attempt": 1,
                "state": "waiting" if i < waiting else "completed"}
        if i < waiting:
            item.update({"due_pk": retry_due(GLM), "due_at": 1})
        items.append(item)
    from batchinfer.storage.dynamo import serialize

    for at in range(0, n, 25):
        svc.table.client.batch_write_item(RequestItems={svc.table.name: [
            {"PutRequest": {"Item": serialize(item)}} for item in items[at:at + 25]]})
    svc.table.update(*model_budget_key(GLM), "ADD waiting :n", vals={":n": waiting})


def unfinished(svc, account_id: str) -> tuple[int, int]:
    account = svc.table.get(*account_key(account_id))
    return account.get("unfinished_batches", 0), account.get("unfinished_requests", 0)


# --- Delete answers at once; the purge runs in the background ---------------------------------------

def test_deleting_a_50000_request_batch_answers_at_once_and_short_sweeps_purge_it(api, svc, ticks, monkeypatch):
    account, key = new_key(svc)
    batch = api.created(key, [tiny(i) for i in range(50_000)])
    bid = batch["id"]
    item = svc.table.get(*batch_key(bid))
    # 2,000 of its requests have run (the others were never dispatched: they have no item; moto reads a large
    # partition slowly), 3 wait for a retry; some large results lie in S3 beside its requests and index.
    write_request_items(svc, item, 2_000, waiting=3)
    for i in range(3, 40):
        svc.blobs.put(result_object(bid, i), b"{}")
    assert unfinished(svc, account["id"]) == (1, 50_000) and lanes_of_batch(svc, bid)

    started = time.monotonic()
    assert ok(api("DELETE", f"/v1/batches/{bid}", key)) == {"id": bid, "object": "batch.deleted", "deleted": True}
    assert time.monotonic() - started < 5  # marked, not purged: one transaction
    for method, path in [("GET", ""), ("GET", "/results"), ("GET", "/output.jsonl"), ("POST", "/cancel"),
                         ("DELETE", "")]:
        error(api(method, f"/v1/batches/{bid}{path}", key), 404, bid, code="batch_not_found")
    assert bid not in [b["id"] for b in ok(api("GET", "/v1/batches", key, query={"limit": "100"}))["data"]]
    assert unfinished(svc, account["id"]) == (0, 0)  # its counts went back with the delete
    assert len(batch_items(svc, bid)) == 2_001  # nothing removed yet

    # A run whose deadline has passed starts nothing.
    assert sweep_once(svc, deadline=ticks.deadline(0)) == NOTHING_DONE
    # Runs with time for a few steps each (pages of 500 keys, 50 deletes a step): every one removes part of
    # it, the next goes on.
    monkeypatch.setattr(lifecycle, "PURGE_PAGE", 500)
    monkeypatch.setattr(lifecycle, "DELETES_PER_STEP", 50)
    deleted: list[int] = []
    real_delete_many = svc.table.delete_many
    monkeypatch.setattr(svc.table, "delete_many", lambda keys: (deleted.append(len(keys)), real_delete_many(keys)))
    per_run = []
    while svc.table.get(*batch_key(bid)) is not None:
        assert len(per_run) < 100, "no progress"
        deleted.clear()
        sweep_once(svc, deadline=ticks.deadline(10))
        per_run.append(sum(deleted))
    assert len(per_run) > 5 and all(0 < n < 2_000 for n in per_run[:-1]), per_run
    assert batch_items(svc, bid) == [] and lanes_of_batch(svc, bid) == [] and s3_keys(svc, f"batches/{bid}/") == []
    assert svc.table.get(*model_budget_key(GLM)).get("waiting", 0) == 0  # the waiting ones left the count
    assert unfinished(svc, account["id"]) == (0, 0)  # and nothing was given back twice
    assert sweep_once(svc)["purged"] == 0  # nothing of it stays due


def test_a_file_batch_deleted_loses_its_result_files_and_an_export_cut_off_mid_upload(api, svc, ticks):
    from tests.integration.test_files import create_from, jsonl, line, upload

    settings(svc, file_batches_enabled=True)
    _, key = new_key(svc)
    uploaded = ok(upload(api, key, jsonl(line("a"), line("b"))))
    batch_id = ok(create_from(api, key, uploaded["id"]))["id"]
    final = finish(svc, batch_id)
    output = final["output_file_id"]
    assert ok(api("GET", f"/v1/files/{output}", key))["id"] == output
    # A writer of its export was cut off after starting its upload, before saving the upload's id.
    svc.blobs.start_multipart(export_object(batch_id), "application/jsonl")
    assert ok(api("DELETE", f"/v1/batches/{batch_id}", key))["deleted"] is True
    error(api("GET", f"/v1/files/{output}", key), 404)  # its result files go with the delete, at once
    assert output not in [f["id"] for f in ok(api("GET", "/v1/files", key))["data"]]
    assert ok(api("GET", f"/v1/files/{uploaded['id']}", key))["id"] == uploaded["id"]  # the upload stays
    assert sweep_once(svc)["purged"] == 1
    assert batch_items(svc, batch_id) == [] and s3_keys(svc, f"batches/{batch_id}/") == []
    assert s3_keys(svc, f"files/{output}/") == []
    uploads = svc.blobs.s3.list_multipart_uploads(Bucket=svc.settings.bucket_name).get("Uploads", [])
    assert uploads == []


def test_message_batch_delete_answers_at_once_and_the_sweeper_purges_it(svc):
    settings(svc, message_batches_enabled=True)
    _, key = new_key(svc)
    who = authenticate(svc, key)
    body = {"requests": [{"custom_id": f"m-{i}", "params": {"model": GLM, "max_tokens": 8,
                                                           "messages": [{"role": "user", "content": "hi"}]}}
                         for i in range(3)]}
    item, _ = message_batches.create(svc, who, json.dumps(body).encode(), None, "2026-10-21")
    final = finish(svc, item["id"])
    assert final["status"] == "completed"
    assert message_batches.delete(svc, who, item["id"]) == {"id": item["id"], "type": "message_batch_deleted"}
    for read in (lambda: message_batches.owned(svc, who, item["id"]),
                 lambda: message_batches.delete(svc, who, item["id"])):
        with pytest.raises(ApiError) as gone:
            read()
        assert gone.value.status == 404
    assert message_batches.list_page(svc, who, 20, None, None, "http://x")["data"] == []
    kinds = Counter(i["sk"].split("#")[0] for i in batch_items(svc, item["id"]))
    # Still there (the batch, its requests, its finished-order log): the sweeper removes it.
    assert kinds["BATCH"] == 1 and kinds["REQ"] == 3 and kinds["FEED"] >= 1, kinds
    assert sweep_once(svc)["purged"] == 1
    assert batch_items(svc, item["id"]) == [] and s3_keys(svc, f"batches/{item['id']}/") == []


def test_the_retention_purge_and_a_delete_converge_on_one_resumable_purge(api, svc, ticks):
    account, key = new_key(svc)
    settings(svc, batch_retention_seconds=3600)
    first, second = (api.created(key, [chat_request(f"r-{i}", "retain") for i in range(3)]) for _ in range(2))
    for batch in (first, second):
        finish(svc, batch["id"])
    assert unfinished(svc, account["id"]) == (0, 0)
    base = svc.clock
    svc.clock = lambda: base() + 3601  # both retentions have ended
    # The retention purge of one is cut off after marking it: it reads as gone, and a delete finds nothing.
    sweep_once(svc, deadline=ticks.deadline(4))
    marked = [b for b in (first, second) if svc.table.get(*batch_key(b["id"])).get("deleting")]
    assert len(marked) == 1
    first, second = marked[0], second if marked[0] is first else first
    assert not svc.table.get(*batch_key(first["id"])).get("purge_items")
    error(api("DELETE", f"/v1/batches/{first['id']}", key), 404, code="batch_not_found")
    # `second` is deleted by its owner before its retention purge marks it: the same purge, with its items.
    assert ok(api("DELETE", f"/v1/batches/{second['id']}", key))["deleted"] is True
    runs = 0
    while any(svc.table.get(*batch_key(b["id"])) for b in (first, second)):
        runs += 1
        assert runs < 50, "no progress"
        sweep_once(svc, deadline=ticks.deadline(6))
    assert runs > 1
    assert [i["sk"] for i in batch_items(svc, second["id"])] == []
    # After the retention the request items and the finished-order log (which carries their TTL) are left to
    # their TTL (free deletes), the rest is gone.
    left = batch_items(svc, first["id"])
    assert sum(i["sk"].startswith("REQ#") for i in left) == 3
    assert all(i["sk"].startswith(("REQ#", "FEED#")) and i["ttl"] for i in left), left
    for batch in (first, second):
        assert s3_keys(svc, f"batches/{batch['id']}/") == []
    assert unfinished(svc, account["id"]) == (0, 0)


def test_cancel_answers_at_once_and_the_sweeper_settles_what_is_left(api, svc, ticks, monkeypatch):
    _, key = new_key(svc)
    small = api.created(key, [chat_request("a", "x")])
    assert ok(api("POST", f"/v1/batches/{small['id']}/cancel", key))["status"] == "cancelled"  # nothing to wait for
    # A batch with requests waiting for a retry: closing them is left to the sweeper when the cancel runs out
    # of time (here: at once).
    big = api.created(key, [chat_request(f"b-{i}", "x") for i in range(4)])
    item = svc.table.get(*batch_key(big["id"]))
    write_request_items(svc, item, 4, waiting=4)
    svc.table.update(*batch_key(big["id"]), "SET lanes.#m.#next = :n ADD #open :n", vals={":n": 4},
                     names={"#m": GLM})
    monkeypatch.setattr(lifecycle, "CANCEL_SETTLE_SECONDS", 0)
    assert ok(api("POST", f"/v1/batches/{big['id']}/cancel", key))["status"] == "cancelling"
    runs = 0
    while svc.table.get(*batch_key(big["id"]))["status"] != "cancelled":
        runs += 1
        assert runs < 20, "no progress"
        sweep_once(svc, deadline=ticks.deadline(4))
    assert runs > 1
    final = ok(api("GET", f"/v1/batches/{big['id']}", key))
    assert final["request_counts"] == {"total": 4, "completed": 0, "failed": 4}
    assert svc.table.get(*model_budget_key(GLM)).get("waiting", 0) == 0


# --- The sweeper's deadline --------------------------------------------------------------------------

def test_a_past_deadline_starts_nothing_and_a_short_one_stops_part_way(api, svc, ticks):
    _, key = new_key(svc)
    settings(svc, batch_completion_window_seconds=60)
    ids = [api.created(key, [chat_request("a", "x")])["id"] for _ in range(5)]
    base = svc.clock
    svc.clock = lambda: base() + 61  # every window closed with nothing started: each is the sweeper's to expire
    before = [svc.table.get(*batch_key(i)) for i in ids]
    assert sweep_once(svc, deadline=ticks.deadline(0)) == NOTHING_DONE
    assert [svc.table.get(*batch_key(i)) for i in ids] == before
    # Time for one batch a run (one look before each): the walk stops part-way, and the next run goes on.
    done = []
    for _ in range(len(ids)):
        sweep_once(svc, deadline=ticks.deadline(3))
        done.append(sum(svc.table.get(*batch_key(i))["status"] == "expired" for i in ids))
    assert done == [1, 2, 3, 4, 5]


def test_a_cut_off_export_resumes_its_upload_and_an_abandoned_one_is_aborted(api, svc, ticks, monkeypatch):
    """A large export written a page a run: each run goes on from the saved cursor on the same upload (never
    from zero), and an upload a run started but never saved (it died) is aborted, not left to cost storage."""
    settings(svc, export_redirect_bytes=100, result_part_bytes=300)
    monkeypatch.setattr("moto.s3.models.S3_UPLOAD_PART_MIN_SIZE", 1)
    monkeypatch.setattr(finalize, "EXPORT_PAGE", 2)
    _, key = new_key(svc)
    bid = api.created(key, [chat_request(f"e-{i:02d}", f"export {i}") for i in range(12)])["id"]
    real_settle = lifecycle.settle_batch
    monkeypatch.setattr(sweep, "settle_batch",  # a deadline the next look at the clock has passed
                        lambda svc, batch_id, deadline=None: real_settle(svc, batch_id, ticks.value))
    for _ in range(40):  # every request runs; the sweeper has no time to write the export
        step_by_record(svc)
        if svc.table.get(*batch_key(bid))["completed"] == 12:
            break
    assert svc.table.get(*batch_key(bid))["status"] == "in_progress"
    abandoned = svc.blobs.start_multipart(export_object(bid), "application/jsonl")  # a run that died at once
    cursors = []
    while svc.table.get(*batch_key(bid))["status"] != "completed":
        assert len(cursors) < 60, "no progress"
        real_settle(svc, bid, deadline=ticks.deadline(3))
        state = (svc.table.get(*batch_key(bid)).get("writing") or {}).get("export")
        if state:
            cursors.append((state.get("upload_id"), state.get("next", 12)))
    assert len(cursors) > 3
    uploads = {u for u, _ in cursors if u}
    assert len(uploads) == 1 and abandoned not in uploads  # one upload, resumed run after run
    assert [n for _, n in cursors] == sorted(n for _, n in cursors)  # never back to zero
    assert svc.blobs.s3.list_multipart_uploads(Bucket=svc.settings.bucket_name).get("Uploads", []) == []
    exported = svc.blobs.get(export_object(bid)).decode().splitlines()
    assert [json.loads(line)["custom_id"] for line in exported] == [f"e-{i:02d}" for i in range(12)]


def test_the_dispatcher_loops_only_within_the_invocations_remaining_time():
    module = load_handler("dispatcher")

    class Context(FakeContext):
        def __init__(self, remaining_ms: int) -> None:
            super().__init__()
            self.remaining_ms = remaining_ms

        def get_remaining_time_in_millis(self) -> int:
            return self.remaining_ms

    assert module.loop_seconds({}, Context(300_000), 55.0) == 55.0
    assert module.loop_seconds({"seconds": 3}, Context(300_000), 55.0) == 3.0
    assert module.loop_seconds({}, Context(40_000), 55.0) == 40.0 - module.STOP_BEFORE_TIMEOUT_SECONDS
    assert module.loop_seconds({}, Context(5_000), 55.0) == 0.0
    assert module.loop_seconds(None, Context(300_000), 55.0) == 0.0


def test_a_file_is_checked_only_when_the_run_has_time_for_the_whole_step(api, svc, ticks):
    from tests.integration.test_files import create_from, jsonl, line, upload

    settings(svc, file_batches_enabled=True)
    _, key = new_key(svc)
    uploaded = ok(upload(api, key, jsonl(line("a"), line("b"))))
    batch_id = ok(create_from(api, key, uploaded["id"]))["id"]
    sweep_once(svc, deadline=ticks.deadline(int(sweep.VALIDATION_RESERVE_SECONDS) - 5))
    assert svc.table.get(*batch_key(batch_id)).get("awaiting_validation")  # left for a run with time for it
    sweep_once(svc, deadline=ticks.deadline(int(sweep.VALIDATION_RESERVE_SECONDS) + 5))
    assert not svc.table.get(*batch_key(batch_id)).get("awaiting_validation")


def test_lease_recovery_and_webhook_relays_stop_at_the_deadline_and_the_next_run_goes_on(api, svc, ticks):
    from batchinfer.records import WebhookEvent
    from batchinfer.scheduling.dispatcher import Dispatcher

    settings(svc, lease_seconds=60)
    account, key = new_key(svc)
    bid = api.created(key, [chat_request(f"l-{i}", "x") for i in range(3)])["id"]
    dispatcher = Dispatcher(svc)
    model = svc.catalog.get(GLM)
    for _ in range(3):  # three groups of one, whose messages are lost
        assert dispatcher.claim(model, limit=1)
    now = svc.now()
    for i in range(3):
        svc.table.transact([WebhookEvent.create(svc.table, WebhookEvent.new(
            event_id=f"evt_{i}", account_id=account["id"], event_type="batch.completed", batch_id=bid, url=None,
            now=now, relay_at=now, keep_until=now + 3600))])
    base = svc.clock
    svc.clock = lambda: base() + 61
    assert sweep.recover_leases(svc, deadline=ticks.deadline(0)) == 0
    assert webhooks.relay_due(svc, deadline=ticks.deadline(0)) == 0
    assert [sweep.recover_leases(svc, deadline=ticks.deadline(2)) for _ in range(4)] == [1, 1, 1, 0]
    assert [webhooks.relay_due(svc, deadline=ticks.deadline(2)) for _ in range(4)] == [1, 1, 1, 0]


# --- The work of one call ------------------------------------------------------------------------------

def test_a_status_filter_on_a_50000_request_batch_looks_at_a_bounded_number_of_results_per_call(api, svc,
                                                                                                monkeypatch):
    from batchinfer.service.reading import finished_order

    _, key = new_key(svc)
    bid = api.created(key, [tiny(i) for i in range(50_000)])["id"]
    pk, _ = batch_key(bid)
    from batchinfer.storage.dynamo import serialize

    failed = [7, 31_000, 49_999]  # three failures far apart; the rest never ran (queued)
    svc.table.client.batch_write_item(RequestItems={svc.table.name: [{"PutRequest": {"Item": serialize(
        {"pk": pk, "sk": request_sk(i), "batch_id": bid, "index": i, "custom_id": str(i), "model": GLM,
         "token": f"t{i}", "attempt": 1, "state": "failed", "error": {"code": "server_error", "message": "x"}})}}
        for i in failed]})
    looked: list[int] = []
    real_iter = finished_order.iter_results

    def counted(*args, **kwargs):
        for result in real_iter(*args, **kwargs):
            looked[-1] += 1
            yield result

    monkeypatch.setattr(finished_order, "iter_results", counted)
    found, after, calls = [], None, 0
    while True:
        calls += 1
        assert calls < 100, "no progress"
        looked.append(0)
        page = ok(api.results(key, bid, status="failed", limit=100, **({"after": after} if after else {})))
        assert looked[-1] <= finished_order.MAX_SCAN
        found += page["data"]
        if not page["has_more"]:
            break
        after = page["last_id"]
    assert [r["custom_id"] for r in found] == [str(i) for i in failed]
    assert all(r["status"] == "failed" for r in found)
    assert calls == 50_000 // finished_order.MAX_SCAN and sum(looked) == 50_000  # each result looked at once


def test_a_filtered_page_in_finished_order_stops_at_the_most_it_looks_at_and_goes_on(api, svc, monkeypatch):
    from batchinfer.service.reading import finished_order

    _, key = new_key(svc)
    bid = api.created(key, [chat_request(f"f-{i}", "x") for i in range(9)])["id"]
    assert finish(svc, bid)["status"] == "completed"
    monkeypatch.setattr(finished_order, "MAX_SCAN", 4)
    pages, after = [], None
    while True:
        assert len(pages) < 20, "no progress"
        page = ok(api.results(key, bid, order="finished", status="failed", **({"after": after} if after else {})))
        pages.append(page)
        if not page["has_more"]:
            break
        after = page["last_id"]
    assert all(p["data"] == [] for p in pages) and len(pages) >= 3  # 9 results, 4 looked at a page
    everything = ok(api.results(key, bid, order="finished", status="completed", limit=5))
    assert len(everything["data"]) == 4 and everything["has_more"]  # a page stops at 4 even with matches left


def test_an_estimate_reads_the_same_bounded_items_whatever_the_batchs_size(api, svc, monkeypatch):
    """What an estimate reads is the model's queue (its budget, at most MAX_LANES lanes and their batches and
    accounts), never anything per request: 10 requests or 5,000, the same items."""
    from batchinfer.service.creating import forecast

    monkeypatch.setattr(forecast, "MAX_LANES", 3)
    for _ in range(5):  # five batches queued on the model ahead, each its own lane
        _, other = new_key(svc)
        api.created(other, [tiny(i) for i in range(4)])
    _, key = new_key(svc)
    read: list[int] = []
    table = svc.table
    for name in ("get", "get_many", "query"):
        real = getattr(table, name)

        def counting(*args, _real=real, **kwargs):
            answer = _real(*args, **kwargs)
            items = answer[0] if isinstance(answer, tuple) else answer
            read[-1] += len(items) if isinstance(items, list | dict) and not (
                isinstance(items, dict) and "pk" in items) else 1
            return answer

        monkeypatch.setattr(table, name, counting)
    counts = []
    for n in (10, 5_000):
        read.append(0)
        answer = ok(api("POST", "/v1/batches/estimate", key, json_body={"requests": [tiny(i) for i in range(n)]}))
        assert answer["request_count"] == n
        counts.append(read[-1])
    # The budget, 3 lanes (of 5), their batches and accounts, the caller's key and account: that is all.
    assert counts[0] == counts[1] and 3 * forecast.MAX_LANES <= counts[1] <= 3 * forecast.MAX_LANES + 10, counts
