"""A provider's results file (JSONL) read a page of lines at a time from a byte cursor, the same for every
tier: asked for RANGE_BYTES at a time with a `Range` header (a line longer than that: for the rest of the
file); a server that sends the whole file anyway has the bytes before `start` skipped as they stream, never
held. Each line becomes a LineAnswer through the tier's own `answer`."""

from __future__ import annotations

import json
from collections.abc import Callable

import httpx

from .common import LineAnswer, Page, TierError

RANGE_BYTES = 1 << 20  # what one page asks for at most (a page of 200 typical lines is about 100 KB)
TIMEOUT = httpx.Timeout(60.0, connect=10.0)


def read(url: str, headers: dict[str, str], start: int, limit: int, answer: Callable[[str], LineAnswer]) -> Page:
    """Up to `limit` lines from byte `start` (a page's `next` is the byte after its last line)."""
    page = _read(url, headers, start, limit, start + RANGE_BYTES - 1, answer)
    if not page.answers and page.next is not None:  # one line longer than a range
        page = _read(url, headers, start, limit, None, answer)
    return page


def _read(url: str, headers: dict[str, str], start: int, limit: int, last: int | None,
          answer: Callable[[str], LineAnswer]) -> Page:
    page = Page()
    headers = {**headers, "Range": f"bytes={start}-{'' if last is None else last}"}
    try:
        with httpx.stream("GET", url, headers=headers, timeout=TIMEOUT) as got:
            if got.status_code == 416:  # nothing from `start` on: the file ended there
                return page
            if not got.is_success:
                raise TierError(f"GET {url}: HTTP {got.status_code}")
            at = start if got.status_code == 206 else 0
            pending = b""
            for chunk in got.iter_bytes():
                pending += chunk
                while (end := pending.find(b"\n")) != -1:
                    raw, pending = pending[:end + 1], pending[end + 1:]
                    at += len(raw)
                    if at <= start or not raw.strip():
                        continue
                    page.answers.append(answer(raw.decode()))
                    if len(page.answers) >= limit:
                        page.next = at
                        return page
            ranged = got.status_code == 206 and last is not None and \
                not got.headers.get("content-range", "").endswith(f"/{last + 1}")
            if ranged and at > last:  # the range ended mid-file: the next page starts after its last whole line
                page.next = at
            elif pending.strip() and at + len(pending) > start:  # a last line without its newline
                page.answers.append(answer(pending.decode()))
    except httpx.HTTPError as error:
        raise TierError(f"GET {url}: {type(error).__name__}") from error
    return page


def value_text(line: str, after: str, name: str, value: dict) -> str:
    """The JSON text of `value`, the member `name` found after `after` in the line, as the provider sent it
    (kept, never re-encoded); re-encoded only if it cannot be found there."""
    decoder = json.JSONDecoder()
    at = line.find(f'"{after}"')
    while (at := line.find(f'"{name}"', at + 1)) != -1:
        colon = line.find(":", at + len(name) + 2)
        begin = colon + 1
        while begin < len(line) and line[begin] in " \t":
            begin += 1
        try:
            found, end = decoder.raw_decode(line, begin)
        except ValueError:
            continue
        if found == value:
            return line[begin:end]
    return json.dumps(value, separators=(",", ":"))
