"""A hundred results long polls of one account, waiting at once in one API process, while another account's batch
is created, runs and ends: it ends on time with its ledger whole, the polls still waiting all along, and one
poll more than the account may hold is refused at once."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from batchinfer.errors import RateLimited
from batchinfer.layout import long_polls_key
from batchinfer.operations.openai import batches
from batchinfer.service.accounts import authenticate
from batchinfer.service.reading import finished_order
from tests.faults.harness import configure, get_batch, pump, submit
from tests.helpers import chat_request, new_key
from tests.invariants import assert_ledger_consistent

POLLS = 100
WAIT = 15  # seconds each poll holds its empty page: far longer than the other account's batch takes


class AheadClock:
    """The real clock the polls wait on, which the test may move ahead: once the other batch has ended, their
    deadline comes at once rather than after the rest of `WAIT`."""

    def __init__(self) -> None:
        self.ahead = 0.0

    def monotonic(self) -> float:
        return time.monotonic() + self.ahead

    def sleep(self, seconds: float) -> None:
        time.sleep(seconds)


def test_a_hundred_long_polls_of_one_account_leave_another_accounts_batch_on_time(svc, monkeypatch):
    configure(svc, max_long_polls_per_account=POLLS)
    clock = AheadClock()
    monkeypatch.setattr(finished_order, "time", clock)
    poller, poller_key = new_key(svc)
    _, other_key = new_key(svc)
    who, other = authenticate(svc, poller_key), authenticate(svc, other_key)
    watched = submit(svc, who, [chat_request("w", "x")])
    batches.pause_batch(svc, who, watched)  # nothing of it runs: its polls wait their whole `wait`
    batch = get_batch(svc, watched)

    pages: list[dict] = []
    loop = asyncio.new_event_loop()

    async def hold_all() -> list[dict]:
        return await asyncio.gather(*(finished_order.finished_page_held(svc, batch, None, 10, wait=WAIT)
                                      for _ in range(POLLS)))

    polls = threading.Thread(target=lambda: pages.extend(loop.run_until_complete(hold_all())), daemon=True)
    polls.start()
    holds = long_polls_key(poller["id"])
    deadline = time.monotonic() + 10
    while (svc.table.get(*holds) or {}).get("held", 0) < POLLS:
        assert time.monotonic() < deadline, svc.table.get(*holds)
        time.sleep(0.05)

    with pytest.raises(RateLimited) as refused:  # one more than the account may hold
        asyncio.run(finished_order.finished_page_held(svc, batch, None, 10, wait=WAIT))
    assert refused.value.retry_after and refused.value.code == "too_many_long_polls"

    theirs = submit(svc, other, [chat_request(f"o-{i}", f"question {i}") for i in range(6)])
    assert pump(svc, theirs)["status"] == "completed"
    assert polls.is_alive()  # every poll was still waiting while the other batch ran and ended
    assert_ledger_consistent(svc, theirs, other)

    clock.ahead = WAIT  # their deadline has come: each answers its empty page at its next look
    polls.join(30)
    loop.close()
    assert len(pages) == POLLS and all(p["data"] == [] and not p["has_more"] for p in pages)
    assert svc.table.get(*holds)["held"] == 0  # each poll gave its hold back
