"""Results as they finish (`order=finished`), and results filtered by status or custom id: extensions beyond
the OpenAI and Anthropic APIs, shared by every batch API (the route shapes each line as its protocol does).

The finished order is the batch's finished-order log (`records.finished_order`): entries numbered contiguously, each
written in the transaction that counts the outcomes it names. A cursor says how far the log was read (the
last whole entry, how many members of the next one) and how far the tail was (below): since entries are
never written below the head, reading on from a cursor never skips or repeats an outcome.

What the log holds and what it does not:
- every outcome a group's close or a request's settle counts, once: the worker's, or the sweeper's after it
  recovered a dead worker's lease;
- a request retried in place (`service.steering.retry`) finishes again: its new outcome is a new entry, later in the
  order. A page shows results as they are when it is read, so an earlier entry of a request that has been
  re-queued since is passed over (its new outcome is still to come);
- requests that have no outcome to count: those rejected at intake and those that never ran because their
  batch stopped first. Once the batch has ended, after the last entry, the feed goes on with them in
  submission order (the tail); a request of the tail that a later retry runs appears again with its outcome.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Literal, get_args

from anyio import to_thread

from ...domain import FINAL_BATCH, BatchStatus, result_id
from ...errors import InvalidRequest, quoted
from ...layout import INDEX_CHUNK, IndexEntry, request_key
from ...records import Batch, BatchItem, Feed, Request
from ...records.finished_order import TOKEN_CHARS, entry_number
from ...runtime import Services
from ..limits import LongPollHold
from .results import index_entries, iter_results, result_of, start_after

MAX_WAIT_SECONDS = 25  # an API Gateway integration answers within 30 s: a held page ends well before
POLL_SECONDS = 0.5  # how often a held page looks at the log's head again (one read of one key)
ENTRIES_PER_READ = 40  # log entries read at a time (up to 25 members each)
SCAN_CHUNK = 1000  # results read at a time by a filter or the tail
# Results a page looks at, at most, whatever the batch's size: a filter that matches few of a 50,000-request
# batch answers a page short (even empty) with `has_more` and the cursor where it stopped, and the next call
# goes on from there, instead of one call walking the whole batch.
MAX_SCAN = 2000
RESULT_STATUSES = ("queued", "running", "completed", "failed", "cancelled", "expired")
ResultStatus = Literal["queued", "running", "completed", "failed", "cancelled", "expired"]
Order = Literal["submitted", "finished"]
CURSOR_PREFIX = "feed_"

Shape = Callable[[dict], dict]

# The query parameters' descriptions in the OpenAPI document (extensions beyond the OpenAI and Anthropic APIs).
RESULTS_HELP = ("Extensions beyond the batch APIs it mirrors: `order=finished` pages results in the order they "
                "finished, from the cursor `after` (the page's `last_id`), holding an empty page up to `wait` seconds; "
                "`status` and `custom_id` keep only the results that have them (docs/api.md).")
ORDER_HELP = "submitted (default) or finished (an extension: results as they finish)"
WAIT_HELP = "With order=finished: seconds (0-25) to hold an empty page until a result finishes"
STATUS_HELP = "Only results with this status: " + ", ".join(RESULT_STATUSES)
CUSTOM_ID_HELP = "Only the result of the request with this custom_id"


@dataclass(frozen=True)
class Cursor:
    seq: int = 0  # entries of the log read whole
    offset: int = 0  # members of entry seq + 1 read already
    tail: int = 0  # the next request index the tail may show


def encode_cursor(cursor: Cursor) -> str:
    raw = f"1.{cursor.seq}.{cursor.offset}.{cursor.tail}".encode()
    return CURSOR_PREFIX + base64.urlsafe_b64encode(raw).decode().rstrip("=")


def decode_cursor(value: str | None) -> Cursor:
    if value is None:
        return Cursor()
    try:
        if not value.startswith(CURSOR_PREFIX) or len(value) > 80:
            raise ValueError
        body = value[len(CURSOR_PREFIX):]
        version, *numbers = base64.urlsafe_b64decode(body + "=" * (-len(body) % 4)).decode().split(".")
        seq, offset, tail = (int(n) for n in numbers)
        if version != "1" or min(seq, offset, tail) < 0:
            raise ValueError
    except (ValueError, UnicodeDecodeError, binascii.Error):
        raise InvalidRequest(f"after must be the last_id of an earlier page of finished results, not "
                             f"{quoted(value)}.", param="after") from None
    return Cursor(seq, offset, tail)


def check_status(status: str | None) -> None:
    if status is not None and status not in RESULT_STATUSES:
        raise InvalidRequest(f"status must be one of {', '.join(RESULT_STATUSES)}, not {quoted(status)}.",
                             param="status")


def check_wait(wait: int | None) -> int:
    if wait is None:
        return 0
    if not 0 <= wait <= MAX_WAIT_SECONDS:
        raise InvalidRequest(f"wait must be between 0 and {MAX_WAIT_SECONDS} seconds.", param="wait")
    return wait


def check_order(order: str | None) -> str:
    if order not in (None, "submitted", "finished"):
        raise InvalidRequest(f"order must be 'submitted' or 'finished', not {quoted(order)}.", param="order")
    return order or "submitted"


def _matches(status: str | None, custom_id: str | None) -> Callable[[dict], bool]:
    return lambda r: (status is None or r["status"] == status) and (custom_id is None or r["custom_id"] == custom_id)


def results_view(svc: Services, batch: BatchItem, *, limit: int, after: str | None, order: str | None,
                 wait: int | None, status: str | None, custom_id: str | None, shape: Shape = lambda r: r
                 ) -> dict | None:
    """The page these query parameters ask for, or None when they ask for none of the extensions (the plain
    results in submission order, as before)."""
    order = check_order(order)
    if order == "submitted" and wait is not None:
        raise InvalidRequest("wait applies only with order=finished.", param="wait")
    if order == "finished":
        return finished_page(svc, batch, after, limit, wait, status, custom_id, shape)
    if status is None and custom_id is None:
        return None
    page = filtered_page(svc, batch, after, limit, status, custom_id)
    return {**page, "data": [shape(r) for r in page["data"]]}


async def results_view_async(svc: Services, load: Callable[[], BatchItem], *, limit: int, after: str | None,
                             order: str | None, wait: int | None, status: str | None, custom_id: str | None,
                             shape: Shape = lambda r: r) -> dict | None:
    """`results_view` for an async server: a page held open (`wait`) waits without a thread, taking one of
    its account's long polls while it does, its reads each done briefly in the thread pool. `load`: the batch,
    checked as its caller's (a blocking read)."""
    batch = await to_thread.run_sync(load)
    order = check_order(order)
    if order == "submitted" and wait is not None:
        raise InvalidRequest("wait applies only with order=finished.", param="wait")
    if order == "finished":
        return await finished_page_held(svc, batch, after, limit, wait, status, custom_id, shape)
    return await to_thread.run_sync(lambda: results_view(svc, batch, limit=limit, after=after, order=order,
                                                         wait=None, status=status, custom_id=custom_id, shape=shape))


# --- Finished order ----------------------------------------------------------------------------------------

def finished_page(svc: Services, batch: BatchItem, after: str | None, limit: int, wait: int | None = None,
                  status: str | None = None, custom_id: str | None = None, shape: Shape = lambda r: r) -> dict:
    """Up to `limit` results after the cursor `after`, in the order they finished. `wait`: seconds to hold
    an empty page until a result finishes (not past the batch's end). `last_id` is the cursor to go on
    from, given even with an empty page; `has_more` says whether more are there now (or that the page
    stopped at the most it looks at: `MAX_SCAN`). Blocking: the API serves `finished_page_held`."""
    cursor = decode_cursor(after)
    check_status(status)
    deadline = time.monotonic() + check_wait(wait)
    keep = _matches(status, custom_id)
    while True:
        page, cursor = _look(svc, batch, cursor, limit, keep, shape, time.monotonic() >= deadline)
        if page is not None:
            return page
        time.sleep(min(POLL_SECONDS, max(0.0, deadline - time.monotonic())))


async def finished_page_held(svc: Services, batch: BatchItem, after: str | None, limit: int,
                             wait: int | None = None, status: str | None = None, custom_id: str | None = None,
                             shape: Shape = lambda r: r) -> dict:
    """`finished_page`, waiting with `asyncio.sleep` between looks: a held page holds no thread. Before it
    waits it takes one of its account's long polls (429 past the limit), given back when it answers."""
    cursor = decode_cursor(after)
    check_status(status)
    deadline = time.monotonic() + check_wait(wait)
    keep = _matches(status, custom_id)
    # Read before the first look: whatever is appended after it, the look or a later watch sees.
    seen = await _watch(svc, batch["id"]) if deadline > time.monotonic() else None
    page, cursor = await to_thread.run_sync(_look, svc, batch, cursor, limit, keep, shape,
                                            time.monotonic() >= deadline)
    if page is not None:
        return page
    hold = LongPollHold(svc, batch["account_id"])
    await to_thread.run_sync(hold.take)
    try:
        while True:
            await asyncio.sleep(min(POLL_SECONDS, max(0.0, deadline - time.monotonic())))
            final = time.monotonic() >= deadline
            now = await _watch(svc, batch["id"])
            if now == seen and not final:
                continue  # nothing new in the log, the batch as it was: no need to read the log
            seen = now
            page, cursor = await to_thread.run_sync(_look, svc, batch, cursor, limit, keep, shape, final)
            if page is not None:
                return page
    finally:
        await asyncio.shield(to_thread.run_sync(hold.give_back))


# The polls a process holds on one batch share one look at its log's head and status per POLL_SECONDS: a
# hundred polls of a batch cost its store what one costs. Keyed by event loop too: a future is its loop's.
_WATCHES: dict[tuple[int, str], tuple[float, asyncio.Future]] = {}


async def _watch(svc: Services, batch_id: str) -> tuple:
    """(the log's head, the batch's status, whether it is being retried), read at most once per POLL_SECONDS
    per batch in this process however many polls wait on it."""
    loop = asyncio.get_running_loop()
    now = time.monotonic()
    key = (id(loop), batch_id)
    seen = _WATCHES.get(key)
    failed = seen is not None and seen[1].done() and (seen[1].cancelled() or seen[1].exception() is not None)
    if seen is None or failed or now - seen[0] >= POLL_SECONDS:
        for stale in [k for k, (at, _) in _WATCHES.items() if now - at > 10 * POLL_SECONDS]:
            del _WATCHES[stale]
        seen = (now, asyncio.ensure_future(to_thread.run_sync(_head_of, svc, batch_id)))
        _WATCHES[key] = seen
    return await asyncio.shield(seen[1])


def _head_of(svc: Services, batch_id: str) -> tuple:
    item = Batch.get(svc.table, batch_id) or {}
    return Feed.head(svc.table, batch_id), item.get("status"), bool(item.get("retrying"))


def _look(svc: Services, batch: BatchItem, cursor: Cursor, limit: int, keep: Callable[[dict], bool], shape: Shape,
          final: bool) -> tuple[dict | None, Cursor]:
    """One look at the log: (the page to answer, or None to wait on; the cursor to go on from)."""
    current = _current(svc, batch)
    data, cursor_after, has_more = _read(svc, current, cursor, limit, keep)
    if data or has_more or _ended(current) or final:
        return ({"object": "list", "data": [shape(r) for r in data], "first_id": None,
                 "last_id": encode_cursor(cursor_after), "has_more": has_more,
                 "batch_status": current["status"]}, cursor_after)
    return None, cursor_after  # passed-over entries stay passed over


def _current(svc: Services, batch: BatchItem) -> BatchItem:
    return Batch.get(svc.table, batch["id"]) or batch


def _ended(batch: BatchItem) -> bool:
    return BatchStatus(batch["status"]) in FINAL_BATCH and not batch.get("retrying")


def _read(svc: Services, batch: BatchItem, cursor: Cursor, limit: int, keep: Callable[[dict], bool]
          ) -> tuple[list[dict], Cursor, bool]:
    """(results, the cursor after them, whether another one is there). `batch` is read before the log, so
    when it had ended every entry was written by then, and the tail is what had no outcome."""
    data: list[dict] = []
    index = _Index(svc, batch)
    ended = _ended(batch)
    for looked, (result, position) in enumerate(_results(svc, batch, cursor, index, ended)):
        if looked == MAX_SCAN:  # the most one page looks at: the next page goes on from here
            return data, cursor, True
        if result is None or not keep(result):
            cursor = position  # passed over: never shown under this cursor's reader
            continue
        if len(data) == limit:
            return data, cursor, True
        data.append(result)
        cursor = position
    return data, cursor, False


def _results(svc: Services, batch: BatchItem, cursor: Cursor, index: _Index, ended: bool
             ) -> Iterator[tuple[dict | None, Cursor]]:
    """The log's results after the cursor, then (once the batch has ended) the tail's from where they left it."""
    at = cursor
    for result, position in _log_results(svc, batch, cursor, index):
        at = position
        yield result, position
    if ended:
        yield from _tail_results(svc, batch, at, index)


class _Index:
    """The batch's request index, a chunk read once per page."""

    def __init__(self, svc: Services, batch: BatchItem) -> None:
        self.svc, self.batch, self.chunks = svc, batch, {}

    def entry(self, index: int) -> IndexEntry:
        chunk = index // INDEX_CHUNK
        if chunk not in self.chunks:
            base = chunk * INDEX_CHUNK
            self.chunks[chunk] = index_entries(self.svc, self.batch["id"], base,
                                               min(self.batch["total"], base + INDEX_CHUNK))
        return self.chunks[chunk][index - chunk * INDEX_CHUNK]


def _log_results(svc: Services, batch: BatchItem, cursor: Cursor, index: _Index
                 ) -> Iterator[tuple[dict | None, Cursor]]:
    """Each result the log names after the cursor, with the cursor past it; None for a member a retry has
    re-queued since its entry was written (its new outcome is to come, later in the log)."""
    seq, offset = cursor.seq, cursor.offset
    while True:
        entries = Feed.after(svc.table, batch["id"], seq, ENTRIES_PER_READ)
        for entry in entries:
            number, members = entry_number(entry), entry["members"]
            wanted = [(int(m[0]), str(m[1])) for m in members[offset:]]
            items = _items(svc, batch, [i for i, _ in wanted])
            for n, (at, token) in enumerate(wanted, start=offset + 1):
                position = Cursor(number, 0, cursor.tail) if n == len(members) else Cursor(number - 1, n, cursor.tail)
                stored = items.get(at)
                if stored is None or str(stored.get("token", ""))[:TOKEN_CHARS] != token:
                    yield None, position
                    continue
                yield result_of(svc, batch, at, index.entry(at), stored), position
            seq, offset = number, 0
        if len(entries) < ENTRIES_PER_READ:
            return


def _items(svc: Services, batch: BatchItem, indexes: list[int]) -> dict[int, dict]:
    found = svc.table.get_many([request_key(batch["id"], i) for i in indexes])
    return {int(item["index"]): item for item in found.values()}


def _tail_results(svc: Services, batch: BatchItem, cursor: Cursor, index: _Index
                  ) -> Iterator[tuple[dict | None, Cursor]]:
    """After the log, once the batch has ended: requests with no outcome stored (rejected at intake, or never
    run because the batch stopped), in submission order from the cursor's `tail`."""
    for start in range(cursor.tail, batch["total"], SCAN_CHUNK):
        end = min(batch["total"], start + SCAN_CHUNK)
        stored = {int(s["index"]) for s in Request.between(svc.table, batch, start, end - 1)}
        for at in range(start, end):
            if at not in stored:
                yield result_of(svc, batch, at, index.entry(at), None), Cursor(cursor.seq, cursor.offset, at + 1)
        cursor = Cursor(cursor.seq, cursor.offset, end)


# --- Filters in submission order ----------------------------------------------------------------------------

def filtered_page(svc: Services, batch: BatchItem, after: str | None, limit: int, status: str | None,
                  custom_id: str | None) -> dict:
    """Results in submission order that have `status` and/or `custom_id`, paged as the unfiltered results
    are (`after`: the last result ID of the page before). A page looks at `MAX_SCAN` results at most: when it
    stops there short of `limit` matches, `has_more` is true and `last_id` names the last result it looked
    at (a match or not) to go on after. Otherwise `has_more` is exact: the walk looks on for one more match
    before it answers."""
    check_status(status)
    start = start_after(after)
    keep = _matches(status, custom_id)
    end = batch["total"]
    if custom_id is not None:  # one request at most: find it in the index, read only it
        index = _index_of(svc, batch, custom_id)
        start, end = (index, index + 1) if index is not None and index >= start else (start, start)
    data: list[dict] = []
    has_more = False
    looked_to = None  # the last result looked at, when the page stopped at MAX_SCAN
    stop = min(end, start + MAX_SCAN)
    for at in range(start, stop, SCAN_CHUNK):
        for result in iter_results(svc, batch, at, min(stop, at + SCAN_CHUNK)):
            if not keep(result):
                continue
            if len(data) == limit:
                has_more = True
                break
            data.append(result)
        if has_more:
            break
    if not has_more and stop < end:  # the page looked at all it may: more may match past it
        has_more, looked_to = True, result_id(stop - 1)
    last_id = looked_to or (data[-1]["id"] if data else None)
    return {"object": "list", "data": data, "has_more": has_more,
            "first_id": data[0]["id"] if data else None, "last_id": last_id}


def _index_of(svc: Services, batch: BatchItem, custom_id: str) -> int | None:
    for start in range(0, batch["total"], INDEX_CHUNK):
        chunk = index_entries(svc, batch["id"], start, min(batch["total"], start + INDEX_CHUNK))
        for offset, entry in enumerate(chunk):
            if entry.custom_id == custom_id:
                return start + offset
    return None


assert get_args(ResultStatus) == RESULT_STATUSES
