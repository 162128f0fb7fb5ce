"""The FastAPI app: OpenAI-shaped /v1/batches plus the answers of extensions that are off."""

from __future__ import annotations

from collections.abc import Callable

from fastapi import Depends, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, RedirectResponse, StreamingResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from ..errors import ApiError
from ..runtime import Services, services
from ..service import batches
from ..service.accounts import AuthError, Principal, authenticate

ANTHROPIC_PREFIXES = ("/v1/messages", "/anthropic/")


def _anthropic_error(status: int, kind: str, message: str) -> JSONResponse:
    return JSONResponse({"type": "error", "error": {"type": kind, "message": message}}, status_code=status)


def create_app(get_services: Callable[[], Services] = services) -> FastAPI:
    app = FastAPI(title="Batch inference", version="0.1.0", docs_url="/docs", openapi_url="/openapi.json")

    def svc() -> Services:
        return get_services()

    def caller(request: Request, s: Services = Depends(svc)) -> Principal:
        if not s.settings.batches_enabled:
            raise ApiError(404, "Batch inference is unavailable at the moment.", code="batches_unavailable")
        auth = request.headers.get("authorization", "")
        raw = auth[7:].strip() if auth.lower().startswith("bearer ") else None
        raw = raw or request.headers.get("x-api-key")
        try:
            return authenticate(s, raw)
        except AuthError as error:
            raise ApiError(401, str(error), code="invalid_api_key") from None

    @app.exception_handler(ApiError)
    async def api_error(request: Request, error: ApiError) -> JSONResponse:
        if request.url.path.startswith(ANTHROPIC_PREFIXES):
            return _anthropic_error(error.status, error.type, error.message)
        return JSONResponse(error.openai(), status_code=error.status)

    @app.exception_handler(RequestValidationError)
    async def invalid(request: Request, error: RequestValidationError) -> JSONResponse:
        first = error.errors()[0] if error.errors() else {}
        where = ".".join(str(p) for p in first.get("loc", ()) if p not in ("query", "body", "path"))
        return await api_error(request, ApiError(400, f"{where}: {first.get('msg', 'invalid')}", param=where or None))

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, error: StarletteHTTPException) -> JSONResponse:
        message = "Not found." if error.status_code == 404 else str(error.detail)
        return await api_error(request, ApiError(error.status_code, message))

    @app.exception_handler(Exception)
    async def unexpected(request: Request, error: Exception) -> JSONResponse:
        # Still a 500, but in the envelope the SDKs parse rather than Starlette's plain text.
        return await api_error(request, ApiError(500, "The server had an error while processing your request."))

    @app.get("/health")
    def health() -> dict:
        return {"status": "ok"}

    # --- /v1/batches --------------------------------------------------------------------------------
    @app.post("/v1/batches")
    async def create(request: Request, who: Principal = Depends(caller), s: Services = Depends(svc)) -> JSONResponse:
        declared = request.headers.get("content-length")
        if declared and declared.isdigit() and int(declared) > s.settings.max_body_bytes:
            raise ApiError(413, f"The request body is larger than the limit of {s.settings.max_body_bytes} bytes.")
        raw = await request.body()
        from starlette.concurrency import run_in_threadpool

        obj, created = await run_in_threadpool(batches.create_batch, s, who, raw,
                                               request.headers.get("idempotency-key"))
        return JSONResponse(obj, status_code=200)

    @app.get("/v1/batches")
    def list_batches(limit: int = 20, after: str | None = None, who: Principal = Depends(caller),
                     s: Services = Depends(svc)) -> dict:
        return batches.list_batches(s, who, limit, after)

    @app.get("/v1/batches/{batch_id}")
    def retrieve(batch_id: str, who: Principal = Depends(caller), s: Services = Depends(svc)) -> dict:
        return batches.batch_object(batches.owned_batch(s, who, batch_id))

    @app.get("/v1/batches/{batch_id}/results")
    def results(batch_id: str, limit: int = 100, after: str | None = None, who: Principal = Depends(caller),
                s: Services = Depends(svc)) -> dict:
        return batches.results_page(s, who, batch_id, limit, after)

    @app.get("/v1/batches/{batch_id}/output.jsonl", response_model=None)
    def output(batch_id: str, who: Principal = Depends(caller),
               s: Services = Depends(svc)) -> StreamingResponse | RedirectResponse:
        location = batches.export_location(s, who, batch_id)
        if location:  # large exports: a short-lived presigned S3 URL (clients follow the redirect)
            return RedirectResponse(location, status_code=302)
        lines = batches.export_lines(s, who, batch_id)
        return StreamingResponse(lines, media_type="application/jsonl",
                                 headers={"Content-Disposition": f'attachment; filename="{batch_id}.jsonl"'})

    @app.post("/v1/batches/{batch_id}/cancel")
    def cancel(batch_id: str, who: Principal = Depends(caller), s: Services = Depends(svc)) -> dict:
        return batches.cancel_batch(s, who, batch_id)

    @app.delete("/v1/batches/{batch_id}")
    def delete(batch_id: str, who: Principal = Depends(caller), s: Services = Depends(svc)) -> dict:
        return batches.delete_batch(s, who, batch_id)

    # --- Extensions while they are off ------------------------------------------------------------------
    @app.post("/v1/files")
    def upload_file(who: Principal = Depends(caller), s: Services = Depends(svc)) -> dict:
        raise ApiError(400, "File batches are not enabled.", code="file_batches_disabled")

    @app.get("/v1/files")
    def list_files(who: Principal = Depends(caller)) -> dict:
        return {"object": "list", "data": [], "first_id": None, "last_id": None, "has_more": False}

    @app.api_route("/v1/files/{file_id}", methods=["GET", "DELETE"])
    @app.get("/v1/files/{file_id}/content")
    def file_not_found(file_id: str, who: Principal = Depends(caller)) -> dict:
        raise ApiError(404, f"No file found with id '{file_id}'.", code="file_not_found", param="file_id")

    for prefix in ("", "/anthropic"):
        @app.post(prefix + "/v1/messages/batches")
        def create_message_batch(who: Principal = Depends(caller)) -> dict:
            raise ApiError(403, "Message Batches are not enabled.")

        @app.get(prefix + "/v1/messages/batches")
        def list_message_batches(who: Principal = Depends(caller)) -> dict:
            return {"data": [], "has_more": False, "first_id": None, "last_id": None}

        @app.api_route(prefix + "/v1/messages/batches/{batch_id}", methods=["GET", "DELETE"])
        def message_batch_not_found(batch_id: str, who: Principal = Depends(caller)) -> dict:
            raise ApiError(404, f"No Message Batch found with id '{batch_id}'.")

    @app.put("/v1/batch_webhook")
    def set_webhook(who: Principal = Depends(caller)) -> dict:
        raise ApiError(400, "Batch webhooks are not enabled.", code="webhooks_disabled")

    @app.api_route("/v1/batch_webhook", methods=["GET", "DELETE"])
    def webhook_not_found(who: Principal = Depends(caller)) -> dict:
        raise ApiError(404, "No batch webhook is set.", code="webhook_not_found")

    @app.get("/v1/batch_webhook/events")
    def webhook_events(who: Principal = Depends(caller)) -> dict:
        return {"object": "list", "data": [], "has_more": False}

    return app
