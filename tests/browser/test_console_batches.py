"""The console's Batches page (/console) in a real headless Chromium, against the local stack: signing in, the
list, a batch's fields, results, analytics and downloads, and pausing, resuming, cancelling, deleting, retrying
and changing the priority of a batch.

The browser is Debian's /usr/bin/chromium (`make browser` installs it; `make test` depends on it), driven by
Playwright's Python package; Playwright's own browser downloads are never used. The tests run in file order
on one stack (conftest.py): the batches are made once (finished ones, then two kept running: the simulated
backend holds their requests in flight), the first two tests use the running ones and let their requests go;
every other test starts with the backend answering. Screenshots of the list and of a batch,
at desktop and phone widths, are written to test-artifacts/console/.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.browser.conftest import (
    ANTHROPIC,
    DESKTOP,
    PHONE,
    XSS,
    XSS_META,
    confirm,
    expect,
    hold,
    message_tokens,
    open_batch,
    refreshed_until,
    row,
    screenshot,
    sign_in,
    wait_for,
)
from tests.helpers import chat_request

pytestmark = pytest.mark.e2e


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
