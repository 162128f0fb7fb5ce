"""`/v1/files`: the OpenAI Files API for batch input and output files. While file batches are off, it
answers as the specification's "extension is off" table says (OpenAI's error envelope)."""

from __future__ import annotations

from fastapi import APIRouter, Depends

from ...errors import ApiError
from ...service.accounts import Principal
from ..auth import caller
from ..envelopes import OPENAI, OpenAIRoute, error_responses

router = APIRouter(prefix="/v1/files", route_class=OpenAIRoute, tags=["files"])


@router.post("", summary="Upload a batch input file (file batches are off)", responses=error_responses(OPENAI))
def upload_file(who: Principal = Depends(caller)) -> dict:
    raise ApiError(400, "File batches are not enabled.", code="file_batches_disabled")


@router.get("", summary="List files", responses=error_responses(OPENAI))
def list_files(who: Principal = Depends(caller)) -> dict:
    return {"object": "list", "data": [], "first_id": None, "last_id": None, "has_more": False}


@router.get("/{file_id}", summary="A file", responses=error_responses(OPENAI))
@router.delete("/{file_id}", summary="Delete a file", responses=error_responses(OPENAI))
@router.get("/{file_id}/content", summary="A file's content", responses=error_responses(OPENAI))
def file_not_found(file_id: str, who: Principal = Depends(caller)) -> dict:
    raise ApiError(404, f"No file found with id '{file_id}'.", code="file_not_found", param="file_id")
