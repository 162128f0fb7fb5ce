"""How the OpenAI-shaped batch API shows results and refusals: lines of output.jsonl and of a file batch's
output and error files, and OpenAI's error envelope. Plain dicts in, plain dicts out."""

from __future__ import annotations

from pydantic import BaseModel

from ...errors import ApiError

CANCELLED_ERROR = {"code": "batch_cancelled", "message": "Not run: the batch was cancelled."}


def export_line(r: dict) -> dict:
    """A line of output.jsonl."""
    return {"id": r["id"], "custom_id": r["custom_id"], "response": r["response"], "error": r["error"]}


def output_line(r: dict) -> dict | None:
    """A line of a file batch's output file: completed requests only."""
    if r["status"] != "completed":
        return None
    return {"id": r["id"], "custom_id": r["custom_id"], "response": r["response"], "error": None}


def error_line(r: dict) -> dict | None:
    """OpenAI's error file line: an HTTP error in response.body.error (the backend's body as it sent it, when
    it is such an envelope), anything else in error."""
    if r["status"] == "completed":
        return None
    error = r["error"] or CANCELLED_ERROR
    if error.get("status"):
        body = error.get("body")
        if not (isinstance(body, dict) and isinstance(body.get("error"), dict)):  # none, or another shape
            body = {"error": {"message": error.get("message"), "type": error.get("type"), "param": None,
                              "code": error.get("code")}}
        return {"id": r["id"], "custom_id": r["custom_id"], "error": None, "response": {
            "status_code": error["status"], "request_id": error.get("request_id"), "body": body}}
    return {"id": r["id"], "custom_id": r["custom_id"], "response": None,
            "error": {"code": error.get("code"), "message": error.get("message")}}


# --- The error envelope ---------------------------------------------------------------------------------

class OpenAIErrorBody(BaseModel):
    message: str
    type: str
    param: str | None = None
    code: str | None = None


class OpenAIError(BaseModel):
    """OpenAI's error envelope (the `openai` SDK reads `error.message`, `error.code`, `error.param`)."""

    error: OpenAIErrorBody


def error_body(error: ApiError) -> dict:
    return error.openai()
