"""The console's routes without a browser (tests/browser drives the page itself): its files come from the core
package, so they ship in the Lambda layer; config.json says what Settings turned on; none of it needs a key or
appears in the API's document; and the script builds the page without parsing data as HTML."""

from __future__ import annotations

import re

from fastapi.testclient import TestClient

from batchinfer.api.app import create_app
from batchinfer.settings import Settings
from infra.layers import CORE_LAYER_DIR

CONSOLE = CORE_LAYER_DIR / "python" / "batchinfer" / "api" / "console"


class _Services:
    def __init__(self, **settings) -> None:
        self.settings = Settings(**settings)


def client(**settings) -> TestClient:
    services = _Services(**settings)
    return TestClient(create_app(lambda: services))


def test_the_page_and_its_files_are_served_from_the_core_layer_without_a_key():
    http = client()
    for path, media_type, name in (("/console", "text/html", "index.html"),
                                   ("/console/console.js", "text/javascript", "console.js"),
                                   ("/console/console.css", "text/css", "console.css")):
        answer = http.get(path)
        assert answer.status_code == 200, (path, answer.text)
        assert answer.headers["content-type"].startswith(media_type)
        assert answer.content == (CONSOLE / name).read_bytes()  # the layer's copy (infra.layers ships it whole)
        assert answer.headers["x-content-type-options"] == "nosniff"
    csp = http.get("/console").headers["content-security-policy"]
    assert "script-src 'self'" in csp and "default-src 'none'" in csp and "unsafe-inline" not in csp
    assert http.get("/console/", follow_redirects=False).headers["location"].endswith("/console")


def test_config_json_says_which_extensions_settings_turned_on():
    assert client().get("/console/config.json").json() == {
        "batches_enabled": True, "file_batches_enabled": False, "message_batches_enabled": False,
        "webhooks_enabled": False}
    on = client(file_batches_enabled=True, message_batches_enabled=True, batch_webhooks_enabled=True)
    assert on.get("/console/config.json").json() == {
        "batches_enabled": True, "file_batches_enabled": True, "message_batches_enabled": True,
        "webhooks_enabled": True}


def test_the_console_is_not_part_of_the_api_document():
    paths = client().get("/openapi.json").json()["paths"]
    assert not [p for p in paths if p.startswith("/console")]


def test_the_script_never_parses_data_as_html_and_keeps_the_key_out_of_cookies_and_urls():
    script = (CONSOLE / "console.js").read_text()
    for sink in ("innerHTML", "outerHTML", "insertAdjacentHTML", "document.write", "eval(", "new Function",
                 "document.cookie", "localStorage"):
        assert sink not in script, sink
    html = (CONSOLE / "index.html").read_text()
    assert not re.search(r"<script>|\son[a-z]+=", html), "no inline script or handler (the CSP forbids them)"
    key_input = re.search(r"<input id=\"api-key\"[^>]*>", html)[0]
    assert "name=" not in key_input, "a form sent without the script must not carry the key into a URL"
    assert "sessionStorage" in script and 'credentials: "omit"' in script


def test_the_api_function_serves_the_page_as_api_gateway_calls_it(api):
    """Through the Lambda handler (Mangum, an API Gateway HTTP API event), as deployed: the bytes arrive whole."""
    for path, name in (("/console", "index.html"), ("/console/console.js", "console.js"),
                       ("/console/console.css", "console.css")):
        reply = api("GET", path)
        assert reply.status == 200 and reply.body == (CONSOLE / name).read_bytes(), path
    assert api("GET", "/console/config.json").json()["batches_enabled"] is True
