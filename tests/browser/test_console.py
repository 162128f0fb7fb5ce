"""The console's Batches page (/console) in a real headless Chromium, against the local stack.

The browser is Debian's /usr/bin/chromium (`make browser` installs it; `make test` depends on it), driven by
Playwright's Python package; Playwright's own browser downloads are never used. The tests run in file order
on one stack: the batches are made once (finished ones, then two kept running: the simulated backend holds
their requests in flight), the first two tests use the running ones and let their requests go; every other
test starts with the backend answering. Screenshots of the list and of a batch,
at desktop and phone widths, are written to test-artifacts/console/.
"""

from __future__ import annotations

import http.server
import json
import threading
import time
from pathlib import Path
from urllib.parse import parse_qs, urlparse

import httpx
import pytest

from batchinfer.api.app import create_app
from batchinfer.settings import Settings
from local.run import start
from local.servers import UvicornThread, free_port
from tests.helpers import chat_request

sync_api = pytest.importorskip("playwright.sync_api", reason="playwright is in requirements-dev.txt: run `make venv`")
expect = sync_api.expect

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]
ARTIFACTS = ROOT / "test-artifacts" / "console"
CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]
DESKTOP = {"width": 1280, "height": 800}
PHONE = {"width": 375, "height": 740}
XSS = '<img src=x onerror="window.__xss=1;alert(1)">'
XSS_META = "<script>window.__xss=2</script><img src=x onerror=alert(2)>"
ANTHROPIC = {"anthropic-version": "2023-06-01"}
REFRESH_MS = 5000  # how often the page refreshes an unfinished batch or a list holding one (console.js)

expect.set_options(timeout=10_000)


def message_entry(custom_id: str, content: str, model: str = "glm-5.3-flash") -> dict:
    return {"custom_id": custom_id, "params": {"model": model, "max_tokens": 16,
                                               "messages": [{"role": "user", "content": content}]}}


def message_tokens(stack) -> str:
    """The tokens the page shows for the finished Message Batch: "total (input in, output out)", from its
    object's `usage` (an extension), which holds the one succeeded request's tokens."""
    ended = stack["http"].get(f"/v1/messages/batches/{stack['ids']['message']}", headers=ANTHROPIC).json()
    usage = ended["usage"]
    assert usage["input_tokens"] > 0 and usage["output_tokens"] > 0 and ended["cost_usd"] > 0, ended
    return f"{usage['total_tokens']:,} ({usage['input_tokens']:,} in, {usage['output_tokens']:,} out)"


def wait_for(check, timeout: float = 30.0, what: str = "condition"):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(0.5)  # the stack's moto serves one call at a time: poll gently
    raise AssertionError(f"timed out waiting for {what}")


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    """The local stack with file batches, Message Batches and webhooks on, holding: finished batches of every
    kind, one with HTML in its custom_id and metadata, and an inline batch and a Message Batch whose requests
    are still running."""
    state = tmp_path_factory.mktemp("console-stack") / ".local"
    # The test's webhook receiver listens on 127.0.0.1, which only WEBHOOK_ALLOW_LOOPBACK lets a webhook
    # reach (tests only).
    settings = Settings(table_name="e2e-console", bucket_name="e2e-console", stage="e2e-console",
                        file_batches_enabled=True, message_batches_enabled=True, batch_webhooks_enabled=True,
                        webhook_allow_loopback=True)
    sim_port = free_port()
    svc, key, stop = start(settings, free_port(), sim_port, pollers=2, state_dir=state)
    api = UvicornThread(create_app(), free_port()).start()
    sim = httpx.Client(base_url=f"http://127.0.0.1:{sim_port}", timeout=10, trust_env=False)
    http = httpx.Client(base_url=api.url, headers={"Authorization": f"Bearer {key}"}, timeout=30, trust_env=False)
    try:
        def create(requests: list[dict], **payload) -> str:
            answer = http.post("/v1/batches", json={"requests": requests, **payload})
            assert answer.status_code == 200, answer.text
            return answer.json()["id"]

        def create_messages(entries: list[dict]) -> str:
            answer = http.post("/v1/messages/batches", headers=ANTHROPIC, json={"requests": entries})
            assert answer.status_code == 200, answer.text
            return answer.json()["id"]

        ids = {}
        ids["doomed"] = create([chat_request("only", "delete me")])
        lines = "\n".join(json.dumps(chat_request(f"line-{i}", f"file {i}" + (" [[sim:400]]" if i == 1 else "")))
                          for i in range(3))
        upload = http.post("/v1/files", files={"file": ("input.jsonl", lines.encode(), "application/jsonl")},
                           data={"purpose": "batch"})
        assert upload.status_code == 200, upload.text
        answer = http.post("/v1/batches", json={"input_file_id": upload.json()["id"],
                                                "endpoint": "/v1/chat/completions", "completion_window": "24h"})
        assert answer.status_code == 200, answer.text
        ids["file"] = answer.json()["id"]
        ids["message"] = create_messages([message_entry("fine", "hello"), message_entry("wrong", "hi", model="nope")])
        ids["xss"] = create([chat_request(XSS, f"say {XSS}"), chat_request("plain", "hello")],
                            metadata={"note": XSS_META, "<b>key</b>": XSS})
        ids["mixed"] = create([chat_request(f"req-{i}", f"hello {i}" + (" [[sim:400]]" if i % 3 == 0 else ""))
                               for i in range(7)], metadata={"purpose": "console test"})

        def finished() -> bool:
            ours = [http.get(f"/v1/batches/{ids[n]}").json()["status"] for n in ("doomed", "file", "xss", "mixed")]
            ended = http.get(f"/v1/messages/batches/{ids['message']}", headers=ANTHROPIC).json()
            return all(s == "completed" for s in ours) and ended["processing_status"] == "ended"

        wait_for(finished, 60, "the finished batches")
        # Two batches kept running: the backend holds their requests in flight until a test lets them go.
        hold(sim, True)
        ids["running"] = create([chat_request("slow-1", "slow one"), chat_request("slow-2", "slow two")])
        ids["message_running"] = create_messages([message_entry("slow", "slow message")])
        wait_for(lambda: sim.get("/_sim/stats").json()["in_flight"] >= 3, 30, "the running requests to start")
        yield {"url": api.url, "key": key, "ids": ids, "http": http, "sim": sim, "svc": svc}
    finally:
        hold(sim, False)
        http.close()
        sim.close()
        api.stop()
        stop()


def hold(sim: httpx.Client, held: bool) -> None:
    """Hold every model request the simulated backend gets in flight, unanswered (True), or let them go."""
    sim.put("/_sim/config", json={"hold": held}).raise_for_status()


@pytest.fixture
def running_batches(stack) -> dict[str, str]:
    """The stack's two running batches (inline and Message Batch), their requests still held in flight."""
    return {name: stack["ids"][name] for name in ("running", "message_running")}


@pytest.fixture(scope="module")
def browser():
    if not CHROMIUM.exists():
        # A failure, not a skip: `make test` installs it first, so a missing browser is a broken set-up.
        pytest.fail(f"no {CHROMIUM}: run `make browser` (Debian's chromium package)", pytrace=False)
    with sync_api.sync_playwright() as playwright:
        chromium = playwright.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        yield chromium
        chromium.close()


@pytest.fixture
def page(browser, stack, request):
    """A fresh tab (its own sessionStorage) that fails the test on a script error or a blocked resource. The
    backend answers, unless the test uses the running batches."""
    if "running_batches" not in request.fixturenames:
        hold(stack["sim"], False)
    context = browser.new_context(viewport=DESKTOP, accept_downloads=True)
    context.grant_permissions(["clipboard-read", "clipboard-write"], origin=stack["url"])
    tab = context.new_page()
    problems: list[str] = []
    dialogs: list[str] = []
    tab.on("pageerror", lambda error: problems.append(f"script error: {error}"))
    tab.on("console", lambda m: problems.append(f"console: {m.text}") if m.type == "error"
           and "Failed to load resource" not in m.text else None)  # the API's 4xx answers are expected
    tab.on("dialog", lambda d: (dialogs.append(d.message), d.dismiss()))
    tab.problems, tab.dialogs = problems, dialogs
    yield tab
    context.close()
    assert not problems, problems
    assert not dialogs, f"a JavaScript dialog opened: {dialogs}"


def sign_in(page, stack) -> None:
    page.goto(f"{stack['url']}/console")
    page.get_by_label("API key").fill(stack["key"])
    page.get_by_role("button", name="Sign in").click()
    expect(page.get_by_role("heading", name="Batches", level=1)).to_be_visible()


def row(page, batch_id: str):
    return page.locator("#batch-rows tr").filter(has=page.get_by_role("link", name=batch_id, exact=True))


def open_batch(page, stack, name: str) -> None:
    batch_id = stack["ids"][name]
    page.goto(f"{stack['url']}/console#/batches/{batch_id}")
    expect(page.get_by_role("heading", name=batch_id, level=1)).to_be_visible()
    expect(page.locator("#batch-fields")).to_contain_text("Status")


def refreshed_until(page, assertion, timeout: float = 30.0) -> None:
    """Move the tab's clock (installed with `page.clock.install()` before the page opened) a refresh at a time
    until `assertion` holds: the page's own timed refreshes, without waiting REFRESH_MS for each."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            return assertion()
        except AssertionError:
            if time.monotonic() >= deadline:
                raise
        page.clock.run_for(REFRESH_MS)


def confirm(page, button: str, ok: str) -> None:
    """Click `button`, see the <dialog>, and press its `ok` button."""
    page.locator("#batch-actions").get_by_role("button", name=button).click()
    dialog = page.locator("dialog#confirm")
    expect(dialog).to_be_visible()
    assert dialog.evaluate("d => d.open && d.matches(':modal')")
    dialog.get_by_role("button", name=ok).click()
    expect(dialog).to_be_hidden()


def screenshot(page, name: str) -> Path:
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    path = ARTIFACTS / f"{name}.png"
    page.screenshot(path=str(path), full_page=True)
    return path


# --- Tests, in order ----------------------------------------------------------------------------------------

def test_keyboard_only_sign_in_keeps_the_key_in_session_storage_only(page, stack, running_batches):
    page.goto(f"{stack['url']}/console")
    expect(page.get_by_role("heading", name="Sign in")).to_be_visible()
    for _ in range(6):  # skip link, brand link, then the key's input
        page.keyboard.press("Tab")
        if page.evaluate("document.activeElement.id") == "api-key":
            break
    assert page.evaluate("document.activeElement.id") == "api-key"
    page.keyboard.type(stack["key"])
    page.keyboard.press("Enter")
    expect(page.get_by_role("heading", name="Batches", level=1)).to_be_focused()
    ids = stack["ids"]
    expect(row(page, ids["running"])).to_contain_text("in_progress")
    expect(row(page, ids["mixed"])).to_contain_text("completed")
    expect(row(page, ids["mixed"])).to_contain_text("4 completed · 3 failed of 7")
    expect(row(page, ids["file"])).to_contain_text("file")
    expect(row(page, ids["message"])).to_contain_text("Message Batch")
    expect(row(page, ids["message"])).to_contain_text("1 succeeded · 1 errored of 2")
    # A Message Batch's tokens and known cost, as its object's extension fields say them.
    expect(row(page, ids["message"])).to_contain_text(message_tokens(stack))
    expect(row(page, ids["message"]).locator("td[data-label=Cost]")).to_contain_text("$0.")
    expect(page.locator("#list-refreshing")).to_contain_text("Refreshing every 5 s")

    assert page.evaluate("sessionStorage.getItem('batchinfer.console.key')") == stack["key"]
    assert page.context.cookies() == []
    assert stack["key"] not in page.url and page.evaluate("localStorage.length") == 0
    assert page.get_by_label("API key").input_value() == ""

    # The list, with a running batch in it, at both widths.
    screenshot(page, "list-desktop")
    page.set_viewport_size(PHONE)
    assert page.evaluate("document.documentElement.scrollWidth") <= PHONE["width"], "no sideways scrolling"
    screenshot(page, "list-phone")
    page.set_viewport_size(DESKTOP)

    # On with the keyboard: Tab to a batch's link, Enter opens it.
    for _ in range(30):
        page.keyboard.press("Tab")
        if page.evaluate("document.activeElement.textContent") == ids["mixed"]:
            break
    page.keyboard.press("Enter")
    expect(page.get_by_role("heading", name=ids["mixed"], level=1)).to_be_focused()
    expect(page.locator("#batch-actions button").first).to_be_visible()
    page.keyboard.press("Tab")
    expect(page.locator("#batch-actions button").first).to_be_focused()
    outline = page.evaluate("getComputedStyle(document.activeElement).outlineStyle")
    assert outline == "solid", "the focused control shows a visible outline"


def change_priority(page, stack, name: str, priority: str) -> None:
    """A running batch's priority changed from its page: the page and the API show the new one."""
    shown = page.locator("#batch-fields dt", has_text="Priority").locator("+ dd")
    expect(shown).to_have_text("normal")
    control = page.get_by_label("Priority", exact=True)
    expect(control).to_have_value("normal")
    control.select_option(priority)
    expect(page.locator("#batch-alert")).to_contain_text(f"Priority set to {priority}")
    expect(shown).to_have_text(priority)
    path = "/v1/messages/batches" if name.startswith("message") else "/v1/batches"
    assert stack["http"].get(f"{path}/{stack['ids'][name]}", headers=ANTHROPIC).json()["priority"] == priority


def test_delete_and_cancel_while_running_explain_the_apis_refusals(page, stack, running_batches):
    ids = stack["ids"]
    page.clock.install()
    sign_in(page, stack)

    # A Message Batch that has not ended cannot be deleted: the console says why, and what the API said.
    open_batch(page, stack, "message_running")
    page.locator("#batch-actions").get_by_role("button", name="Delete batch").click()
    expect(page.locator("dialog#confirm")).to_be_visible()
    page.keyboard.press("Escape")  # "no": nothing is sent
    expect(page.locator("dialog#confirm")).to_be_hidden()
    expect(page.locator("#batch-alert")).to_be_hidden()
    confirm(page, "Delete batch", "Delete batch")
    alert = page.locator("#batch-alert")
    expect(alert).to_contain_text("A Message Batch can be deleted only after it has ended; cancel it first.")
    expect(alert).to_contain_text("has not ended yet")  # the API's own message
    change_priority(page, stack, "message_running", "high")  # while it runs, from the Priority control
    confirm(page, "Cancel batch", "Cancel batch")
    expect(page.locator("#batch-fields")).to_contain_text("canceling")

    # An inline batch with a request still running: cancel, then delete is refused until it finishes.
    open_batch(page, stack, "running")
    expect(page.locator("#result-rows")).to_contain_text("running")
    change_priority(page, stack, "running", "low")
    confirm(page, "Cancel batch", "Cancel batch")
    expect(page.locator("#batch-fields")).to_contain_text("cancelling")
    expect(page.locator("#batch-actions").get_by_role("button", name="Cancel batch")).to_have_count(0)
    confirm(page, "Delete batch", "Delete batch")
    expect(alert).to_contain_text(
        "A request of this batch is still running; cancel it and wait for it to finish, then delete.")
    expect(alert).to_contain_text("batch_running")
    expect(alert).to_contain_text("A request of this batch is still running. Cancel the batch")

    # Its request answers; the page refreshes itself while the batch is unfinished: it turns cancelled without
    # a reload.
    hold(stack["sim"], False)
    refreshed_until(page, lambda: expect(page.locator("#batch-fields .status")).to_have_text("cancelled",
                                                                                             timeout=1000))
    confirm(page, "Delete batch", "Delete batch")
    expect(page.get_by_role("heading", name="Batches", level=1)).to_be_visible()
    expect(page.locator("#flash")).to_contain_text(f"Deleted {ids['running']}")
    expect(row(page, ids["running"])).to_have_count(0)
    assert stack["http"].get(f"/v1/batches/{ids['running']}").status_code == 404


def test_pause_and_resume_a_running_batch(page, stack):
    """Pause (no request starts, running ones finish) and Resume, with no confirmation (both undo the other):
    the batch shows "paused" and since when, in its page and in the list, until it is resumed."""
    http, sim = stack["http"], stack["sim"]
    hold(sim, True)  # 40 requests, 16 at a time held in flight: it runs until they are let go
    try:
        answer = http.post("/v1/batches", json={"requests": [chat_request(f"p-{i}", f"pause {i}") for i in range(40)]})
        assert answer.status_code == 200, answer.text
        batch_id = stack["ids"]["paused"] = answer.json()["id"]
        page.clock.install()
        sign_in(page, stack)
        open_batch(page, stack, "paused")
        actions = page.locator("#batch-actions")
        actions.get_by_role("button", name="Pause batch").click()
        alert = page.locator("#batch-alert")
        expect(alert).to_contain_text("Paused: no request starts until you resume it")
        expect(page.locator("#batch-fields")).to_contain_text("paused")
        expect(page.locator("#batch-fields")).to_contain_text("Paused since")
        expect(actions.get_by_role("button", name="Pause batch")).to_have_count(0)
        assert http.get(f"/v1/batches/{batch_id}").json()["paused_at"] is not None
        page.goto(f"{stack['url']}/console#/batches")
        expect(row(page, batch_id)).to_contain_text("paused")
        screenshot(page, "list-paused")
        open_batch(page, stack, "paused")
        page.locator("#batch-actions").get_by_role("button", name="Resume batch").click()
        expect(page.locator("#batch-alert")).to_contain_text("Resumed: its requests start again within seconds.")
        expect(page.locator("#batch-fields")).not_to_contain_text("Paused since")
        expect(page.locator("#batch-actions").get_by_role("button", name="Pause batch")).to_be_visible()
        hold(sim, False)
        refreshed_until(page, lambda: expect(page.locator("#batch-fields .status").first).to_have_text(
            "completed", timeout=1000))
        expect(page.locator("#batch-fields")).not_to_contain_text("paused")
        # Gone again, so that the list the next tests page through is the one the stack made.
        assert http.delete(f"/v1/batches/{stack['ids'].pop('paused')}").status_code == 200
    finally:
        hold(sim, False)


def test_a_running_batch_shows_its_newest_finished_results(page, stack):
    """While a batch runs, its page shows the results that have finished, newest first, read from the API's
    finished order (an extension); once it has ended the section goes (the results table has them all)."""
    http = stack["http"]
    answer = http.post("/v1/batches", json={"requests": [
        chat_request("done-1", "quick one"), chat_request("done-2", "quick two"),
        chat_request("stuck", "[[sim:fail-always]] retried for a while")]})
    assert answer.status_code == 200, answer.text
    batch_id = stack["ids"]["newest"] = answer.json()["id"]
    try:
        wait_for(lambda: http.get(f"/v1/batches/{batch_id}").json()["request_counts"]["completed"] == 2, 30,
                 "two results to finish")
        page.clock.install()
        sign_in(page, stack)
        open_batch(page, stack, "newest")
        section = page.locator("#newest")
        expect(section).to_be_visible()
        rows = page.locator("#newest-rows tr")
        expect(rows).to_have_count(2)
        assert sorted(rows.locator(".custom-id").all_text_contents()) == ["done-1", "done-2"]
        expect(rows.locator(".status")).to_have_text(["completed", "completed"])
        expect(page.locator("#batch-fields .status").first).to_have_text("in_progress")
        assert http.post(f"/v1/batches/{batch_id}/cancel").status_code == 200
        refreshed_until(page, lambda: expect(section).to_be_hidden(timeout=1000))  # ended: a refresh drops it
    finally:
        http.post(f"/v1/batches/{batch_id}/cancel")
        wait_for(lambda: http.get(f"/v1/batches/{batch_id}").json()["status"] == "cancelled", 60, "the cancel")
        assert http.delete(f"/v1/batches/{stack['ids'].pop('newest')}").status_code == 200


def test_the_list_pages_through_both_apis_newest_first(page, stack):
    sign_in(page, stack)
    page.locator("#list-size").select_option("5")
    rows = page.locator("#batch-rows tr")
    expect(rows).to_have_count(5)
    first = rows.evaluate_all("rs => rs.map(r => r.dataset.batchId)")
    expect(page.get_by_role("button", name="Newer")).to_be_disabled()
    page.get_by_role("button", name="Older").click()
    expect(page.locator("#list-page")).to_have_text("Page 2")
    expect(rows).to_have_count(1)
    second = rows.evaluate_all("rs => rs.map(r => r.dataset.batchId)")
    expect(page.get_by_role("button", name="Older")).to_be_disabled()
    # Every batch of both APIs once, in each API's newest-first order, merged by creation time.
    openai = [b["id"] for b in stack["http"].get("/v1/batches", params={"limit": 100}).json()["data"]]
    message = [b["id"] for b in stack["http"].get("/v1/messages/batches", headers=ANTHROPIC).json()["data"]]
    shown = first + second
    assert sorted(shown) == sorted(openai + message) and len(shown) == 6  # 7 made, the running one deleted
    assert [i for i in shown if i.startswith("batch_")] == openai
    assert [i for i in shown if i.startswith("msgbatch_")] == message
    page.get_by_role("button", name="Newer").click()
    expect(page.locator("#list-page")).to_have_text("Page 1")
    assert rows.evaluate_all("rs => rs.map(r => r.dataset.batchId)") == first

    page.locator("#list-size").select_option("10")
    expect(rows).to_have_count(6)
    expect(row(page, stack["ids"]["mixed"])).to_contain_text("$")  # the known cost


def test_a_batch_shows_its_fields_and_pages_and_filters_its_results(page, stack):
    ids = stack["ids"]
    sign_in(page, stack)
    page.get_by_role("link", name=ids["mixed"], exact=True).click()
    expect(page.get_by_role("heading", name=ids["mixed"], level=1)).to_be_visible()
    fields = page.locator("#batch-fields")
    expect(fields).to_contain_text("console test")
    expect(fields).to_contain_text("/v1/chat/completions")
    batch = stack["http"].get(f"/v1/batches/{ids['mixed']}").json()
    expect(fields).to_contain_text(f"{batch['usage']['total_tokens']} ({batch['usage']['input_tokens']} in")
    # Its priority is shown; once a batch has ended there is no control to change it.
    expect(fields.locator("dt", has_text="Priority").locator("+ dd")).to_have_text("normal")
    expect(page.locator("#batch-priority")).to_have_count(0)

    page.locator("#results-size").select_option("5")
    results = page.locator("#result-rows tr")
    expect(results).to_have_count(5)
    expect(results.first).to_contain_text("batch_req_1")
    expect(results.first).to_contain_text("req-0")
    page.get_by_role("button", name="Next").click()
    expect(results).to_have_count(2)
    expect(results.nth(0)).to_contain_text("req-5")
    expect(results.nth(1)).to_contain_text("req-6")
    expect(page.get_by_role("button", name="Next")).to_be_disabled()
    page.get_by_role("button", name="Previous").click()
    expect(results).to_have_count(5)

    page.get_by_label("Status").select_option("failed")  # the API's filter: every failed one, a page of them
    expect(results).to_have_count(3)
    expect(results.nth(0)).to_contain_text("req-0")
    expect(results.nth(1)).to_contain_text("req-3")
    expect(results.nth(2)).to_contain_text("req-6")
    expect(results.nth(0)).to_contain_text("Request rejected by the simulated backend")
    expect(page.get_by_role("button", name="Next")).to_be_disabled()  # has_more is exact
    expect(page.locator("#results-note")).to_contain_text("the status filter is the API's")
    page.get_by_label("Status").select_option("completed")
    expect(results).to_have_count(4)
    expect(page.get_by_role("button", name="Next")).to_be_disabled()
    page.get_by_label("Status").select_option("")
    expect(results).to_have_count(5)

    completed = results.filter(has_text="req-1")
    expect(completed.locator("pre")).to_have_count(0)  # the body is fetched into the page on demand
    completed.get_by_text("Response body").click()
    expect(completed.locator("pre")).to_contain_text('"object": "chat.completion"')
    screenshot(page, "batch-desktop")
    page.set_viewport_size(PHONE)
    assert page.evaluate("document.documentElement.scrollWidth") <= PHONE["width"], "no sideways scrolling"
    screenshot(page, "batch-phone")

    # A Message Batch's results: its JSONL, once ended, with its own statuses; its tokens and cost beside them.
    open_batch(page, stack, "message")
    expect(page.locator("#batch-fields")).to_contain_text(message_tokens(stack))
    expect(page.locator("#batch-fields")).not_to_contain_text("Not part of")
    expect(results).to_have_count(2)
    page.get_by_label("Status").select_option("errored")
    expect(results).to_have_count(1)
    expect(results.first).to_contain_text("wrong")
    expect(results.first).to_contain_text("model: nope")


def test_a_batch_page_shows_its_analytics(page, stack):
    ids = stack["ids"]
    sign_in(page, stack)
    open_batch(page, stack, "mixed")
    analytics = stack["http"].get(f"/v1/batches/{ids['mixed']}").json()["analytics"]
    assert (analytics["attempts"], analytics["errors_by_code"]) == (7, {"invalid_request": 3}), analytics
    panel = page.get_by_role("region", name="Analytics")
    expect(panel).to_be_visible()
    expect(panel).to_contain_text("extension beyond the OpenAI and Anthropic APIs")

    def shown(label: str):
        return panel.locator("#analytics-fields > dt", has_text=label).locator("+ dd")

    expect(shown("Attempts")).to_have_text("7 (0 retries)")
    expect(shown("Errors by code")).to_have_text("invalid_request3")
    expect(shown("Errors by code").locator("dt")).to_have_text("invalid_request")
    rate = analytics["requests_per_minute"]
    expect(shown("Requests per minute")).to_have_text(str(int(rate)) if rate == int(rate) else str(rate))  # as JS
    expect(shown("Backend latency")).to_contain_text(f"p50 {round(analytics['p50_ms'])} ms")
    expect(shown("Started")).not_to_have_text("—")
    panel.scroll_into_view_if_needed()
    screenshot(page, "batch-analytics")
    # A Message Batch's (RFC 3339 times): its one request that ran; the other was refused before running.
    open_batch(page, stack, "message")
    expect(shown("Attempts")).to_have_text("1 (0 retries)")
    expect(shown("Errors by code")).to_have_text("none")
    expect(shown("Last finished").locator("time")).to_have_count(1)


def test_downloads_save_the_apis_bytes_under_their_names(page, stack):
    ids, http = stack["ids"], stack["http"]
    sign_in(page, stack)

    def saved(button: str) -> tuple[str, bytes]:
        with page.expect_download() as info:
            page.locator("#batch-actions").get_by_role("button", name=button).click()
        download = info.value
        return download.suggested_filename, Path(download.path()).read_bytes()

    open_batch(page, stack, "mixed")
    name, data = saved("Download output.jsonl")
    assert name == f"{ids['mixed']}.jsonl"
    assert data == http.get(f"/v1/batches/{ids['mixed']}/output.jsonl").content
    assert len(data.splitlines()) == 7

    open_batch(page, stack, "file")
    batch = http.get(f"/v1/batches/{ids['file']}").json()
    for button, file_id in (("Download output file", batch["output_file_id"]),
                            ("Download error file", batch["error_file_id"])):
        name, data = saved(button)
        assert data == http.get(f"/v1/files/{file_id}/content").content and data
        assert name.endswith(".jsonl") and name.startswith(ids["file"])

    open_batch(page, stack, "message")
    name, data = saved("Download results")
    assert name == f"{ids['message']}_results.jsonl"
    assert data == http.get(f"/v1/messages/batches/{ids['message']}/results", headers=ANTHROPIC).content


def test_deleting_a_finished_batch_after_confirming(page, stack):
    ids = stack["ids"]
    sign_in(page, stack)
    page.get_by_role("link", name=ids["doomed"], exact=True).click()
    confirm(page, "Delete batch", "Delete batch")
    expect(page.locator("#flash")).to_contain_text(f"Deleted {ids['doomed']}")
    expect(row(page, ids["mixed"])).to_have_count(1)
    expect(row(page, ids["doomed"])).to_have_count(0)
    assert stack["http"].get(f"/v1/batches/{ids['doomed']}").status_code == 404


def test_retry_runs_again_what_did_not_succeed_or_says_why_not(page, stack):
    ids, http, sim = stack["ids"], stack["http"], stack["sim"]
    page.clock.install()
    sign_in(page, stack)
    # Every request succeeded: no Retry.
    open_batch(page, stack, "xss")
    expect(page.locator("#batch-actions").get_by_role("button", name="Delete batch")).to_be_visible()
    expect(page.locator("#batch-actions").get_by_role("button", name="Retry")).to_have_count(0)
    # Failed only for their input: the API takes nothing by default, and the console says why.
    open_batch(page, stack, "mixed")
    confirm(page, "Retry", "Retry")
    alert = page.locator("#batch-alert")
    expect(alert).to_contain_text("Nothing to retry: every request that did not succeed failed for its input")
    expect(alert).to_contain_text("No request of batch")  # the API's own message

    # A batch cancelled with requests never started: retried, they run, and it completes.
    hold(sim, True)
    answer = http.post("/v1/batches", json={"requests": [chat_request(f"c-{i}", f"cancel me {i}")
                                                         for i in range(24)]})
    batch_id = answer.json()["id"]
    assert http.post(f"/v1/batches/{batch_id}/cancel").status_code == 200
    hold(sim, False)
    wait_for(lambda: http.get(f"/v1/batches/{batch_id}").json()["status"] == "cancelled", 30, "the cancel")
    if http.get(f"/v1/batches/{batch_id}").json()["request_counts"]["completed"] == 24:
        pytest.fail("every request ran before the cancel")
    ids["retried"] = batch_id
    open_batch(page, stack, "retried")
    confirm(page, "Retry", "Retry")
    expect(page.locator("#batch-alert")).to_contain_text("Retrying: the requests that did not succeed are queued")
    refreshed_until(page, lambda: expect(page.locator("#batch-fields .status")).to_have_text("completed",
                                                                                             timeout=1000))
    expect(page.locator("#batch-fields")).to_contain_text("Retried")
    expect(page.locator("#batch-actions").get_by_role("button", name="Retry")).to_have_count(0)
    assert http.get(f"/v1/batches/{batch_id}").json()["request_counts"] == {"total": 24, "completed": 24,
                                                                             "failed": 0}


def test_html_in_custom_ids_and_metadata_shows_as_text(page, stack):
    sign_in(page, stack)
    open_batch(page, stack, "xss")
    expect(page.locator("#result-rows .custom-id").first).to_have_text(XSS)
    metadata = page.locator("#batch-fields .metadata")
    expect(metadata).to_contain_text(XSS_META)
    expect(metadata).to_contain_text("<b>key</b>")
    expect(metadata.locator("b, img, script")).to_have_count(0)
    page.locator("#result-rows tr").first.get_by_text("Response body").click()
    expect(page.locator("#result-rows pre").first).to_be_visible()
    assert page.locator("main img, main script").count() == 0
    assert page.evaluate("window.__xss") is None
    assert page.dialogs == []


def test_every_control_has_a_label(page, stack):
    sign_in(page, stack)
    open_batch(page, stack, "mixed")
    unlabeled = page.evaluate("""() => [...document.querySelectorAll('input, select, textarea')]
        .filter(i => i.labels.length === 0).map(i => i.id || i.outerHTML)""")
    assert unlabeled == []
    nameless = page.evaluate("""() => [...document.querySelectorAll('button, a[href]')]
        .filter(b => !(b.textContent.trim() || b.getAttribute('aria-label'))).map(b => b.outerHTML)""")
    assert nameless == []
    assert page.locator("[onclick], div[role=button], span[role=button]").count() == 0


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
