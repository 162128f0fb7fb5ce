"""Errors a caller sees, with the HTTP status they answer with.

`ApiError` takes any status (an answer relayed from a backend keeps the backend's); each subclass names one
status by what it means, as the OpenAI and Anthropic SDKs name theirs, and takes the rest as `ApiError` does.
The envelopes catch `ApiError`, so every subclass renders the same way.
"""

from __future__ import annotations

_TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
          404: "not_found_error", 409: "conflict_error", 410: "gone_error", 413: "request_too_large",
          429: "rate_limit_error"}


class ApiError(Exception):
    def __init__(self, status: int, message: str, code: str | None = None, param: str | None = None,
                 retry_after: int | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.code = code
        self.param = param
        self.retry_after = retry_after  # seconds, sent as `retry-after` (429s)

    @property
    def type(self) -> str:
        return _TYPES.get(self.status, "api_error" if self.status >= 500 else "invalid_request_error")

    def openai(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


class _FixedStatus(ApiError):
    """An `ApiError` whose class fixes its status (`STATUS`)."""

    STATUS: int

    def __init__(self, message: str, code: str | None = None, param: str | None = None,
                 retry_after: int | None = None) -> None:
        super().__init__(self.STATUS, message, code=code, param=param, retry_after=retry_after)


class InvalidRequest(_FixedStatus):
    """400: the request is malformed, or asks for what cannot be done."""

    STATUS = 400


class AuthenticationFailed(_FixedStatus):
    """401: no API key, or one that is unknown, revoked or expired."""

    STATUS = 401


class PermissionDenied(_FixedStatus):
    """403: the caller is known but may not do this."""

    STATUS = 403


class NotFound(_FixedStatus):
    """404: no such object (or none the caller may see)."""

    STATUS = 404


class BatchNotFound(NotFound):
    """404: no batch `batch_id` the caller may see (none, another account's, or one being deleted). `noun`
    is what its API calls a batch ("Message Batch" for Anthropic's); `param` names the path parameter where
    the API's answer names one."""

    def __init__(self, batch_id: str, noun: str = "batch", param: str | None = None) -> None:
        super().__init__(f"No {noun} found with id {quoted(batch_id)}.", code="batch_not_found", param=param)
        self.batch_id = batch_id


class Conflict(_FixedStatus):
    """409: the object's state does not allow it now (or another change won)."""

    STATUS = 409


class Gone(_FixedStatus):
    """410: it existed and was deleted."""

    STATUS = 410


class PayloadTooLarge(_FixedStatus):
    """413: a body, file or part over its limit."""

    STATUS = 413


class BodyTooLarge(PayloadTooLarge):
    """413: a request body over the `limit` (bytes) its route takes."""

    def __init__(self, limit: int) -> None:
        super().__init__(f"The request body is larger than the limit of {limit} bytes.")
        self.limit = limit


class RateLimited(_FixedStatus):
    """429: a limit or quota is used up, or the backend is busy (`retry_after` says when to try again)."""

    STATUS = 429


class InternalError(_FixedStatus):
    """500: the service failed at something that should not fail."""

    STATUS = 500


class ServiceUnavailable(_FixedStatus):
    """503: the backend cannot be reached or used now."""

    STATUS = 503


class GatewayTimeout(_FixedStatus):
    """504: the backend did not answer in time."""

    STATUS = 504


QUOTED_CHARS = 64  # a value a message quotes back is cut to this many characters


def clipped(value: object, limit: int = QUOTED_CHARS) -> str:
    """`value` as a message echoes it: at most `limit` characters of it, and '...' past them. A message that
    echoes what a client sent must stay short whatever it sent (a made-up id in a path, a model name or a
    key in a body may be megabytes): the answer, a log line or a proxy's error page holding it should not
    carry the whole of it, and its start is enough to recognize."""
    text = str(value)
    return f"{text[:limit]}..." if len(text) > limit else text


def quoted(value: object, limit: int = QUOTED_CHARS) -> str:
    """`value` quoted in a message ('x'), cut as `clipped` cuts it."""
    return f"'{clipped(value, limit)}'"
