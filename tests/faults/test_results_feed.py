"""Results in the order they finished under faults: closes of one batch racing for the log's next number,
a writer held up for minutes between reading the head and committing, a worker dying before its close, and
a retry in place. A reader paging meanwhile sees every result once, never skipped nor repeated."""

from __future__ import annotations

import threading
import time

from batchinfer.layout import batch_key
from batchinfer.operations.openai import batches
from batchinfer.records import Feed, finished_order
from batchinfer.records.finished_order import entry_number
from batchinfer.scheduling.dispatcher import Dispatcher
from batchinfer.service.accounts import authenticate
from batchinfer.service.reading import finished_order as feed_service
from batchinfer.service.running import run_request
from tests.faults.harness import (
    GLM,
    configure,
    dispatch_in_groups,
    get_batch,
    pump,
    receive,
    run_messages,
    submit,
)
from tests.helpers import chat_request, new_key
from tests.invariants import assert_ledger_consistent


class Reader:
    """A client paging the finished results from its cursor, as `batchctl watch` does."""

    def __init__(self, svc, batch_id: str) -> None:
        self.svc, self.batch_id, self.cursor, self.seen = svc, batch_id, None, []

    def read(self) -> list[dict]:
        batch = self.svc.table.get(*batch_key(self.batch_id))
        got = []
        while True:
            page = feed_service.finished_page(self.svc, batch, self.cursor, limit=2)
            got += page["data"]
            self.cursor = page["last_id"]
            if not page["has_more"]:
                self.seen += got
                return got

    def ids(self) -> list[str]:
        return [r["custom_id"] for r in self.seen]


def log_numbers(svc, batch_id: str) -> list[int]:
    pk, _ = batch_key(batch_id)
    return [entry_number(e) for e in svc.table.query_all("pk = :pk AND begins_with(sk, :f)", {":pk": pk, ":f": "FEED#"},
                                                        consistent=True)]


def test_closes_racing_for_the_next_number_each_get_one_and_a_reader_sees_every_result_once(svc, sim_control,
                                                                                           monkeypatch):
    """Six groups of one batch close at once from six worker invocations; the first two read the same head, so
    one of them loses the number and appends after the other. A reader pages all along."""
    configure(svc, lease_seconds=600)
    _, key = new_key(svc)
    who = authenticate(svc, key)
    batch_id = submit(svc, who, [chat_request(f"r{i}", f"request {i}") for i in range(6)])
    assert dispatch_in_groups(svc, GLM, [1] * 6) == [1] * 6
    messages = receive(svc, GLM)
    messages += receive(svc, GLM)
    assert len(messages) == 6

    real_head = Feed.head
    same_head = threading.Barrier(2, timeout=10)
    first_reads: list[int] = []
    lock = threading.Lock()

    def head(t, batch):
        value = real_head(t, batch)
        with lock:
            waits = len(first_reads) < 2
            if waits:
                first_reads.append(value)
        if waits:
            same_head.wait()  # two writers hold the same head before either commits
        return value

    monkeypatch.setattr(finished_order.Feed, "head", staticmethod(head))
    reader = Reader(svc, batch_id)
    # Six invocations at once, each in its own execution environment as on Lambda.
    threads = [threading.Thread(target=run_messages, args=(svc, GLM, [m], f"worker-{i}"))
               for i, m in enumerate(messages)]
    for thread in threads:
        thread.start()
    while any(thread.is_alive() for thread in threads):
        reader.read()
        time.sleep(0.02)  # real time only: moving the clock here could run the workers' leases out
    for thread in threads:
        thread.join()
    reader.read()

    assert first_reads[0] == first_reads[1]  # the race happened: both read one head, one of them lost it
    assert log_numbers(svc, batch_id) == [1, 2, 3, 4, 5, 6]  # no hole, no number twice
    assert sorted(reader.ids()) == [f"r{i}" for i in range(6)]
    final = pump(svc, batch_id)
    assert final["status"] == "completed"
    assert sorted(reader.ids()) == [f"r{i}" for i in range(6)] and reader.read() == []  # each once
    assert_ledger_consistent(svc, batch_id, who, [f"r{i}" for i in range(6)])


def test_a_writer_held_up_for_minutes_after_reading_the_head_appends_after_what_readers_already_read(
        svc, sim_control, monkeypatch):
    """A timestamp cursor would skip this one: its outcome was decided first, but committed last, ten minutes
    of the clock later. Its close finds its number taken, and appends after the reader's cursor."""
    configure(svc, lease_seconds=3600)
    _, key = new_key(svc)
    who = authenticate(svc, key)
    batch_id = submit(svc, who, [chat_request("slow", "late commit"), chat_request("quick", "on time")])
    assert dispatch_in_groups(svc, GLM, [1, 1]) == [1, 1]
    slow_message, quick_message = receive(svc, GLM, n=1), receive(svc, GLM, n=1)

    real_head = Feed.head
    held, release = threading.Event(), threading.Event()

    def head(t, batch):
        value = real_head(t, batch)
        if not held.is_set():  # the first close to read the head: the slow worker's
            held.set()
            release.wait(10)  # read the head, then stall before the commit
        return value

    monkeypatch.setattr(finished_order.Feed, "head", staticmethod(head))
    slow = threading.Thread(target=run_messages, args=(svc, GLM, slow_message, "worker-slow"))
    slow.start()
    assert held.wait(10)
    run_messages(svc, GLM, quick_message)
    reader = Reader(svc, batch_id)
    assert [r["custom_id"] for r in reader.read()] == ["quick"]
    svc.clock.advance(600)
    release.set()
    slow.join()
    assert [r["custom_id"] for r in reader.read()] == ["slow"]
    assert log_numbers(svc, batch_id) == [1, 2] and reader.ids() == ["quick", "slow"]
    assert pump(svc, batch_id)["status"] == "completed" and reader.read() == []
    assert_ledger_consistent(svc, batch_id, who, ["slow", "quick"])


def test_a_worker_dying_before_its_close_leaves_nothing_half_shown_and_the_recovery_shows_each_once(
        svc, sim_control, monkeypatch):
    configure(svc, lease_seconds=60)
    _, key = new_key(svc)
    who = authenticate(svc, key)
    names = ["a", "b", "c", "d"]
    batch_id = submit(svc, who, [chat_request(n, f"request {n}") for n in names])
    assert dispatch_in_groups(svc, GLM, [2, 2]) == [2, 2]
    first, second = receive(svc, GLM, n=1), receive(svc, GLM, n=1)
    reader = Reader(svc, batch_id)
    run_messages(svc, GLM, first)
    shown = reader.read()
    assert len(shown) == 2

    def dying_close(*args, **kwargs):
        raise RuntimeError("worker process died")  # its members' outcomes are written, not counted

    monkeypatch.setattr(run_request, "close_group", dying_close)
    assert run_messages(svc, GLM, second)["failed"]
    monkeypatch.undo()
    assert reader.read() == []  # written but not counted: not in the order yet
    assert get_batch(svc, batch_id)["completed"] == 2

    svc.clock.advance(61)
    final = pump(svc, batch_id, clock_step=2)  # the sweeper recovers the lease and closes the group
    assert final["status"] == "completed" and final["completed"] == 4
    assert sorted(r["custom_id"] for r in reader.read()) == sorted(set(names) - {r["custom_id"] for r in shown})
    assert sorted(reader.ids()) == names and log_numbers(svc, batch_id) == [1, 2]
    assert_ledger_consistent(svc, batch_id, who, names)


def test_across_a_retry_in_place_a_request_shows_each_outcome_once_and_a_new_reader_only_the_last(
        svc, sim_control):
    configure(svc, lease_seconds=60, max_attempts=1)
    _, key = new_key(svc)
    who = authenticate(svc, key)
    batch_id = submit(svc, who, [chat_request("flaky", "[[sim:flaky:1:500]] once"),
                                 chat_request("fine", "all good")])
    reader = Reader(svc, batch_id)
    pump(svc, batch_id)
    assert sorted((r["custom_id"], r["status"]) for r in reader.read()) == [("fine", "completed"),
                                                                           ("flaky", "failed")]
    configure(svc, max_attempts=2)
    batches.retry_batch(svc, who, batch_id, {}, None)
    late = Reader(svc, batch_id)  # starts after the retry re-queued the failed request
    assert reader.read() == [] and [r["custom_id"] for r in late.read()] == ["fine"]
    assert Dispatcher(svc).pass_once() == 1
    run_messages(svc, GLM, receive(svc, GLM))
    assert [(r["custom_id"], r["status"]) for r in reader.read()] == [("flaky", "completed")]
    assert [(r["custom_id"], r["status"]) for r in late.read()] == [("flaky", "completed")]
    final = pump(svc, batch_id)
    assert final["status"] == "completed" and reader.read() == [] and late.read() == []
    assert sorted(reader.ids()) == ["fine", "flaky", "flaky"] and sorted(late.ids()) == ["fine", "flaky"]
    assert_ledger_consistent(svc, batch_id, who, ["flaky", "fine"])
