"""Each named error answers with its own status and otherwise carries what an `ApiError` carries."""

import pytest

from batchinfer.errors import (
    ApiError,
    AuthenticationFailed,
    Conflict,
    GatewayTimeout,
    Gone,
    InternalError,
    InvalidRequest,
    NotFound,
    PayloadTooLarge,
    PermissionDenied,
    RateLimited,
    ServiceUnavailable,
)

NAMED = [(InvalidRequest, 400), (AuthenticationFailed, 401), (PermissionDenied, 403), (NotFound, 404),
         (Conflict, 409), (Gone, 410), (PayloadTooLarge, 413), (RateLimited, 429), (InternalError, 500),
         (ServiceUnavailable, 503), (GatewayTimeout, 504)]


@pytest.mark.parametrize(("named", "status"), NAMED)
def test_a_named_error_is_an_api_error_with_its_status_and_the_same_body(named, status):
    error = named("What went wrong.", code="some_code", param="some_param", retry_after=7)
    same = ApiError(status, "What went wrong.", code="some_code", param="some_param", retry_after=7)
    assert isinstance(error, ApiError)
    assert (error.status, error.message, error.code, error.param, error.retry_after, str(error)) == (
        same.status, same.message, same.code, same.param, same.retry_after, str(same))
    assert error.type == same.type
    assert error.openai() == same.openai()


def test_a_named_error_takes_its_arguments_in_api_errors_order_after_the_status():
    error = InvalidRequest("Bad.", "a_code", "a_param", 3)
    assert (error.code, error.param, error.retry_after) == ("a_code", "a_param", 3)
    assert NotFound("Gone.").code is None
