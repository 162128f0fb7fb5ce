"""The latency sketch of a batch's analytics: percentiles within the documented bucket error of the exact
ones, whatever the latencies and however the groups that counted them were split; and the running time."""

from __future__ import annotations

import math
from collections import Counter

from hypothesis import given, settings
from hypothesis import strategies as st

from batchinfer.records import analytics
from batchinfer.service.reading.analytics import analytics_of, running_seconds

latencies = st.lists(st.floats(min_value=0.0, max_value=900_000.0, allow_nan=False), min_size=1, max_size=300)


def nearest_rank(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[max(1, math.ceil(q * len(ordered))) - 1]


def stored_of(groups: list[list[float]]) -> dict:
    """A batch item as the settles of these groups leave it: each group's counters added, as DynamoDB's ADD."""
    item: dict = {"id": "batch_x", "status": "completed", "in_progress_at": 1000, "output_tokens": 600}
    for group in groups:
        moved: Counter = Counter()
        for ms in group:
            moved.update(analytics.counters(analytics.attempt_tally(ms, None, retry=False), finished=True))
        for name, by in moved.items():
            item[name] = item.get(name, 0) + by
    item[analytics.LAST_FINISHED_AT] = 1060
    return item


@settings(max_examples=200, deadline=None)
@given(latencies, st.integers(min_value=1, max_value=25))
def test_percentiles_are_within_the_bucket_error_however_groups_split(values, group_size):
    rounded = [float(round(v)) for v in values]  # an attempt's latency is kept in whole milliseconds
    groups = [rounded[i:i + group_size] for i in range(0, len(rounded), group_size)]
    shown = analytics_of(stored_of(groups))
    for name, q in (("p50_ms", 0.5), ("p95_ms", 0.95), ("max_ms", 1.0)):
        exact = nearest_rank(rounded, q)
        if exact < 1:  # below a millisecond: one bucket, shown as half of one
            assert shown[name] == 0.5
        elif exact < 2 ** ((analytics.MAX_BUCKET - 1) / analytics.STEPS_PER_DOUBLING):
            assert abs(shown[name] - exact) <= analytics.RELATIVE_ERROR * exact + 0.05, (name, shown[name], exact)
    assert shown["attempts"] == len(values)
    assert shown["requests_per_minute"] == round(len(values) * 60 / 60, 2)
    assert shown["output_tokens_per_second"] == 10.0


def test_the_documented_error_and_the_sketch_size():
    assert round(analytics.RELATIVE_ERROR, 4) == 0.0905
    assert analytics.bucket(900_000) == analytics.MAX_BUCKET
    assert len({analytics.bucket(ms) for ms in range(1, 900_000, 7)}) <= analytics.MAX_BUCKET + 1
    # The error codes' counters are attribute names that need no expression name.
    assert analytics.error_attribute("Rate-Limited!") == "E_rate_limited_"


def test_running_time_leaves_out_idle_time_once_an_attempt_has_finished_after_it():
    item = {"status": "in_progress", "in_progress_at": 1000, analytics.LAST_FINISHED_AT: 1700,
            analytics.IDLE_SECONDS: 600, analytics.IDLE_LAST: 600, analytics.IDLE_UNTIL: 1650}
    assert running_seconds(item, analytics.stored(item)) == 100
    # Resumed after its last finish: that pause lies past the span measured so far.
    item[analytics.IDLE_UNTIL] = 1800
    assert running_seconds(item, analytics.stored(item)) == 700
    assert running_seconds({"status": "in_progress"}, analytics.stored({})) == 0
    # A batch whose attempts all ended within its first second ran a second.
    item = {"status": "completed", "in_progress_at": 1000, analytics.LAST_FINISHED_AT: 1000}
    assert running_seconds(item, analytics.stored(item)) == 1
