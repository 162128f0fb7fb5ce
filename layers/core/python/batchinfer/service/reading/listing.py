"""Cursor paging over an account's records (batches, files) as the SDKs page: `after` names the last
item of the previous page, and `has_more` is false on the last page (an SDK that never sees it keeps
asking). Items the caller must not see (being deleted, expired) are skipped without shortening a page."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ...domain import IdKind
from ...errors import InvalidRequest, quoted
from ...runtime import Services
from ..accounts import Principal


def owner_page(svc: Services, principal: Principal, record: Any, *, ids: IdKind, noun: str, after: str | None,
               limit: int, newest_first: bool, visible: Callable[[dict], bool],
               shown: Callable[[dict], dict], prefix: str | None = None) -> dict:
    """One page of the account's `record`s (records.Batch, of the protocol whose owner prefix `prefix` is,
    or records.File): the list envelope `{object: list, data, first_id, last_id, has_more}`."""
    scope = {} if prefix is None else {"prefix": prefix}
    start = None
    if after:
        anchor = record.get(svc.table, after) if ids.names(after) else None
        if anchor is None or anchor.get("account_id") != principal.account_id:
            raise InvalidRequest(f"after: no {noun} found with id {quoted(after)}.", param="after")
        start = record.owner_cursor(anchor)
    items, has_more = collect_owned(
        lambda begin, n: record.of_owner(svc.table, principal.account_id, n, begin, newest_first=newest_first,
                                        **scope),
        start, limit, visible)
    data = [shown(i) for i in items]
    return {"object": "list", "data": data, "first_id": data[0]["id"] if data else None,
            "last_id": data[-1]["id"] if data else None, "has_more": has_more}


def collect_owned(read: Callable[[dict | None, int], tuple[list[dict], dict | None]], start: dict | None,
                  limit: int, visible: Callable[[dict], bool]) -> tuple[list[dict], bool]:
    """Up to `limit` visible items from `start` on, reading pages with `read(start, how_many)`, and whether
    more follow (one item beyond the page is read to know)."""
    items: list[dict] = []
    while len(items) <= limit:
        page, start = read(start, limit + 1 - len(items))
        items.extend(i for i in page if visible(i))
        if not start:
            break
    return items[:limit], len(items) > limit
