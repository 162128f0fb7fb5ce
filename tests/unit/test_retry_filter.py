"""What a retry in place takes among the requests that did not succeed (service.steering.retry.RetryFilter)."""

import pytest

from batchinfer.domain import RequestState, Stop, unstarted_error
from batchinfer.errors import InvalidRequest
from batchinfer.service.steering.retry import RetryFilter, filter_of, never_ran_shown, shown


def test_no_filter_takes_every_request_that_did_not_succeed_but_those_at_fault_for_their_input():
    every = RetryFilter()
    assert every.takes("a", "failed", "rate_limited") and every.takes("a", "failed", "timeout")
    assert every.takes("a", "expired", "batch_expired") and every.takes("a", "cancelled", "batch_cancelled")
    assert not every.takes("a", "failed", "invalid_request") and not every.takes("a", "failed", "model_not_found")


def test_each_field_narrows_and_naming_takes_what_is_at_fault_for_its_input():
    assert RetryFilter(custom_ids=frozenset({"a"})).takes("a", "failed", "invalid_request")
    assert not RetryFilter(custom_ids=frozenset({"a"})).takes("b", "failed", "rate_limited")
    assert RetryFilter(error_codes=frozenset({"invalid_request"})).takes("b", "failed", "invalid_request")
    assert not RetryFilter(error_codes=frozenset({"timeout"})).takes("b", "failed", "rate_limited")
    assert not RetryFilter(statuses=frozenset({"failed"})).takes("b", "failed", "invalid_request")
    assert not RetryFilter(statuses=frozenset({"expired"})).takes("b", "failed", "rate_limited")
    both = RetryFilter(custom_ids=frozenset({"a"}), statuses=frozenset({"expired"}))
    assert both.takes("a", "expired", "batch_expired") and not both.takes("a", "failed", "timeout")
    assert RetryFilter.of(both.stored()) == both


def test_what_results_show_is_what_a_filter_names():
    assert never_ran_shown(Stop.EXPIRE) == ("expired", "batch_expired")
    assert never_ran_shown(Stop.FAIL) == ("failed", "batch_failed")
    assert never_ran_shown(Stop.CANCEL) == ("cancelled", "batch_cancelled")
    assert shown({"state": RequestState.FAILED.value, "error": {"code": "timeout"}}) == ("failed", "timeout")
    assert shown({"state": RequestState.UNSTARTED.value, "error": unstarted_error(Stop.EXPIRE)}) == (
        "expired", "batch_expired")
    assert shown({"state": RequestState.UNSTARTED.value}) == ("cancelled", "batch_cancelled")


def test_statuses_are_named_as_the_batch_s_api_names_them():
    message = {"errored": "failed", "expired": "expired", "canceled": "cancelled"}
    assert filter_of({"statuses": ["errored"]}, message).statuses == {"failed"}
    with pytest.raises(InvalidRequest) as refused:
        filter_of({"statuses": ["failed"]}, message)
    assert refused.value.param == "statuses"
    assert filter_of({}, message) == RetryFilter()
