"""The API reference pages in a real browser (Debian's /usr/bin/chromium, as the console's tests use): with
`API_DOCS_ENABLED` on (the local stack), Swagger UI and Redoc render every operation of /openapi.json from
the service's own origin under its Content-Security-Policy, and nothing from another origin loads."""

from __future__ import annotations

from pathlib import Path

import pytest

from batchinfer.api.app import create_app
from batchinfer.settings import Settings
from local.servers import UvicornThread, free_port
from tests.browser.conftest import CHROMIUM, CHROMIUM_ARGS

sync_api = pytest.importorskip("playwright.sync_api", reason="playwright is in requirements-dev.txt: run `make venv`")

pytestmark = pytest.mark.e2e


class _Services:
    settings = Settings(api_docs_enabled=True)


@pytest.fixture(scope="module")
def api():
    server = UvicornThread(create_app(lambda: _Services), free_port()).start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="module")
def browser():
    assert Path(CHROMIUM).exists(), "make browser installs /usr/bin/chromium"  # as the console's tests
    with sync_api.sync_playwright() as playwright:
        chromium = playwright.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        yield chromium
        chromium.close()


@pytest.mark.parametrize(("path", "operation"), [("/docs", ".opblock"), ("/redoc", "li[data-item-id^='tag/']")])
def test_each_page_renders_the_api_from_this_origin_only(api, browser, path, operation):
    page = browser.new_page()
    loaded: list[str] = []
    violations: list[str] = []
    page.on("requestfinished", lambda request: loaded.append(request.url))
    page.on("console", lambda message: "Content Security Policy" in message.text and violations.append(message.text))
    page.goto(api.url + path)
    page.wait_for_selector(operation, timeout=30_000)
    assert page.locator(operation).count() >= 10
    assert loaded and all(url.startswith((api.url, "data:", "blob:")) for url in loaded), loaded
    # Only Redoc's "powered by" logo, an image it links from its vendor's CDN, is refused by the CSP.
    assert all("logo-mini.svg" in violation for violation in violations), violations
    page.close()
