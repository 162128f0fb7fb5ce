"""The call time a pump notes for estimates (`policy.noted_call_seconds`): the noted figure moved as a moving
average would be by each call, so a batch's many calls count as many samples and one call as one."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from batchinfer.scheduling import policy

seconds = st.floats(min_value=0.001, max_value=600, allow_nan=False)


@pytest.mark.parametrize(("noted", "mean", "calls", "expected"), [
    (None, 0.5, 16, 0.5),  # nothing noted: the calls' mean
    (1.0, 0.5, 1, 0.9),  # one call: one step of 20 %
    (1.0, 0.5, 2, 0.82),  # two: as two steps, 1 - 0.8^2 = 36 % of the way
    (2.0, 0.5, 16, 2.0 - 1.5 * (1 - 0.8 ** 16)),  # a short batch: 97 % of the way
    (1.0, 3.0, 0, 1.0),  # no call: nothing moves
])
def test_table(noted, mean, calls, expected):
    assert policy.noted_call_seconds(noted, mean, calls, 0.2) == pytest.approx(expected)


@given(noted=seconds, mean=seconds, calls=st.integers(min_value=1, max_value=10_000))
def test_it_moves_toward_the_calls_and_never_past_them(noted, mean, calls):
    moved = policy.noted_call_seconds(noted, mean, calls, 0.2)
    assert min(noted, mean) - 1e-9 <= moved <= max(noted, mean) + 1e-9
    more = policy.noted_call_seconds(noted, mean, calls + 1, 0.2)
    assert abs(more - mean) <= abs(moved - mean) + 1e-9  # more calls: closer to what they took


@given(noted=seconds, first=seconds)
def test_two_calls_noted_apart_or_together_agree_when_they_took_the_same(noted, first):
    apart = policy.noted_call_seconds(policy.noted_call_seconds(noted, first, 1, 0.2), first, 1, 0.2)
    assert apart == pytest.approx(policy.noted_call_seconds(noted, first, 2, 0.2), rel=1e-9)
