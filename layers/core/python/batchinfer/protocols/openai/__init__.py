"""The OpenAI-shaped batch API: inline batches and batches from an uploaded file (`/v1/batches`), the
files they read and write (`/v1/files`) and files sent in parts (`/v1/uploads`).

This package is its description (`PROTOCOL`, `shapes`), pure and low; its operations are
`operations.openai`.
"""

from __future__ import annotations

from collections.abc import Mapping

from ...domain import BatchStatus, IdKind
from ..base import Protocol
from . import shapes

NAME = "openai"


def backend_options(batch: Mapping) -> dict:
    """Its requests' bodies say all the backend needs."""
    return {}


PROTOCOL = Protocol(
    name=NAME,
    batch_ids=IdKind("batch_", 32),
    owner_prefix="BATCH#",
    api_field=False,
    export_line=shapes.export_line,
    result_file_lines={"output": shapes.output_line, "error": shapes.error_line},
    ending_events={BatchStatus.COMPLETED: "batch.completed", BatchStatus.FAILED: "batch.failed",
                   BatchStatus.EXPIRED: "batch.expired", BatchStatus.CANCELLED: "batch.cancelled"},
    backend_options=backend_options,
    error_body=shapes.error_body,
    error_model=shapes.OpenAIError,
)
