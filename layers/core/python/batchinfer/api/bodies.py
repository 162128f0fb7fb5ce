"""Reading request bodies safely: a declared size checked before the body is read, and multipart forms
(the OpenAI SDK's uploads) whose faults are the caller's 400s, never 500s."""

from __future__ import annotations

import re

from fastapi import Request
from python_multipart.multipart import DEFAULT_MAX_HEADER_SIZE
from starlette.datastructures import FormData, UploadFile

from ..errors import ApiError, BodyTooLarge, InvalidRequest
from ..operations.openai.files import MAX_FILENAME_CHARS


def declared_over(request: Request, limit: int) -> bool:
    """Whether the request's Content-Length says more than `limit` bytes (ASCII digits only: '²' is a digit
    to str.isdigit but not to int(); and no int() of thousands of digits)."""
    declared = request.headers.get("content-length", "")
    return declared.isascii() and declared.isdigit() and (len(declared.lstrip("0")) > 18 or int(declared) > limit)


async def body_within(request: Request, limit: int) -> bytes:
    """The request's body, at most `limit` bytes, or 413 (`BodyTooLarge`): checked against its Content-Length
    before it is read, then against what was read (a body without a Content-Length, or with a wrong one)."""
    if declared_over(request, limit):
        raise BodyTooLarge(limit)
    raw = await request.body()
    if len(raw) > limit:
        raise BodyTooLarge(limit)
    return raw


# The multipart parser refuses a part's header line over this many bytes without saying which, and a
# filename is in one (Content-Disposition): its 400 says the filename is too long where that is the one.
_FILENAME_HEADER = re.compile(rb"(?im)^content-disposition:[^\r\n]*filename")


def _filename_too_long(name: str, length: int | None = None) -> ApiError:
    has = f" (it has {length})" if length is not None else ""
    return InvalidRequest(f"The '{name}' part's filename is too long{has}: a filename may have at most "
                          f"{MAX_FILENAME_CHARS} characters.", param=name)


def _header_too_long(raw: bytes) -> bool:
    """Whether a part's Content-Disposition (which holds its filename) is longer than the parser reads."""
    for found in _FILENAME_HEADER.finditer(raw):
        end = raw.find(b"\r\n", found.start())
        if (end if end >= 0 else len(raw)) - found.start() > DEFAULT_MAX_HEADER_SIZE:
            return True
    return False


async def form_with_file(request: Request, name: str, hint: str, max_fields: int) -> tuple[FormData, UploadFile]:
    """The multipart form and its file part `name`. `hint`: how to send it, for the 400 when it is not."""
    if not request.headers.get("content-type", "").startswith("multipart/form-data"):
        raise InvalidRequest(hint, param=name)
    raw = await request.body()  # in memory already (a Lambda event); kept to say what a refused one held
    try:
        form = await request.form(max_files=1, max_fields=max_fields)
    except Exception as error:  # a malformed multipart body is the caller's mistake, not a 500
        if _header_too_long(raw):
            raise _filename_too_long(name) from None
        raise InvalidRequest(f"The multipart body could not be read: {error}", param=name) from None
    part = form.get(name)
    if not isinstance(part, UploadFile):
        raise InvalidRequest(f"The request has no '{name}' part. {hint}", param=name)
    if part.filename and len(part.filename) > MAX_FILENAME_CHARS:
        raise _filename_too_long(name, len(part.filename))
    return form, part
