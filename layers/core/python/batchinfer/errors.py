"""Errors a caller sees, with the HTTP status they answer with."""

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
