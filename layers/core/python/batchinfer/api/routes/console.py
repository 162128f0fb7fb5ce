"""`/console`: the Batches page, static files shipped in the core package (`api/console/`) that call the API
from the browser with the key the user signs in with. Loading them needs no key; they are not part of the
API, so they stay out of /openapi.json. `config.json` tells the page which extensions are on."""

from __future__ import annotations

from functools import cache
from importlib.resources import files

from fastapi import APIRouter, Depends
from fastapi.responses import JSONResponse, RedirectResponse, Response

from ...runtime import Services
from ..auth import services_of

ASSETS = files("batchinfer.api").joinpath("console")
# What the page may load: its own script, style and API, nothing inline, no frames, no other origin.
CSP = ("default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; img-src 'self' data:; "
       "base-uri 'none'; form-action 'none'; frame-ancestors 'none'")
HEADERS = {"Cache-Control": "no-cache", "X-Content-Type-Options": "nosniff", "Referrer-Policy": "no-referrer"}

router = APIRouter(prefix="/console", tags=["console"], include_in_schema=False)


@cache
def asset(name: str) -> bytes:
    return ASSETS.joinpath(name).read_bytes()


@router.get("")
def page() -> Response:
    return Response(asset("index.html"), media_type="text/html; charset=utf-8",
                    headers={**HEADERS, "Content-Security-Policy": CSP, "X-Frame-Options": "DENY"})


@router.get("/")
def page_with_a_slash() -> RedirectResponse:
    # The page's own links are relative to /console. A relative Location: the client stays on the host it
    # asked, whatever its Host header said.
    return RedirectResponse("../console", status_code=307, headers=HEADERS)


@router.get("/console.js")
def script() -> Response:
    return Response(asset("console.js"), media_type="text/javascript; charset=utf-8", headers=HEADERS)


@router.get("/console.css")
def style() -> Response:
    return Response(asset("console.css"), media_type="text/css; charset=utf-8", headers=HEADERS)


@router.get("/config.json")
def config(svc: Services = Depends(services_of)) -> JSONResponse:
    settings = svc.settings
    return JSONResponse({"batches_enabled": settings.batches_enabled,
                         "file_batches_enabled": settings.file_batches_enabled,
                         "message_batches_enabled": settings.message_batches_enabled,
                         "webhooks_enabled": settings.batch_webhooks_enabled}, headers=HEADERS)
