"""What the service keeps of a client's input is bounded as it is found: a refused file's problems (count,
each message, the whole list), a retry filter as a message names it, and the numbers a record can hold."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from batchinfer.domain import storable_number
from batchinfer.errors import InvalidRequest
from batchinfer.service.creating.validation import (
    MAX_PROBLEM_CHARS,
    MAX_PROBLEMS_BYTES,
    MAX_REPORTED_PROBLEMS,
    ProblemList,
    bounded_problems,
)
from batchinfer.service.steering.retry import described
from batchinfer.spending import parse_cap


def test_a_problem_list_keeps_at_most_its_count_and_counts_the_rest_exactly():
    found = ProblemList()
    for n in range(4_911):
        found.add(n + 1, "invalid_method", "method must be POST")
    data = found.data()
    assert len(data) == MAX_REPORTED_PROBLEMS
    assert [p["line"] for p in data[:-1]] == list(range(1, MAX_REPORTED_PROBLEMS))
    assert data[-1] == {"code": "more_errors", "message": "...and 4,812 more problems.", "param": None, "line": None}


def test_huge_messages_are_clipped_and_the_whole_list_stays_within_its_bytes():
    found = ProblemList()
    for n in range(300):
        found.add(n, "c" * 10_000, "m" * 1_000_000, param="p" * 100_000)
    data = found.data()
    assert len(json.dumps(data)) <= MAX_PROBLEMS_BYTES
    assert all(len(p["message"]) <= MAX_PROBLEM_CHARS + 3 for p in data)
    assert data[-1]["code"] == "more_errors"
    listed = len(data) - 1
    assert data[-1]["message"] == f"...and {300 - listed:,} more problems."


def test_a_list_within_its_bounds_is_kept_as_it_is_and_one_past_them_is_bounded():
    found = ProblemList()
    for n in range(500):
        found.add(n, "duplicate_custom_id", "custom_id 'a' is used more than once")
    data = found.data()
    assert bounded_problems(data) == data  # its summary is not counted as one more problem
    raw = [{"code": "x", "message": "y" * 100_000, "param": None, "line": n} for n in range(3)]
    assert [len(p["message"]) for p in bounded_problems(raw)] == [MAX_PROBLEM_CHARS + 3] * 3


@given(st.lists(st.tuples(st.integers(0, 10**6), st.text(max_size=50), st.integers(0, 200_000)), max_size=400))
def test_any_problems_make_a_bounded_list(problems):
    found = ProblemList()
    for line, code, size in problems:
        found.add(line, code, "é" * size)
    data = found.data()
    assert len(data) <= MAX_REPORTED_PROBLEMS and len(json.dumps(data)) <= MAX_PROBLEMS_BYTES
    listed = [p for p in data if p["code"] != "more_errors" or p["line"] is not None]
    more = int(data[-1]["message"].split()[1].replace(",", "")) if data and data[-1]["line"] is None else 0
    assert len(listed) + more == len(problems)


def test_a_retry_filter_as_a_message_names_it_is_short_whatever_its_size():
    said = described({"custom_ids": ["x" * 600] * 50_000, "statuses": ["failed"], "error_codes": None})
    assert len(said) < 700
    assert said.startswith("the filter custom_ids=['" + "x" * 64 + "...'") and "and 49,995 more]" in said
    assert said.endswith("statuses=['failed']")
    assert described({}) == "the retry"


@pytest.mark.parametrize(("value", "storable"), [
    (0, True), (0.0, True), (1e-130, True), (-1e-130, True), (9.99e125, True), (10**125, True),
    (5e-324, False), (1e-131, False), (1e126, False), (1e300, False), (10**126, False), (float("nan"), False),
    (float("inf"), False), (int("1" * 38), True), (int("1" * 39), False),
])
def test_the_numbers_a_record_can_hold(value, storable):
    assert storable_number(value) is storable


@pytest.mark.parametrize("cap", [5e-324, 1e-131, 1e126, 1e300, 10**400, 0, -1, float("nan"), True, "1"])
def test_a_cap_a_record_cannot_hold_is_refused_naming_it(cap):
    with pytest.raises(InvalidRequest) as refused:
        parse_cap(cap)
    assert refused.value.param == "max_cost_usd" and "from 1e-130 to under 1e+126" in refused.value.message
    assert len(refused.value.message) < 200


@pytest.mark.parametrize("cap", [1e-130, 0.01, 2, 10**40, 9.99e125])
def test_a_cap_in_range_is_taken(cap):
    assert parse_cap(cap) == float(cap)


def test_a_bounded_list_says_how_many_problems_it_stands_for():
    from batchinfer.service.creating.validation import problem_count

    found = ProblemList()
    for n in range(4_911):
        found.add(n, "invalid_method", "method must be POST")
    assert problem_count(found.data()) == 4_911
    few = ProblemList()
    few.add(1, "empty_file", "The file holds no requests.")
    assert problem_count(few.data()) == 1
