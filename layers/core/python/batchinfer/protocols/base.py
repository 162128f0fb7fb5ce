"""What a batch API protocol is to the shared code: a plain description (ids, listing, lines, events,
backend options, error envelope). Pure: no storage, no service; the operations of a protocol (create,
read, cancel, ...) are modules of its package beside its description."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

from pydantic import BaseModel

from ..domain import BatchStatus, IdKind
from ..errors import ApiError

Line = Callable[[dict], dict]  # a result (as results.iter_results reads it) -> one JSONL line


@dataclass(frozen=True, eq=False)
class Protocol:
    """One batch API, as the shared code needs to know it (compared and hashed as itself: one per protocol)."""

    # The registry's key; also what its batch items carry as `api` when `api_field` is set.
    name: str
    # Its batch ids (`batch_...`, `msgbatch_...`): a batch is this protocol's when its id is of this kind.
    batch_ids: IdKind
    # Sort key prefix of its batches in an account's `by_owner` list: each protocol lists its own batches.
    owner_prefix: str
    # Whether its batch items (and the hash of a create call an Idempotency-Key replays) carry `api`. The
    # default protocol's do not: its batches came before the field, and items without one are its own.
    api_field: bool
    # A result as a line of the batch's export (output.jsonl, a Message Batch's results).
    export_line: Line
    # Result files a batch from an input file writes, by kind ("output", "error"): a result's line in
    # that file, or None when the result does not belong there. Empty when it has no file batches.
    result_file_lines: Mapping[str, Callable[[dict], dict | None]]
    # The webhook event a batch's ending announces, by its final status.
    ending_events: Mapping[BatchStatus, str]
    # Keyword arguments one of its batch requests adds to the backend call (from its batch item).
    backend_options: Callable[[Mapping], dict]
    # A refusal as its clients parse it (its error envelope), and that envelope's shape for the
    # OpenAPI document.
    error_body: Callable[[ApiError], dict]
    error_model: type[BaseModel]
    # Where else than the service's own base URL its clients may be pointed ("" for nowhere else).
    base_path: str = ""
    # Its own rate-limit headers, from the account's bucket (calls it holds in all, holds now, seconds until
    # full), sent beside OpenAI's `x-ratelimit-*-requests` that every answer carries; none of its own by default.
    rate_headers: Callable[[int, int, float], dict[str, str]] = lambda limit, remaining, reset_seconds: {}

    def ending_event(self, final: BatchStatus) -> str:
        return self.ending_events[final]
