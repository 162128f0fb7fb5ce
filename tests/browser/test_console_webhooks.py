"""The console's Webhook section in a real headless Chromium, against the local stack (conftest.py): setting a
webhook and seeing its secret once, its deliveries, rotating and removing it, and the section against the
/v1/batch_webhook routes' contract, answered by the browser. A receiver on 127.0.0.1 takes the deliveries."""

from __future__ import annotations

import http.server
import json
import threading
import time
from urllib.parse import parse_qs, urlparse

import httpx
import pytest

from tests.browser.conftest import XSS, expect, screenshot, sign_in, wait_for
from tests.helpers import chat_request

pytestmark = pytest.mark.e2e


# --- Webhooks ---------------------------------------------------------------------------------------------

class Receiver:
    """A webhook endpoint on 127.0.0.1 that answers 200 and keeps what it was sent."""

    def __init__(self) -> None:
        received = self.received = []

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802
                received.append(self.rfile.read(int(self.headers.get("content-length") or 0)))
                self.send_response(200)
                self.end_headers()

            def log_message(self, *args) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hook"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def test_webhook_set_show_secret_once_list_deliveries_and_remove(page, stack):
    config = httpx.get(f"{stack['url']}/console/config.json", trust_env=False).json()
    assert config["webhooks_enabled"] is True
    receiver = Receiver()
    try:
        sign_in(page, stack)
        section = page.locator("#webhook")
        expect(section).to_be_visible()
        section.get_by_label("Webhook URL").fill(receiver.url)
        section.get_by_role("button", name="Save webhook").click()
        secret_box = page.locator("#webhook-secret")
        expect(secret_box).to_be_visible()
        secret = page.get_by_label("Secret", exact=True).input_value()
        assert secret
        section.get_by_role("button", name="Copy").click()
        expect(page.locator("#webhook-copied")).to_have_text("Copied to the clipboard.")
        assert page.evaluate("navigator.clipboard.readText()") == secret
        section.get_by_role("button", name="Done").click()
        expect(secret_box).to_be_hidden()
        expect(page.locator("#webhook-current")).to_contain_text(receiver.url)
        current = stack["http"].get("/v1/batch_webhook").json()
        assert current["url"] == receiver.url and "secret" not in current

        # Saving again shows no secret; rotating shows a new one.
        # (The flash of the first save may still show: wait for each PUT's own answer.)
        with page.expect_response(lambda r: r.url.endswith("/v1/batch_webhook") and r.request.method == "PUT"):
            section.get_by_role("button", name="Save webhook").click()
        expect(page.locator("#flash")).to_contain_text("Webhook saved.")
        expect(secret_box).to_be_hidden()
        section.get_by_label("Rotate the signing secret").check()
        with page.expect_response(lambda r: r.url.endswith("/v1/batch_webhook") and r.request.method == "PUT") as put:
            section.get_by_role("button", name="Save webhook").click()
        assert json.loads(put.value.request.post_data)["rotate_secret"] is True
        expect(secret_box).to_be_visible()
        assert page.get_by_label("Secret", exact=True).input_value() not in ("", secret)

        # A batch that ends now is delivered, and listed.
        answer = stack["http"].post("/v1/batches", json={"requests": [chat_request("hooked", "hello")]})
        batch_id = answer.json()["id"]
        wait_for(lambda: stack["http"].get(f"/v1/batches/{batch_id}").json()["status"] == "completed", 30, "batch")
        events = page.locator("#event-rows tr").filter(has_text=batch_id)
        deadline = time.monotonic() + 30
        while events.count() == 0 and time.monotonic() < deadline:
            section.get_by_role("button", name="Refresh deliveries").click()
            page.wait_for_timeout(1000)
        expect(events.first).to_contain_text("batch.")

        section.get_by_role("button", name="Remove webhook").click()
        page.locator("dialog#confirm").get_by_role("button", name="Remove webhook").click()
        expect(page.locator("#webhook-current")).to_contain_text("No webhook is set.")
        assert stack["http"].get("/v1/batch_webhook").status_code == 404
    finally:
        receiver.close()


def test_a_webhook_read_answering_after_a_save_does_not_undo_it(page, stack):
    """The page reads the webhook when it opens; when that read answers only after the user saved one, the page
    keeps showing what was saved, not the "No webhook is set." the read found when it began."""
    receiver = Receiver()
    held = []

    def handle(route, request) -> None:
        if request.method == "GET" and urlparse(request.url).path == "/v1/batch_webhook" and not held:
            held.append(route)  # answered below, after the save
            return
        route.continue_()

    page.route("**/v1/batch_webhook", handle)
    try:
        sign_in(page, stack)
        wait_for(lambda: held, 10, "the page's first read of the webhook")
        section = page.locator("#webhook")
        section.get_by_label("Webhook URL").fill(receiver.url)
        with page.expect_response(lambda r: r.url.endswith("/v1/batch_webhook") and r.request.method == "PUT"):
            section.get_by_role("button", name="Save webhook").click()
        expect(page.locator("#webhook-current")).to_contain_text(receiver.url)
        held[0].fulfill(status=404, content_type="application/json", body=json.dumps({"error": {
            "message": "No batch webhook is set.", "type": "not_found_error", "param": None,
            "code": "webhook_not_found"}}))
        page.wait_for_timeout(300)
        expect(page.locator("#webhook-current")).to_contain_text(receiver.url)
        expect(page.locator("#webhook-remove")).to_be_visible()
    finally:
        stack["http"].delete("/v1/batch_webhook")
        receiver.close()


def test_webhook_section_follows_the_routes_contract(page, stack):
    """The Webhook section against the /v1/batch_webhook contract (api/schemas.py: WebhookObject,
    WebhookEventList), answered here by the browser (page.route), so that the page is checked whatever the
    stack's webhooks: 404 when none, the secret only in the first and the rotating PUT answers, deliveries with
    their attempts and paging, remove; and HTML in what they hold shows as text."""
    state: dict = {"hook": None, "secret_n": 0, "put": [], "after": []}

    def answer(route, status: int, body: dict) -> None:
        route.fulfill(status=status, content_type="application/json", body=json.dumps(body))

    def event(n: int, kind: str, status: str, attempts: list[tuple], **delivery) -> dict:
        return {"id": f"evt_{n}", "object": "event", "type": kind, "created_at": 1_800_000_000 + n * 100,
                "data": {"id": f"batch_{n}"}, "delivery": {"status": status, "next_attempt_at": None, **delivery,
                "attempts": [{"at": 1_800_000_000 + n * 100 + i, "url": "https://example.com/hook", "status_code": c,
                              "error": e, "duration_ms": 40 + i} for i, (c, e) in enumerate(attempts)]}}

    newest = [event(3, "batch.failed", "pending", [(None, f"connect failed {XSS}")], next_attempt_at=1_800_000_400),
              event(2, "batch.completed", "delivered", [(500, "HTTP 500"), (200, None)])]
    oldest = [event(1, "message_batch.ended", "skipped", [], reason="no webhook was set")]

    def handle(route, request) -> None:
        assert request.headers.get("authorization") == f"Bearer {stack['key']}"
        url = urlparse(request.url)
        query = parse_qs(url.query)
        if url.path == "/v1/batch_webhook/events":
            state["after"].append(query.get("after", [None])[0])
            more = query.get("after") == ["evt_2"]
            answer(route, 200, {"object": "list", "data": oldest if more else newest, "has_more": not more,
                                "first_id": None, "last_id": None})
        elif request.method == "GET":
            answer(route, 200, state["hook"]) if state["hook"] else answer(
                route, 404, {"error": {"message": "No batch webhook is set.", "type": "not_found_error",
                                       "param": None, "code": "webhook_not_found"}})
        elif request.method == "PUT":
            body = json.loads(request.post_data)
            state["put"].append(body)
            fresh = state["hook"] is None or body.get("rotate_secret")
            if fresh:
                state["secret_n"] += 1
            state["hook"] = {"object": "batch_webhook", "url": body["url"], "created_at": 1_800_000_000,
                             "updated_at": 1_800_000_500, "secret_created_at": 1_800_000_000 + state["secret_n"]}
            answer(route, 200, {**state["hook"], **({"secret": f"whsec_{state['secret_n']}"} if fresh else {})})
        elif request.method == "DELETE":
            answer(route, 200, {"object": "batch_webhook.deleted", "url": state["hook"]["url"], "deleted": True})
            state["hook"] = None

    page.route("**/console/config.json", lambda route: answer(route, 200, {
        "batches_enabled": True, "file_batches_enabled": True, "message_batches_enabled": True,
        "webhooks_enabled": True}))
    page.route("**/v1/batch_webhook**", handle)
    sign_in(page, stack)
    section = page.locator("#webhook")
    expect(section).to_be_visible()
    expect(page.locator("#webhook-current")).to_contain_text("No webhook is set.")
    expect(page.locator("#webhook-remove")).to_be_hidden()

    section.get_by_label("Webhook URL").fill("not a url")
    section.get_by_role("button", name="Save webhook").click()
    expect(page.locator("#webhook-alert")).to_contain_text("Enter the full URL")
    assert state["put"] == []

    url = f"https://example.com/hook?x={XSS}"
    section.get_by_label("Webhook URL").fill(url)
    section.get_by_role("button", name="Save webhook").click()
    expect(page.get_by_label("Secret", exact=True)).to_have_value("whsec_1")
    assert state["put"] == [{"url": url, "rotate_secret": False}]
    section.get_by_role("button", name="Copy").click()
    expect(page.locator("#webhook-copied")).to_have_text("Copied to the clipboard.")
    assert page.evaluate("navigator.clipboard.readText()") == "whsec_1"
    section.get_by_role("button", name="Done").click()
    expect(page.locator("#webhook-secret")).to_be_hidden()
    assert page.get_by_label("Secret", exact=True).input_value() == ""  # not kept in the page either
    expect(page.locator("#webhook-current")).to_contain_text(url)
    expect(page.locator("#webhook-current")).to_contain_text("Secret created")

    section.get_by_role("button", name="Save webhook").click()
    expect(page.locator("#flash")).to_contain_text("Webhook saved.")
    expect(page.locator("#webhook-secret")).to_be_hidden()
    section.get_by_label("Rotate the signing secret").check()
    section.get_by_role("button", name="Save webhook").click()
    expect(page.get_by_label("Secret", exact=True)).to_have_value("whsec_2")
    assert state["put"][-1] == {"url": url, "rotate_secret": True}

    events = page.locator("#event-rows tr")
    expect(events).to_have_count(2)
    expect(events.nth(0)).to_contain_text("batch.failed")
    expect(events.nth(0)).to_contain_text("pending")
    expect(events.nth(0)).to_contain_text(f"1; last: no answer in 40 ms (connect failed {XSS})")
    expect(events.nth(1)).to_contain_text("delivered")
    expect(events.nth(1)).to_contain_text("2; last: 200 in 41 ms")
    section.get_by_role("button", name="Show older deliveries").click()
    expect(events).to_have_count(3)
    expect(events.nth(2)).to_contain_text("skipped no webhook was set")
    expect(section.get_by_role("button", name="Show older deliveries")).to_be_hidden()
    assert state["after"][-1] == "evt_2"
    assert section.locator("img").count() == 0
    screenshot(page, "webhook-desktop")

    section.get_by_role("button", name="Remove webhook").click()
    page.locator("dialog#confirm").get_by_role("button", name="Remove webhook").click()
    expect(page.locator("#webhook-current")).to_contain_text("No webhook is set.")
    assert state["hook"] is None
