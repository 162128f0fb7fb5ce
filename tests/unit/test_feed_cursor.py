"""The finished-order cursor: opaque, round-trips every position, and any other text is a 400 naming `after`."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from batchinfer.errors import InvalidRequest
from batchinfer.records.finished_order import finished_members
from batchinfer.service.reading.finished_order import (
    Cursor,
    check_order,
    check_status,
    check_wait,
    decode_cursor,
    encode_cursor,
)

counts = st.integers(min_value=0, max_value=10**9)


@given(counts, st.integers(min_value=0, max_value=25), st.integers(min_value=0, max_value=50_000))
def test_every_position_round_trips_through_an_opaque_cursor(seq, offset, tail):
    cursor = Cursor(seq, offset, tail)
    text = encode_cursor(cursor)
    assert decode_cursor(text) == cursor
    assert text.startswith("feed_") and len(text) <= 80


@pytest.mark.parametrize("text", ["", "feed_", "feed_!!", "batch_req_3", "feed_" + "A" * 100, "feed_MS4x",
                                  "feed_Mi4xLjEuMQ", "feed_MS4tMS4wLjA"])
def test_anything_else_is_refused_naming_after(text):
    with pytest.raises(InvalidRequest) as refused:
        decode_cursor(text)
    assert refused.value.param == "after"


def test_parameters_out_of_range_name_themselves():
    for call, param in ((lambda: check_wait(26), "wait"), (lambda: check_wait(-1), "wait"),
                        (lambda: check_status("done"), "status"), (lambda: check_order("sideways"), "order")):
        with pytest.raises(InvalidRequest) as refused:
            call()
        assert refused.value.param == param
    assert (check_wait(None), check_wait(25), check_order(None)) == (0, 25, "submitted")


def test_only_final_outcomes_join_the_log():
    items = [{"index": 0, "state": "completed", "token": "t" * 30}, {"index": 1, "state": "waiting", "token": "u"},
             {"index": 2, "state": "failed", "token": "v"}, {"index": 3, "state": "unstarted", "token": "w"}]
    assert finished_members(items) == [[0, "t" * 12], [2, "v"], [3, "w"]]
