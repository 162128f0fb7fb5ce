"""Fixtures and steps of the console's browser tests: the local stack holding the batches the tests look at (a
fresh one for each test file), Debian's Chromium through Playwright, a fresh tab for each test, and what a user does
in the page (sign in, open a batch, confirm a dialog). The browser's settings are shared with the API reference
pages' tests."""

from __future__ import annotations

import json
import time
from pathlib import Path

import httpx
import pytest

from batchinfer.api.app import create_app
from batchinfer.settings import Settings
from local.run import start
from local.servers import UvicornThread, free_port
from tests.helpers import chat_request

sync_api = pytest.importorskip("playwright.sync_api", reason="playwright is in requirements-dev.txt: run `make venv`")
expect = sync_api.expect

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
