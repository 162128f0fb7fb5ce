"""`/docs` (Swagger UI) and `/redoc`: the API reference rendered from `/openapi.json`, when `API_DOCS_ENABLED`
is on (the local stack turns it on; a deployment has it off: those paths are then 404, and `/openapi.json`
stays for any tool).

The pages share the console's origin, where users type their API keys, so they load nothing from another
origin: the scripts are pinned copies shipped in the core package (`api/api_docs/`), each referenced with its
Subresource Integrity hash, under a Content-Security-Policy that allows scripts from this origin only and
connections to this API only."""

from __future__ import annotations

from functools import cache
from importlib.resources import files

from fastapi import APIRouter, Depends, HTTPException
from fastapi.responses import Response

from ...runtime import Services
from ..auth import services_of

ASSETS = files("batchinfer.api").joinpath("api_docs")
# Each shipped file, its version and its SRI hash (sha384). A file that does not match is never served.
PINNED = {
    "swagger-ui-bundle.js": ("swagger-ui-dist 5.35.0",
                             "sha384-gjRm0bEPMeTmMh5jT2cHccIwCUZSTd8YC+j0d0sXw0MdGEfScduGpSyF3ZSSLkX9"),
    "swagger-ui.css": ("swagger-ui-dist 5.35.0",
                       "sha384-WlYgdmXYOOBWL5apwjDEZwN+U3HmXSSu5R6V5aGxEcf7z+KuRNwBhoxKVN1i3D5I"),
    "redoc.standalone.js": ("redoc 2.5.2", "sha384-70P5pmIdaQdVbxvjhrcTDv1uKcKqalZ3OHi7S2J+uzDl0PW8dO6L+pHOpm9EEjGJ"),
    "swagger-init.js": ("this service", None),
}
# Scripts and styles from this origin only (the pages' styles set inline style attributes, hence
# 'unsafe-inline' for styles and never for scripts); Redoc's search runs in a worker made from a blob.
CSP = ("default-src 'none'; script-src 'self'; style-src 'self' 'unsafe-inline'; img-src 'self' data:; "
       "font-src 'self'; connect-src 'self'; worker-src blob:; base-uri 'none'; form-action 'none'; "
       "frame-ancestors 'none'")
HEADERS = {"Cache-Control": "no-cache", "X-Content-Type-Options": "nosniff", "Referrer-Policy": "no-referrer"}
PAGE_HEADERS = {**HEADERS, "Content-Security-Policy": CSP, "X-Frame-Options": "DENY"}
TYPES = {".js": "text/javascript; charset=utf-8", ".css": "text/css; charset=utf-8"}

router = APIRouter(tags=["docs"], include_in_schema=False)


@cache
def asset(name: str) -> bytes:
    return ASSETS.joinpath(name).read_bytes()


def integrity(name: str) -> str:
    """The SRI attribute of a pinned file (its own script has none: it is written here, not downloaded)."""
    digest = PINNED[name][1]
    return f' integrity="{digest}" crossorigin="anonymous"' if digest else ""


def _enabled(svc: Services) -> None:
    if not svc.settings.api_docs_enabled:
        raise HTTPException(status_code=404)  # what any unknown path answers


def _page(title: str, head: str, body: str) -> Response:
    html = (f'<!doctype html>\n<html lang="en"><head><meta charset="utf-8"><title>{title}</title>'
            f'<meta name="viewport" content="width=device-width, initial-scale=1">{head}</head>'
            f"<body>{body}</body></html>\n")
    return Response(html, media_type="text/html; charset=utf-8", headers=PAGE_HEADERS)


@router.get("/docs")
def swagger_ui(svc: Services = Depends(services_of)) -> Response:
    _enabled(svc)
    return _page("Batch inference API (Swagger UI)",
                 f'<link rel="stylesheet" href="docs/assets/swagger-ui.css"{integrity("swagger-ui.css")}>',
                 '<div id="swagger-ui"></div>'
                 f'<script src="docs/assets/swagger-ui-bundle.js"{integrity("swagger-ui-bundle.js")}></script>'
                 '<script src="docs/assets/swagger-init.js"></script>')


@router.get("/redoc")
def redoc(svc: Services = Depends(services_of)) -> Response:
    _enabled(svc)
    return _page("Batch inference API (Redoc)", "",
                 '<redoc spec-url="openapi.json"></redoc>'
                 f'<script src="docs/assets/redoc.standalone.js"{integrity("redoc.standalone.js")}></script>')


@router.get("/docs/assets/{name}")
def docs_asset(name: str, svc: Services = Depends(services_of)) -> Response:
    _enabled(svc)
    if name not in PINNED:
        raise HTTPException(status_code=404)  # what any unknown path answers
    return Response(asset(name), media_type=TYPES[name[name.rindex("."):]],
                    headers={**HEADERS, "Cache-Control": "public, max-age=86400"})
