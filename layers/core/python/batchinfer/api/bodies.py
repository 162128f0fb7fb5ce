"""Reading request bodies safely: a declared size checked before the body is read, and multipart forms
(the OpenAI SDK's uploads) whose faults are the caller's 400s, never 500s."""

from __future__ import annotations

from fastapi import Request
from starlette.datastructures import FormData, UploadFile

from ..errors import ApiError


def declared_over(request: Request, limit: int) -> bool:
    """Whether the request's Content-Length says more than `limit` bytes (ASCII digits only: '²' is a digit
    to str.isdigit but not to int(); and no int() of thousands of digits)."""
    declared = request.headers.get("content-length", "")
    return declared.isascii() and declared.isdigit() and (len(declared.lstrip("0")) > 18 or int(declared) > limit)


async def form_with_file(request: Request, name: str, hint: str, max_fields: int) -> tuple[FormData, UploadFile]:
    """The multipart form and its file part `name`. `hint`: how to send it, for the 400 when it is not."""
    if not request.headers.get("content-type", "").startswith("multipart/form-data"):
        raise ApiError(400, hint, param=name)
    try:
        form = await request.form(max_files=1, max_fields=max_fields)
    except Exception as error:  # a malformed multipart body is the caller's mistake, not a 500
        raise ApiError(400, f"The multipart body could not be read: {error}", param=name) from None
    part = form.get(name)
    if not isinstance(part, UploadFile):
        raise ApiError(400, f"The request has no '{name}' part. {hint}", param=name)
    return form, part
