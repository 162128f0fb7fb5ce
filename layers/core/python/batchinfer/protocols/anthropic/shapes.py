"""How Anthropic's Message Batches show results and refusals: a line of a Message Batch's results, the
error types an errored result names, and Anthropic's error envelope. Plain dicts in, plain dicts out."""

from __future__ import annotations

import datetime as dt

from pydantic import BaseModel

from ...errors import ApiError

# Anthropic's error types, for a stored error: by the backend's HTTP status, else by the service's code.
_TYPE_BY_STATUS = {400: "invalid_request_error", 401: "authentication_error", 402: "billing_error",
                   403: "permission_error", 404: "not_found_error", 408: "timeout_error",
                   413: "request_too_large", 422: "invalid_request_error", 429: "rate_limit_error",
                   504: "timeout_error", 529: "overloaded_error"}
_TYPE_BY_CODE = {"model_not_found": "not_found_error", "timeout": "timeout_error",
                 "batch_failed": "authentication_error", "owner_unauthorized": "authentication_error",
                 "result_too_large": "api_error"}

ERROR_TYPES = frozenset({"invalid_request_error", "authentication_error", "billing_error",
                         "permission_error", "not_found_error", "rate_limit_error", "timeout_error",
                         "api_error", "overloaded_error", "request_too_large"})


def error_type(error: dict) -> str:
    """The Anthropic error type of a stored error."""
    if error.get("type") in ERROR_TYPES:
        return error["type"]
    status = error.get("status")
    if status in _TYPE_BY_STATUS:
        return _TYPE_BY_STATUS[status]
    if isinstance(status, int) and status >= 500:
        return "api_error"
    return _TYPE_BY_CODE.get(error.get("code") or "", "invalid_request_error" if status else "api_error")


def message_batch_line(r: dict) -> dict:
    """A line of a Message Batch's results, as Anthropic's MessageBatchIndividualResponse."""
    status = r["status"]
    if status == "completed":
        result: dict = {"type": "succeeded", "message": r["response"]["body"]}
    elif status == "cancelled":
        result = {"type": "canceled"}
    elif status == "expired":
        result = {"type": "expired"}
    else:  # failed (a result is only read once the batch has ended)
        result = {"type": "errored", "error": _envelope(r["error"] or {})}
    return {"custom_id": r["custom_id"], "result": result}


def _envelope(error: dict) -> dict:
    """An errored result's error: Anthropic's envelope. The backend's own error is kept where the envelope can
    carry it: an Anthropic backend's envelope as it sent it; another backend's error object with its fields,
    its `type` one of Anthropic's and its `message` the request's."""
    body = error.get("body")
    request_id = {"request_id": error["request_id"]} if error.get("request_id") else {}
    if (isinstance(body, dict) and body.get("type") == "error" and isinstance(body.get("error"), dict)
            and body["error"].get("type") in ERROR_TYPES and isinstance(body["error"].get("message"), str)):
        return body if "request_id" in body or not request_id else {**body, **request_id}
    own = body.get("error") if isinstance(body, dict) and isinstance(body.get("error"), dict) else {}
    inner = {**own, "type": error_type(error),
             "message": error.get("message") or "The request failed."}
    return {"type": "error", "error": inner, **request_id}


# --- The error envelope ---------------------------------------------------------------------------------

class AnthropicErrorBody(BaseModel):
    type: str
    message: str


class AnthropicError(BaseModel):
    """Anthropic's error envelope (the `anthropic` SDK reads `error.type` and `error.message`)."""

    type: str = "error"
    error: AnthropicErrorBody


def error_body(error: ApiError) -> dict:
    return {"type": "error", "error": {"type": error.type, "message": error.message}}


def rate_headers(limit: int, remaining: int, reset_seconds: float) -> dict[str, str]:
    """Anthropic's request rate headers: the bucket's size, what it holds now, and when it is full again
    (RFC 3339)."""
    reset = dt.datetime.now(dt.UTC) + dt.timedelta(seconds=reset_seconds)
    return {"anthropic-ratelimit-requests-limit": str(limit),
            "anthropic-ratelimit-requests-remaining": str(remaining),
            "anthropic-ratelimit-requests-reset": reset.isoformat(timespec="seconds").replace("+00:00", "Z")}
