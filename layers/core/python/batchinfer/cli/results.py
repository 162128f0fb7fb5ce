"""`batchctl results` (and `wait -o`): a batch's results streamed to a file or stdout, as the service
sends them: OpenAI's output file lines, or a Message Batch's result lines."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import IO

from .api_client import ApiClient
from .common import UsageError
from .views import batch_path, is_message_batch


def _is_failed(entry: dict, message_batch: bool) -> bool:
    if message_batch:
        return (entry.get("result") or {}).get("type") != "succeeded"
    response = entry.get("response") or {}
    return entry.get("error") is not None or not 200 <= int(response.get("status_code") or 0) < 300


def download_results(client: ApiClient, batch_id: str, out: str | None, failed_only: bool) -> tuple[int, int]:
    """Stream the batch's results (every line, or only those that did not succeed) to `out` (stdout when
    None or '-'), never holding more than a line. A file appears whole or not at all. (lines, failed)."""
    message_batch = is_message_batch(batch_id)
    # output.jsonl: every result in submission order, as OpenAI's output file lines; a Message Batch's
    # results: Anthropic's lines. Both stream (or redirect to storage when large) once the batch has ended.
    path = batch_path(batch_id) + ("/results" if message_batch else "/output.jsonl")
    lines = failed = 0
    to_stdout = out in (None, "-")
    part = None if to_stdout else Path(f"{out}.part")
    try:
        sink: IO[bytes] = sys.stdout.buffer if part is None else part.open("wb")
    except OSError as error:
        raise UsageError(f"cannot write {out}: {error.strerror or error}") from None
    try:
        for line in client.stream_lines(path):
            bad = _is_failed(json.loads(line), message_batch)
            failed += bad
            if bad or not failed_only:
                sink.write(line + b"\n")
                lines += 1
        sink.flush()
        if part is not None:
            sink.close()
            os.replace(part, out)
    except BaseException:
        if part is not None:
            sink.close()
            part.unlink(missing_ok=True)
        raise
    return lines, failed
