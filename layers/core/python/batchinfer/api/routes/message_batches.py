"""`/v1/messages/batches` and `/anthropic/v1/messages/batches`: Anthropic Message Batches (Anthropic's
error envelope). While they are off, they answer as the specification's "extension is off" table says."""

from __future__ import annotations

from fastapi import APIRouter, Depends

from ...errors import ApiError
from ...service.accounts import Principal
from ..auth import caller
from ..envelopes import ANTHROPIC, AnthropicRoute, error_responses, unmatched_paths_under

PREFIXES = ("", "/anthropic")  # the service's own base URL, and the one Anthropic clients are given

router = APIRouter(route_class=AnthropicRoute, tags=["message batches"])
# A path under the Anthropic base URL that no route serves still answers in Anthropic's envelope.
unmatched_paths_under(ANTHROPIC, "/anthropic/", "/v1/messages")

for prefix in PREFIXES:
    @router.post(prefix + "/v1/messages/batches", summary="Create a Message Batch (off)",
                 responses=error_responses(ANTHROPIC, 403))
    def create_message_batch(who: Principal = Depends(caller)) -> dict:
        raise ApiError(403, "Message Batches are not enabled.")

    @router.get(prefix + "/v1/messages/batches", summary="List Message Batches", responses=error_responses(ANTHROPIC))
    def list_message_batches(who: Principal = Depends(caller)) -> dict:
        return {"data": [], "has_more": False, "first_id": None, "last_id": None}

    @router.get(prefix + "/v1/messages/batches/{batch_id}", summary="A Message Batch",
                responses=error_responses(ANTHROPIC))
    @router.delete(prefix + "/v1/messages/batches/{batch_id}", summary="Delete a Message Batch",
                   responses=error_responses(ANTHROPIC))
    def message_batch_not_found(batch_id: str, who: Principal = Depends(caller)) -> dict:
        raise ApiError(404, f"No Message Batch found with id '{batch_id}'.")

