"""The API reference pages (`/docs`, `/redoc`) as a browser gets them: off in a deployment (404, like any unknown
path, while `/openapi.json` stays), on in the local stack, and then loading nothing from another origin: every
script and style is a pinned copy from the service's own origin, with its Subresource Integrity hash matching
the bytes served, under a Content-Security-Policy that allows scripts from that origin only."""

from __future__ import annotations

import base64
import hashlib
import re

import pytest
from fastapi.testclient import TestClient

from batchinfer.api.app import create_app
from batchinfer.settings import Settings
from local.run import local_settings


class _Services:
    def __init__(self, settings: Settings) -> None:
        self.settings = settings


def client(settings: Settings) -> TestClient:
    services = _Services(settings)
    return TestClient(create_app(lambda: services))


def test_a_deployment_serves_no_reference_pages_but_keeps_the_api_document(monkeypatch):
    monkeypatch.delenv("API_DOCS_ENABLED", raising=False)
    http = client(Settings())
    for path in ("/docs", "/redoc", "/docs/assets/swagger-ui-bundle.js", "/docs/assets/redoc.standalone.js",
                 "/docs/oauth2-redirect"):
        answer = http.get(path)
        assert answer.status_code == 404, path
        assert answer.json()["error"]["message"] == http.get("/no-such-page").json()["error"]["message"]
    assert http.get("/openapi.json").json()["paths"]


@pytest.mark.parametrize("path", ["/docs", "/redoc"])
def test_the_local_stack_serves_each_page_with_pinned_same_origin_scripts_and_a_csp(monkeypatch, path):
    monkeypatch.delenv("API_DOCS_ENABLED", raising=False)
    settings = local_settings()
    assert settings.api_docs_enabled
    http = client(settings)
    page = http.get(path)
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    csp = page.headers["content-security-policy"]
    directives = dict(d.strip().split(" ", 1) for d in csp.split(";"))
    assert directives["default-src"] == "'none'" and directives["script-src"] == "'self'"
    assert directives["connect-src"] == "'self'" and directives["frame-ancestors"] == "'none'"
    assert "http" not in csp  # no other origin is allowed anything
    assert page.headers["x-frame-options"] == "DENY"
    html = page.text
    assert "http://" not in html and "https://" not in html and "//" not in html.replace("<!doctype", "")
    assert "<script>" not in html  # nothing inline: the CSP would refuse it
    loaded = re.findall(r'<(?:script src|link rel="stylesheet" href)="([^"]+)"([^>]*)>', html)
    assert loaded
    for url, attributes in loaded:
        assert url.startswith("docs/assets/"), url  # relative: this origin, under any stage path
        asset = http.get("/" + url)
        assert asset.status_code == 200, url
        assert asset.headers["x-content-type-options"] == "nosniff"
        if url.endswith("swagger-init.js"):
            continue  # the service's own script, shipped beside the page
        digest = base64.b64encode(hashlib.sha384(asset.content).digest()).decode()
        assert f'integrity="sha384-{digest}"' in attributes, url
    assert http.get("/docs/assets/../settings.py").status_code == 404
    assert http.get("/docs/assets/README.md").status_code == 404


def test_the_swagger_page_reads_this_services_document_and_calls_no_validator():
    script = client(Settings(api_docs_enabled=True)).get("/docs/assets/swagger-init.js").text
    assert 'new URL("openapi.json", document.baseURI)' in script
    assert "validatorUrl: null" in script
