"""The state machine and the rules that do not need storage."""

import random

import pytest

from batchinfer.domain import (
    BATCH_TRANSITIONS,
    FINAL_BATCH,
    FINAL_REQUEST,
    REQUEST_TRANSITIONS,
    Attempt,
    BatchStatus,
    RequestState,
    Stop,
    can_transition,
    error_code_for_status,
    final_status,
    is_retryable,
    parse_result_id,
    public_request_status,
    result_id,
    retry_delay,
    unstarted_error,
)
from batchinfer.jsontext import Text


def test_final_statuses_have_no_way_out_but_a_retry():
    for status in FINAL_BATCH:  # a retry in place runs an ended batch again
        assert BATCH_TRANSITIONS[status] == {BatchStatus.IN_PROGRESS}
        assert [other for other in BatchStatus if can_transition(status, other)] == [BatchStatus.IN_PROGRESS]
    assert RequestState.COMPLETED not in REQUEST_TRANSITIONS  # a success is never run again
    for state in FINAL_REQUEST - {RequestState.COMPLETED}:  # what did not succeed waits to run again
        assert REQUEST_TRANSITIONS[state] == {RequestState.WAITING}


def test_every_unfinished_batch_status_can_reach_a_final_one():
    for status in set(BatchStatus) - FINAL_BATCH:
        assert BATCH_TRANSITIONS[status] & FINAL_BATCH, status


def test_cancelling_only_ends_cancelled():
    assert BATCH_TRANSITIONS[BatchStatus.CANCELLING] == {BatchStatus.CANCELLED}


@pytest.mark.parametrize(("stop", "final"), [(None, "completed"), (Stop.CANCEL, "cancelled"),
                                             (Stop.EXPIRE, "expired"), (Stop.FAIL, "failed")])
def test_final_status_follows_the_stop(stop, final):
    assert final_status(stop) == final


@pytest.mark.parametrize(("state", "stop", "shown"), [
    (None, None, "queued"), (None, Stop.CANCEL, "cancelled"), (None, Stop.EXPIRE, "expired"),
    (None, Stop.FAIL, "failed"), (RequestState.DISPATCHED, None, "queued"), (RequestState.WAITING, None, "queued"),
    (RequestState.RUNNING, None, "running"), (RequestState.COMPLETED, Stop.CANCEL, "completed"),
    (RequestState.FAILED, None, "failed"), (RequestState.UNSTARTED, Stop.CANCEL, "cancelled"),
    (RequestState.UNSTARTED, Stop.EXPIRE, "expired")])
def test_result_status_a_user_sees(state, stop, shown):
    assert public_request_status(state, stop) == shown


def test_never_run_requests_carry_their_batch_s_error():
    assert unstarted_error(Stop.FAIL)["code"] == "batch_failed"
    assert unstarted_error(Stop.EXPIRE)["code"] == "batch_expired"
    assert unstarted_error(Stop.CANCEL) is None and unstarted_error(None) is None


@pytest.mark.parametrize(("status", "code", "retry"), [
    (400, "invalid_request", False), (422, "invalid_request", False), (404, "model_not_found", False),
    (403, "forbidden", False), (401, "invalid_request", False), (429, "rate_limited", True),
    (500, "upstream_error", True), (502, "upstream_error", True), (503, "service_unavailable", True),
    (504, "timeout", True)])
def test_backend_statuses_map_to_the_spec_s_codes(status, code, retry):
    assert error_code_for_status(status) == code
    assert is_retryable(status) is retry


def test_a_timeout_is_retried_and_reported_as_timeout():
    assert is_retryable(None)
    assert Attempt(status_code=None, cost_known=False).error()["code"] == "timeout"
    assert Attempt(status_code=503, message="busy").error() == {"code": "service_unavailable", "message": "busy",
                                                                "status": 503, "request_id": None, "body_text": None}


def test_an_error_answer_keeps_the_backends_body_up_to_a_size():
    body = Text({"error": {"message": "no", "n_ctx": 4096}}, '{"error":{"message":"no","n_ctx":4096}}')
    kept = Attempt(status_code=400, body=body, request_id="req_1", message="no").error(keep_body_bytes=100)
    assert kept == {"code": "invalid_request", "message": "no", "status": 400, "request_id": "req_1",
                    "body_text": body.text}
    left_out = Attempt(status_code=400, body=body, message="x" * 5000).error(keep_body_bytes=10)
    assert left_out["body_text"] is None and left_out["body_omitted_bytes"] == len(body.text)
    assert left_out["message"] == "x" * 4096 + " [cut]"


def test_backoff_grows_with_jitter_and_is_capped():
    rng = random.Random(1)
    first = [retry_delay(1, 1.0, 60.0, rng) for _ in range(200)]
    late = [retry_delay(7, 1.0, 60.0, rng) for _ in range(200)]
    assert max(first) <= 1.5 and min(first) >= 0.5
    assert max(late) <= 60.5 and len({round(d, 3) for d in late}) > 100  # spread out, not in lockstep
    assert sum(late) / len(late) > sum(first) / len(first) * 10


def test_result_ids_round_trip_and_bad_ones_are_refused():
    assert result_id(0) == "batch_req_1" and parse_result_id("batch_req_1") == 0
    for bad in ("batch_req_0", "batch_req_", "req_4", "batch_req_-1", "batch_req_1x", ""):
        assert parse_result_id(bad) is None
