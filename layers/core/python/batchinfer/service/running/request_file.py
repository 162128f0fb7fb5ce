"""Request bodies read back from a batch's requests file (`layout.requests_object`, written once at intake):
by each request's (offset, length) span, neighbours together in one ranged read, each body still its own and
in the order asked for. A direct run's group and a provider job's page both read their bodies here."""

from __future__ import annotations

import json
from bisect import bisect_right

from ...layout import requests_object
from ...runtime import Services

# One ranged read spans neighbours this close, up to this much (a request's line is at most a few MB).
READ_GAP = 64 * 1024
READ_MOST = 4 * 1024 * 1024


def read_runs(spans: list[tuple[int, int]], gap: int = READ_GAP, most: int = READ_MOST) -> list[tuple[int, int]]:
    """The ranges `(start, end)` to read for these `(offset, length)` spans, by offset: a span joins the range
    before it while it starts at most `gap` bytes after its end and the range stays within `most` bytes (one
    inside it always joins); each span lies whole in the last range starting at or before its offset."""
    runs: list[list[int]] = []
    for offset, length in sorted(spans, key=lambda span: (span[0], -span[1])):
        end = offset + length
        if runs and (end <= runs[-1][1] or (offset - runs[-1][1] <= gap and end - runs[-1][0] <= most)):
            runs[-1][1] = max(runs[-1][1], end)
        else:
            runs.append([offset, end])
    return [(start, end) for start, end in runs]


def bodies(svc: Services, batch_id: str, spans: list[tuple[int, int]]) -> list[dict]:
    """The bodies of the batch's requests at these `(offset, length)` spans, in their order."""
    if not spans:
        return []
    key = requests_object(batch_id)
    runs = read_runs(spans)
    data = [svc.blobs.get_range(key, start, end - start) for start, end in runs]
    starts = [start for start, _ in runs]
    found = []
    for offset, length in spans:
        at = bisect_right(starts, offset) - 1
        found.append(json.loads(data[at][offset - starts[at]:offset - starts[at] + length])["body"])
    return found
