"""Anthropic's Message Batches (`/v1/messages/batches`, also under the Anthropic base URL `/anthropic`).

This package is its description (`PROTOCOL`, `shapes`), pure and low; its operations are
`operations.anthropic`.
"""

from __future__ import annotations

from collections.abc import Mapping

from ...domain import BatchStatus, IdKind
from ..base import Protocol
from . import shapes

NAME = "anthropic"
ENDED = "message_batch.ended"  # one event for every ending: the batch's processing_status is `ended`


def backend_options(batch: Mapping) -> dict:
    """The `anthropic-version` the batch was created under goes with each of its requests."""
    return {"version": batch.get("anthropic_version")}


PROTOCOL = Protocol(
    name=NAME,
    batch_ids=IdKind("msgbatch_", 32),
    owner_prefix="MSGBATCH#",  # Message Batches: listed apart from the OpenAI-shaped ones
    api_field=True,
    export_line=shapes.message_batch_line,
    result_file_lines={},
    ending_events=dict.fromkeys((BatchStatus.COMPLETED, BatchStatus.FAILED, BatchStatus.EXPIRED,
                                 BatchStatus.CANCELLED), ENDED),
    backend_options=backend_options,
    error_body=shapes.error_body,
    error_model=shapes.AnthropicError,
    base_path="/anthropic",
    rate_headers=shapes.rate_headers,
)
