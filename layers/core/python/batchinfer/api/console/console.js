// The Batches page of the console: plain JavaScript, no library, no build step.
//
// The API key lives in this tab's sessionStorage only and goes out as `Authorization: Bearer` with each call
// (fetch with credentials "omit": no cookie is ever sent or set). Everything shown comes from the API and is
// put in the page as text (createElement / textContent), never parsed as HTML.
"use strict";

(() => {
  const KEY_STORE = "batchinfer.console.key";
  const ANTHROPIC_VERSION = "2023-06-01";
  const REFRESH_MS = 5000;
  const FINAL = new Set(["completed", "failed", "expired", "cancelled"]);
  const PRIORITIES = ["high", "normal", "low"];  // a batch's priority among its account's batches
  const OPENAI_RESULT_STATUSES = ["queued", "running", "completed", "failed", "cancelled", "expired"];
  const MESSAGE_RESULT_TYPES = ["succeeded", "errored", "canceled", "expired"];
  // The API's base: where this page is served, less its own /console.
  const ROOT = new URL(location.pathname.replace(/console\/?$/, ""), location.origin);

  const $ = (id) => document.getElementById(id);
  let config = {batches_enabled: true, file_batches_enabled: false, message_batches_enabled: false,
                webhooks_enabled: false};

  // --- DOM --------------------------------------------------------------------------------------------

  /** An element with attributes and children; strings become text nodes (never HTML). */
  function el(tag, attrs, ...children) {
    const node = document.createElement(tag);
    for (const [name, value] of Object.entries(attrs || {})) {
      if (value === null || value === undefined || value === false) continue;
      if (name === "class") node.className = value;
      else if (name === "text") node.textContent = String(value);
      else if (name === "dataset") Object.assign(node.dataset, value);
      else if (name.startsWith("on")) node.addEventListener(name.slice(2), value);
      else node.setAttribute(name, value === true ? "" : String(value));
    }
    for (const child of children.flat(Infinity)) {
      if (child === null || child === undefined || child === false) continue;
      node.append(child instanceof Node ? child : String(child));
    }
    return node;
  }

  function show(node, visible) { node.hidden = !visible; }

  /** Re-render `container`'s children, keeping keyboard focus on the element with the same focus key. */
  function replaceKeepingFocus(container, children) {
    const active = document.activeElement;
    const key = active && container.contains(active) ? active.dataset.focusKey : undefined;
    container.replaceChildren(...children);
    if (key !== undefined) {
      const again = [...container.querySelectorAll("[data-focus-key]")].find((n) => n.dataset.focusKey === key);
      if (again) again.focus();
    }
  }

  function flash(text) {
    const box = $("flash");
    box.textContent = text;
    clearTimeout(flash.timer);
    flash.timer = setTimeout(() => { box.textContent = ""; }, 6000);
  }

  /** A notice box: a plain-words explanation, then what the API said. */
  function notify(box, kind, title, detail) {
    box.className = `notice ${kind}`;
    box.replaceChildren(el("p", {}, el("strong", {text: title})), detail ? el("p", {class: "api-said"}, detail) : null);
    box.hidden = false;
  }

  function clearNotice(box) { box.hidden = true; box.replaceChildren(); }

  // --- Formatting ----------------------------------------------------------------------------------------

  const dateFormat = new Intl.DateTimeFormat(undefined, {dateStyle: "medium", timeStyle: "medium"});

  function epochMs(value) {
    if (value === null || value === undefined) return null;
    if (typeof value === "number") return value * 1000;
    const parsed = Date.parse(value);
    return Number.isNaN(parsed) ? null : parsed;
  }

  function timeNode(value) {
    const ms = epochMs(value);
    if (ms === null) return el("span", {class: "muted", text: "—"});
    const at = new Date(ms);
    return el("time", {datetime: at.toISOString(), title: at.toISOString(), text: dateFormat.format(at)});
  }

  function money(usd) {
    if (usd === 0) return "$0";
    return "$" + usd.toLocaleString("en-US", {maximumSignificantDigits: 4, maximumFractionDigits: 10});
  }

  function plural(n, word) { return `${n} ${word}${n === 1 ? "" : "s"}`; }

  // --- The API ------------------------------------------------------------------------------------------

  class ApiError extends Error {
    constructor(status, message, code = null) {
      super(message);
      this.status = status;
      this.code = code;
    }
  }

  function apiKey() { return sessionStorage.getItem(KEY_STORE); }

  /** Call the API with the key. `anthropic`: the Message Batches headers. `raw`: the Response, redirects not
   * followed (a large download answers 302 to a presigned URL the page cannot follow with the key). */
  async function api(path, {method = "GET", query = {}, body, anthropic = false, raw = false, key} = {}) {
    const url = new URL(path, ROOT);
    for (const [name, value] of Object.entries(query)) {
      if (value !== null && value !== undefined) url.searchParams.set(name, String(value));
    }
    const headers = {Authorization: `Bearer ${key || apiKey() || ""}`};
    if (anthropic) headers["anthropic-version"] = ANTHROPIC_VERSION;
    if (body !== undefined) headers["Content-Type"] = "application/json";
    let response;
    try {
      response = await fetch(url, {method, headers, body: body === undefined ? undefined : JSON.stringify(body),
                                   credentials: "omit", cache: "no-store", redirect: raw ? "manual" : "follow"});
    } catch (error) {
      throw new ApiError(0, `The API could not be reached (${error.message}).`);
    }
    if (response.type === "opaqueredirect") {
      throw new ApiError(302, "The API answered with a redirect to a short-lived download link.", "redirect");
    }
    if (!response.ok) {
      let message = response.statusText || "Error";
      let code = null;
      try {
        const answer = await response.json();
        // OpenAI: {error: {message, code}}; Anthropic: {type: "error", error: {type, message}}.
        if (answer && answer.error) {
          message = answer.error.message || message;
          code = answer.error.code || answer.error.type || null;
        }
      } catch { /* not JSON */ }
      const error = new ApiError(response.status, message, code);
      if (response.status === 401 && !key) signOut("Your API key was not accepted (missing, invalid, revoked or " +
                                                  "expired). Sign in again.", error);
      throw error;
    }
    return raw ? response : response.json();
  }

  // Plain words for the API's refusals, by what was being done; the API's own message is shown beside them.
  const EXPLAIN = {
    "delete:openai:409": "A request of this batch is still running; cancel it and wait for it to finish, then delete.",
    "delete:message:400": "A Message Batch can be deleted only after it has ended; cancel it first.",
    "download:openai:409": "The batch has not finished yet; its results file is ready once it reaches a final status.",
    "download:message:400": "A Message Batch's results can be read once it has ended; cancel it to end it sooner.",
    "results:message:400": "A Message Batch's results can be read once it has ended.",
    "cancel:openai:409": "The batch cannot be cancelled in its current state.",
    "pause:409": "Only a batch that is still running can be paused: this one has ended or is stopping.",
    "resume:409": "Only a batch that is still running can be resumed: this one has ended or is stopping.",
    "retry:openai:400": "Nothing to retry: every request that did not succeed failed for its input (retry those " +
                        "by error code with batchctl or the API).",
    "retry:message:400": "Nothing to retry: every request that did not succeed failed for its input (retry those " +
                         "by error code with batchctl or the API).",
    "retry:openai:409": "The batch is running again already; it can be retried once it has ended.",
    "retry:message:409": "The batch is running again already; it can be retried once it has ended.",
    "priority:409": "The batch has ended: its priority no longer changes.",
    "webhook:400": "The webhook was not saved: check the URL (an https:// address the service can reach).",
  };
  const BY_STATUS = {
    0: "The API could not be reached. Check your connection and try again.",
    302: "This file is large: the API answers with a short-lived download link, which this page cannot follow " +
         "with your key. Download it with the SDK, batchctl or `curl -L -H 'Authorization: Bearer …'`.",
    400: "The API refused the request.",
    401: "Your API key was not accepted (missing, invalid, revoked or expired). Sign in again.",
    403: "This account is not allowed to do that.",
    404: "Not found: it may have been deleted, or its retention may have ended.",
    409: "That conflicts with the batch's current state.",
    410: "It is gone.",
    413: "The request is too large.",
    429: "A limit or the daily quota has been reached; try again later.",
  };

  function explain(error, action, apiName) {
    const words = EXPLAIN[`${action}:${apiName}:${error.status}`] || EXPLAIN[`${action}:${error.status}`]
      || BY_STATUS[error.status] || (error.status >= 500 ? "The server had an error; try again in a moment."
                                                          : "The request did not succeed.");
    const said = error.status === 0 || error.status === 302 ? null
      : `The API said (HTTP ${error.status}${error.code ? ", " + error.code : ""}): ${error.message}`;
    return [words, said];
  }

  function showError(box, error, action, apiName) {
    const [words, said] = explain(error, action, apiName);
    notify(box, "error", words, said);
    if (box.tabIndex === -1 && box.hasAttribute("tabindex")) box.focus();  // after an action: read it next
  }

  // --- Batches as the page shows them ----------------------------------------------------------------------

  function apiOf(id) { return id.startsWith("msgbatch_") ? "message" : "openai"; }

  function normalize(raw) {
    if (raw.type === "message_batch") {
      const c = raw.request_counts;
      return {id: raw.id, api: "message", kind: "Message Batch", status: raw.processing_status,
              final: raw.processing_status === "ended", created: raw.created_at, ended: raw.ended_at,
              paused: raw.paused_at || null,
              counts: c, total: c.processing + c.succeeded + c.errored + c.canceled + c.expired,
              usage: raw.usage, cost: raw.cost_usd, costUnknown: raw.cost_unknown_attempts, raw};
    }
    const ended = raw.completed_at || raw.failed_at || raw.expired_at || raw.cancelled_at || null;
    return {id: raw.id, api: "openai", kind: raw.input_file_id ? "file" : "inline", status: raw.status,
            final: FINAL.has(raw.status), created: raw.created_at, ended, counts: raw.request_counts,
            paused: raw.paused_at || null,
            total: raw.request_counts.total, usage: raw.usage, cost: raw.cost_usd,
            costUnknown: raw.cost_unknown_attempts, raw};
  }

  /** [label, count, css class] of each part of a batch's progress bar. */
  function progressParts(batch) {
    const c = batch.counts;
    if (batch.api === "message") {
      return [["succeeded", c.succeeded, "ok"], ["errored", c.errored, "bad"], ["canceled", c.canceled, "off"],
              ["expired", c.expired, "warn"], ["processing", c.processing, "rest"]];
    }
    return [["completed", c.completed, "ok"], ["failed", c.failed, "bad"],
            ["to go", Math.max(0, c.total - c.completed - c.failed), "rest"]];
  }

  function progressNode(batch) {
    const parts = progressParts(batch);
    const done = parts.filter(([, , cls]) => cls !== "rest").reduce((sum, [, n]) => sum + n, 0);
    const words = parts.filter(([, n, cls]) => n > 0 && cls !== "rest").map(([label, n]) => `${n} ${label}`);
    let text = `${words.join(" · ")} of ${batch.total}`;
    if (!words.length) {
      text = batch.api === "message" && !batch.final ? `${plural(batch.total, "request")} processing`
        : `0 of ${batch.total} done`;
    }
    const bar = el("div", {class: "bar", role: "progressbar", "aria-valuemin": 0, "aria-valuemax": batch.total,
                           "aria-valuenow": done, "aria-valuetext": text});
    for (const [label, n, cls] of parts) {
      if (n > 0 && cls !== "rest") {
        const part = el("span", {class: `part ${cls}`, title: `${n} ${label}`});
        part.style.width = `${(100 * n) / Math.max(batch.total, 1)}%`;
        bar.append(part);
      }
    }
    return el("div", {class: "progress"}, bar, el("span", {class: "progress-text", text}));
  }

  function tokensText(batch) {
    if (!batch.usage) return "—";
    const u = batch.usage;
    return `${u.total_tokens.toLocaleString("en-US")} (${u.input_tokens.toLocaleString("en-US")} in, ` +
      `${u.output_tokens.toLocaleString("en-US")} out)`;
  }

  function costNode(batch) {
    if (batch.cost === undefined) return el("span", {class: "muted", text: "—"});
    const node = el("span", {}, money(batch.cost));
    if (batch.costUnknown > 0) {
      node.append(el("span", {class: "cost-unknown", text: ` + ${plural(batch.costUnknown, "attempt")} of unknown cost`}));
    }
    return node;
  }

  function statusNode(status) { return el("span", {class: `status s-${status}`, text: status}); }

  /** A batch's status, and "paused" beside it while it is paused (an extension: it starts no request). */
  function batchStatusNode(batch) {
    const status = statusNode(batch.status);
    if (!batch.paused) return status;
    return el("span", {class: "status-pair"}, status, " ", el("span", {class: "status s-paused", text: "paused"}));
  }

  function batchLink(id) {
    return el("a", {href: `#/batches/${encodeURIComponent(id)}`, class: "mono", dataset: {focusKey: `open:${id}`},
                    text: id});
  }

  // --- Sign in and out ----------------------------------------------------------------------------------

  async function signIn(event) {
    event.preventDefault();
    const input = $("api-key");
    const key = input.value.trim();
    const box = $("sign-in-error");
    if (!key) {
      notify(box, "error", "Enter your API key.");
      input.focus();
      return;
    }
    try {
      await api("v1/batches", {query: {limit: 1}, key});
    } catch (error) {
      showError(box, error, "sign-in", "openai");
      input.focus();
      return;
    }
    sessionStorage.setItem(KEY_STORE, key);
    input.value = "";
    clearNotice(box);
    route();
  }

  function signOut(reason, error) {
    sessionStorage.removeItem(KEY_STORE);
    stopTimers();
    $("batch-rows").replaceChildren();
    $("result-rows").replaceChildren();
    $("event-rows").replaceChildren();
    hideSecret();
    if (location.hash) history.replaceState(null, "", location.pathname);
    showView("sign-in-view");
    if (reason) notify($("sign-in-error"), "error", reason, error ? `The API said: ${error.message}` : null);
  }

  // --- Views --------------------------------------------------------------------------------------------

  function showView(id) {
    for (const view of ["sign-in-view", "list-view", "batch-view"]) show($(view), view === id);
    show($("session"), id !== "sign-in-view");
    const heading = $(id).querySelector("h1");
    if (heading) heading.focus({preventScroll: false});
  }

  const timers = {list: null, batch: null};
  function stopTimers() {
    clearTimeout(timers.list);
    clearTimeout(timers.batch);
    timers.list = timers.batch = null;
  }

  function route() {
    stopTimers();
    if (!apiKey()) { showView("sign-in-view"); return; }
    const match = /^#\/batches\/(.+)$/.exec(location.hash);
    if (match) {
      const id = decodeURIComponent(match[1]);
      if (/^(batch|msgbatch)_[A-Za-z0-9_-]+$/.test(id)) { openBatch(id, true); return; }
    }
    showView("list-view");
    loadList();
    if (config.webhooks_enabled) loadWebhook();
  }

  // --- The list -----------------------------------------------------------------------------------------
  // Both APIs list newest first; a page of the console merges them. A page starts from a cursor per API (the
  // last batch of that API shown before it, or null); pages seen are kept on a stack for "Newer".

  // `loads`: list loads started; an answer to one that a later load (a new page size, a page turned) has
  // overtaken is dropped, so a slow first load cannot overwrite the page asked for after it.
  const list = {start: {openai: null, message: null, done: {openai: false, message: false}}, stack: [], next: null,
                loads: 0};

  async function fetchSource(name, cursor, limit) {
    if (name === "openai") {
      return api("v1/batches", {query: {limit: Math.min(limit, 100), after: cursor}});
    }
    return api("v1/messages/batches", {anthropic: true, query: {limit, after_id: cursor}});
  }

  async function loadList() {
    const load = ++list.loads;
    const size = Number($("list-size").value);
    const start = list.start;
    const names = ["openai", "message"];
    const answers = await Promise.allSettled(names.map((n) => start.done[n]
      ? Promise.resolve({data: [], has_more: false}) : fetchSource(n, start[n], size)));
    if (load !== list.loads) return;  // overtaken by a later load
    if (!apiKey()) return;  // signed out by a 401
    const box = $("list-alert");
    clearNotice(box);
    const pages = {};
    for (const [i, name] of names.entries()) {
      const answer = answers[i];
      if (answer.status === "fulfilled") {
        pages[name] = {items: answer.value.data.map(normalize), hasMore: answer.value.has_more};
      } else {
        const error = answer.reason;
        if (error.status === 400 && start[name] !== null) {  // the page's anchor is gone: back to the newest
          list.start = {openai: null, message: null, done: {openai: false, message: false}};
          list.stack = [];
          return loadList();
        }
        pages[name] = {items: [], hasMore: false};
        const [words, said] = explain(error, "list", name);
        notify(box, "error", `${name === "openai" ? "Batches" : "Message Batches"} could not be listed. ${words}`,
               said);
      }
    }
    // Merge, newest first (ties: the OpenAI-shaped batch first), up to a page.
    const shown = [];
    const taken = {openai: 0, message: 0};
    while (shown.length < size) {
      const a = pages.openai.items[taken.openai];
      const b = pages.message.items[taken.message];
      if (!a && !b) break;
      const pick = !b || (a && epochMs(a.created) >= epochMs(b.created)) ? "openai" : "message";
      shown.push(pages[pick].items[taken[pick]]);
      taken[pick] += 1;
    }
    const next = {openai: start.openai, message: start.message, done: {...start.done}};
    for (const name of names) {
      if (taken[name] > 0) next[name] = pages[name].items[taken[name] - 1].id;
      next.done[name] = start.done[name] || (taken[name] === pages[name].items.length && !pages[name].hasMore);
    }
    list.next = next.done.openai && next.done.message ? null : next;
    renderList(shown);
    const unfinished = shown.some((b) => !b.final);
    $("list-refreshing").textContent = unfinished
      ? `Refreshing every ${REFRESH_MS / 1000} s while a batch is unfinished.` : "";
    clearTimeout(timers.list);
    if (unfinished && !$("list-view").hidden) timers.list = setTimeout(refreshList, REFRESH_MS);
  }

  function refreshList() {
    if ($("list-view").hidden || !apiKey()) return;
    if (document.hidden || $("confirm").open) { timers.list = setTimeout(refreshList, REFRESH_MS); return; }
    loadList();
  }

  function renderList(batches) {
    const rows = batches.map((b) => el("tr", {dataset: {batchId: b.id}},
      el("td", {"data-label": "Batch"}, batchLink(b.id)),
      el("td", {"data-label": "Kind", text: b.kind}),
      el("td", {"data-label": "Status"}, batchStatusNode(b)),
      el("td", {"data-label": "Progress"}, progressNode(b)),
      el("td", {"data-label": "Tokens", text: tokensText(b)}),
      el("td", {"data-label": "Cost"}, costNode(b)),
      el("td", {"data-label": "Created"}, timeNode(b.created)),
      el("td", {"data-label": "Ended"}, timeNode(b.ended))));
    replaceKeepingFocus($("batch-rows"), rows);
    show($("list-empty"), batches.length === 0 && list.stack.length === 0);
    show($("batch-table"), batches.length > 0);
    $("list-prev").disabled = list.stack.length === 0;
    $("list-next").disabled = list.next === null;
    $("list-page").textContent = `Page ${list.stack.length + 1}`;
  }

  function listPage(direction) {
    if (direction > 0 && list.next) {
      list.stack.push(list.start);
      list.start = list.next;
    } else if (direction < 0 && list.stack.length) {
      list.start = list.stack.pop();
    } else {
      return;
    }
    loadList();
  }

  function resetList() {
    list.start = {openai: null, message: null, done: {openai: false, message: false}};
    list.stack = [];
    list.next = null;
  }

  // --- One batch ----------------------------------------------------------------------------------------

  const view = {id: null, api: null, batch: null, results: null, newest: null};

  async function openBatch(id, focus) {
    const apiName = apiOf(id);
    const changed = view.id !== id;
    if (changed) {
      Object.assign(view, {id, api: apiName, batch: null,
                           results: {stack: [], after: null, next: null, open: new Set(), lines: null, offset: 0},
                           newest: {after: null, items: []}});
      $("batch-title").textContent = id;
      $("batch-fields").replaceChildren();
      show($("batch-analytics"), false);
      $("batch-actions").replaceChildren();
      $("result-rows").replaceChildren();
      clearNotice($("batch-alert"));
      clearNotice($("results-alert"));
      clearNotice($("newest-alert"));
      $("newest-rows").replaceChildren();
      fillStatusFilter(apiName);
    }
    if (focus) showView("batch-view");
    let raw;
    try {
      raw = apiName === "message" ? await api(`v1/messages/batches/${encodeURIComponent(id)}`, {anthropic: true})
        : await api(`v1/batches/${encodeURIComponent(id)}`);
    } catch (error) {
      if (apiKey()) showError($("batch-alert"), error, "open", apiName);
      return;
    }
    if (view.id !== id) return;
    view.batch = normalize(raw);
    renderBatch();
    await loadResults();
    if (view.id !== id || !view.batch) return;  // another batch was opened meanwhile: its own call goes on
    await loadNewest();
    if (view.id !== id || !view.batch) return;
    clearTimeout(timers.batch);
    if (!view.batch.final) timers.batch = setTimeout(refreshBatch, REFRESH_MS);
  }

  function refreshBatch() {
    if ($("batch-view").hidden || !view.id || !apiKey()) return;
    if (document.hidden || $("confirm").open) { timers.batch = setTimeout(refreshBatch, REFRESH_MS); return; }
    openBatch(view.id, false);
  }

  function field(label, ...value) { return [el("dt", {text: label}), el("dd", {}, ...value)]; }

  function fileRef(id) { return id ? el("span", {class: "mono", text: id}) : el("span", {class: "muted", text: "—"}); }

  function renderBatch() {
    const b = view.batch;
    const r = b.raw;
    const items = [field("Status", batchStatusNode(b)), field("Kind", b.kind), field("Progress", progressNode(b)),
                   field("Priority", r.priority || "normal")];
    if (b.paused) {
      items.push(field("Paused since", timeNode(b.paused),
                       el("span", {class: "muted", text: " (no request starts until it is resumed; its window " +
                                                        "keeps running)"})));
    }
    if (b.api === "openai") {
      items.push(field("Endpoint", el("span", {class: "mono", text: r.endpoint})),
                 field("Tokens", tokensText(b)), field("Cost", costNode(b)),
                 field("Created", timeNode(r.created_at)));
      for (const [label, name] of [["In progress since", "in_progress_at"], ["Finalizing since", "finalizing_at"],
                                   ["Cancelling since", "cancelling_at"], ["Completed", "completed_at"],
                                   ["Failed", "failed_at"], ["Expired", "expired_at"], ["Cancelled", "cancelled_at"]]) {
        if (r[name]) items.push(field(label, timeNode(r[name])));
      }
      items.push(field("Expires", timeNode(r.expires_at)));
      if (r.results_expires_at) items.push(field("Results kept until", timeNode(r.results_expires_at)));
      if (r.input_file_id) items.push(field("Input file", fileRef(r.input_file_id)));
      if (r.input_file_id || r.output_file_id) items.push(field("Output file", fileRef(r.output_file_id)));
      if (r.input_file_id || r.error_file_id) items.push(field("Error file", fileRef(r.error_file_id)));
      const metadata = Object.entries(r.metadata || {});
      items.push(field("Metadata", metadata.length
        ? el("dl", {class: "metadata"}, metadata.map(([k, v]) => [el("dt", {text: k}), el("dd", {text: v})]))
        : el("span", {class: "muted", text: "—"})));
      if (r.error) {
        items.push(field("Error", `${r.error.code ? r.error.code + ": " : ""}${r.error.message || JSON.stringify(r.error)}`));
      }
    } else {
      items.push(field("Created", timeNode(r.created_at)), field("Expires", timeNode(r.expires_at)));
      if (r.cancel_initiated_at) items.push(field("Cancel initiated", timeNode(r.cancel_initiated_at)));
      items.push(field("Ended", timeNode(r.ended_at)));
      if (r.archived_at) items.push(field("Archived", timeNode(r.archived_at)));
      items.push(field("Tokens", tokensText(b)), field("Cost", costNode(b)));
    }
    if (r.retry_count) items.push(field("Retried", `${r.retry_count} time${r.retry_count === 1 ? "" : "s"}`));
    $("batch-fields").replaceChildren(...items.flat());
    renderAnalytics(r.analytics);
    renderActions();
  }

  // A batch's analytics (an extension): rates over its running time, backend latency, attempts, errors.
  function duration(seconds) {
    const h = Math.floor(seconds / 3600), m = Math.floor(seconds % 3600 / 60), s = seconds % 60;
    return [h && `${h} h`, (h || m) && `${m} min`, `${s} s`].filter(Boolean).join(" ");
  }

  function latencyText(ms) {
    if (ms === null || ms === undefined) return "—";
    return ms < 1000 ? `${Math.round(ms)} ms` : `${(ms / 1000).toFixed(2)} s`;
  }

  function renderAnalytics(a) {
    show($("batch-analytics"), Boolean(a));
    if (!a) return;
    const none = (value, text) => value === null || value === undefined
      ? el("span", {class: "muted", text: "—"}) : text;
    const errors = Object.entries(a.errors_by_code || {});
    const items = [
      field("Started", timeNode(a.started_at)), field("Last finished", timeNode(a.last_finished_at)),
      field("Running time", duration(a.running_seconds)),
      field("Requests per minute", none(a.requests_per_minute, String(a.requests_per_minute))),
      field("Output tokens per second", none(a.output_tokens_per_second, String(a.output_tokens_per_second))),
      field("Backend latency", a.p50_ms === null ? el("span", {class: "muted", text: "—"})
        : `p50 ${latencyText(a.p50_ms)} · p95 ${latencyText(a.p95_ms)} · max ${latencyText(a.max_ms)}`),
      field("Attempts", `${a.attempts} (${a.retries === 1 ? "1 retry" : `${a.retries} retries`})`),
      field("Errors by code", errors.length
        ? el("dl", {class: "metadata"}, errors.map(([code, n]) => [el("dt", {text: code}), el("dd", {text: String(n)})]))
        : el("span", {class: "muted", text: "none"}))];
    $("analytics-fields").replaceChildren(...items.flat());
  }

  function renderActions() {
    const b = view.batch;
    const r = b.raw;
    const buttons = [];
    const stopping = b.status === "cancelling" || b.status === "canceling" || b.status === "finalizing";
    if (!b.final && !stopping) {
      buttons.push(b.paused
        ? el("button", {type: "button", dataset: {focusKey: "resume"}, onclick: () => pauseBatch(false),
                        text: "Resume batch"})
        : el("button", {type: "button", dataset: {focusKey: "pause"}, onclick: () => pauseBatch(true),
                        text: "Pause batch"}));
      buttons.push(el("button", {type: "button", dataset: {focusKey: "cancel"}, onclick: cancelBatch,
                                 text: "Cancel batch"}));
    }
    if (b.final && notSucceeded(b) > 0) {  // retry in place (an extension): what did not succeed runs again
      buttons.push(el("button", {type: "button", dataset: {focusKey: "retry"}, onclick: retryBatch,
                                 text: "Retry"}));
    }
    if (!b.final) {  // among the account's own batches; an extension of both APIs
      const current = r.priority || "normal";
      buttons.push(el("span", {class: "priority-control"},
        el("label", {for: "batch-priority", text: "Priority"}),
        el("select", {id: "batch-priority", dataset: {focusKey: "priority"}, onchange: setPriority},
           PRIORITIES.map((p) => el("option", {value: p, text: p, selected: p === current})))));
    }
    buttons.push(el("button", {type: "button", class: "danger", dataset: {focusKey: "delete"}, onclick: deleteBatch,
                               text: "Delete batch"}));
    if (b.api === "openai" && b.final) {
      buttons.push(downloadButton("Download output.jsonl", "output", () => download(
        `v1/batches/${encodeURIComponent(b.id)}/output.jsonl`, `${b.id}.jsonl`, {})));
    }
    if (r.output_file_id) {
      buttons.push(downloadButton("Download output file", "output-file", () => download(
        `v1/files/${encodeURIComponent(r.output_file_id)}/content`, `${r.output_file_id}.jsonl`, {})));
    }
    if (r.error_file_id) {
      buttons.push(downloadButton("Download error file", "error-file", () => download(
        `v1/files/${encodeURIComponent(r.error_file_id)}/content`, `${r.error_file_id}.jsonl`, {})));
    }
    if (b.api === "message" && b.final) {
      buttons.push(downloadButton("Download results", "results", () => download(
        `v1/messages/batches/${encodeURIComponent(b.id)}/results`, `${b.id}_results.jsonl`, {anthropic: true})));
    }
    replaceKeepingFocus($("batch-actions"), buttons);
  }

  function downloadButton(text, key, action) {
    return el("button", {type: "button", dataset: {focusKey: `download:${key}`}, onclick: action, text});
  }

  /** The file's name as the API gives it (Content-Disposition), else `fallback`. */
  function filenameOf(response, fallback) {
    const header = response.headers.get("content-disposition") || "";
    const extended = /filename\*=UTF-8''([^;]+)/i.exec(header);
    if (extended) {
      try { return decodeURIComponent(extended[1].trim()); } catch { /* fall through */ }
    }
    const plain = /filename="([^"]+)"/i.exec(header);
    return (plain && plain[1]) || fallback;
  }

  async function download(path, fallback, {anthropic}) {
    const box = $("batch-alert");
    clearNotice(box);
    let response;
    try {
      response = await api(path, {anthropic, raw: true});
    } catch (error) {
      if (apiKey()) showError(box, error, "download", view.api);
      return;
    }
    const blob = await response.blob();
    const name = filenameOf(response, fallback).replace(/[\\/]/g, "_");
    const url = URL.createObjectURL(blob);
    const link = el("a", {href: url, download: name, hidden: true});
    document.body.append(link);
    link.click();
    link.remove();
    setTimeout(() => URL.revokeObjectURL(url), 60000);
    flash(`Downloaded ${name} (${blob.size.toLocaleString("en-US")} bytes).`);
  }

  // --- Confirmation -----------------------------------------------------------------------------------

  function confirmDialog(title, text, ok) {
    const dialog = $("confirm");
    $("confirm-title").textContent = title;
    $("confirm-text").textContent = text;
    $("confirm-ok").textContent = ok;
    dialog.returnValue = "";
    return new Promise((resolve) => {
      dialog.addEventListener("close", () => resolve(dialog.returnValue === "ok"), {once: true});
      dialog.showModal();
    });
  }

  async function cancelBatch() {
    const b = view.batch;
    const sure = await confirmDialog(`Cancel ${b.id}?`, "Requests that have not started are cancelled; " +
      "running ones finish first, and their results are kept.", "Cancel batch");
    if (!sure) return;
    const box = $("batch-alert");
    try {
      if (b.api === "message") {
        await api(`v1/messages/batches/${encodeURIComponent(b.id)}/cancel`, {method: "POST", anthropic: true});
      } else {
        await api(`v1/batches/${encodeURIComponent(b.id)}/cancel`, {method: "POST"});
      }
    } catch (error) {
      if (apiKey()) showError(box, error, "cancel", b.api);
      return;
    }
    notify(box, "ok", "Cancelling: requests not yet started are cancelled, running ones finish first.", null);
    box.focus();
    openBatch(b.id, false);
  }

  /** Pause (or resume) the open batch: reversible, so no confirmation. */
  async function pauseBatch(pause) {
    const b = view.batch;
    const what = pause ? "pause" : "resume";
    const box = $("batch-alert");
    try {
      if (b.api === "message") {
        await api(`v1/messages/batches/${encodeURIComponent(b.id)}/${what}`, {method: "POST", anthropic: true});
      } else {
        await api(`v1/batches/${encodeURIComponent(b.id)}/${what}`, {method: "POST"});
      }
    } catch (error) {
      if (apiKey()) showError(box, error, what, b.api);
      return;
    }
    notify(box, "ok", pause
      ? "Paused: no request starts until you resume it; running ones finish. Its completion window keeps running."
      : "Resumed: its requests start again within seconds.", null);
    box.focus();
    openBatch(b.id, false);
  }

  /** How many of an ended batch's requests did not succeed (failed, errored, expired, cancelled). */
  function notSucceeded(batch) {
    const c = batch.counts;
    return batch.api === "message" ? c.errored + c.canceled + c.expired : c.total - c.completed;
  }

  async function retryBatch() {
    const b = view.batch;
    const sure = await confirmDialog(`Retry ${b.id}?`, "Its requests that did not succeed run again, under a new " +
      "completion window; every success is kept. Requests refused for their input run again only when named " +
      "(with batchctl or the API). Result files are written anew when it ends again.", "Retry");
    if (!sure) return;
    const box = $("batch-alert");
    try {
      if (b.api === "message") {
        await api(`v1/messages/batches/${encodeURIComponent(b.id)}/retry`, {method: "POST", anthropic: true});
      } else {
        await api(`v1/batches/${encodeURIComponent(b.id)}/retry`, {method: "POST"});
      }
    } catch (error) {
      if (apiKey()) showError(box, error, "retry", b.api);
      return;
    }
    notify(box, "ok", "Retrying: the requests that did not succeed are queued again.", null);
    box.focus();
    openBatch(b.id, false);
  }

  async function setPriority(event) {
    const b = view.batch;
    const priority = event.target.value;
    const box = $("batch-alert");
    const path = b.api === "message" ? `v1/messages/batches/${encodeURIComponent(b.id)}/priority`
      : `v1/batches/${encodeURIComponent(b.id)}/priority`;
    try {
      await api(path, {method: "POST", body: {priority}, anthropic: b.api === "message"});
    } catch (error) {
      if (apiKey()) showError(box, error, "priority", b.api);
      openBatch(b.id, false);
      return;
    }
    notify(box, "ok", `Priority set to ${priority}: among your own batches, higher ones take your share of a ` +
      "model first.", null);
    openBatch(b.id, false);
  }

  async function deleteBatch() {
    const b = view.batch;
    const sure = await confirmDialog(`Delete ${b.id}?`, "The batch and all its results are deleted for good.",
                                     "Delete batch");
    if (!sure) return;
    const box = $("batch-alert");
    try {
      if (b.api === "message") {
        await api(`v1/messages/batches/${encodeURIComponent(b.id)}`, {method: "DELETE", anthropic: true});
      } else {
        await api(`v1/batches/${encodeURIComponent(b.id)}`, {method: "DELETE"});
      }
    } catch (error) {
      if (apiKey()) showError(box, error, "delete", b.api);
      return;
    }
    view.id = null;
    resetList();
    location.hash = "#/batches";
    flash(`Deleted ${b.id}.`);
  }

  // --- Results ------------------------------------------------------------------------------------------

  function fillStatusFilter(apiName) {
    const statuses = apiName === "message" ? MESSAGE_RESULT_TYPES : OPENAI_RESULT_STATUSES;
    $("results-status").replaceChildren(el("option", {value: "", text: "All"}),
                                        ...statuses.map((s) => el("option", {value: s, text: s})));
  }

  async function loadResults() {
    const box = $("results-alert");
    const size = Number($("results-size").value);
    const filter = $("results-status").value;
    const state = view.results;
    let rows;
    let hasMore;
    if (view.api === "openai") {
      $("results-note").textContent = "In submission order; the status filter is the API's (?status=, an " +
        "extension): each page holds only results with that status; on a large batch a page may stop short " +
        "of its size (Next goes on).";
      let page;
      try {
        page = await api(`v1/batches/${encodeURIComponent(view.id)}/results`,
                         {query: {limit: size, after: state.after, status: filter || null}});
      } catch (error) {
        if (apiKey()) showError(box, error, "results", "openai");
        return;
      }
      clearNotice(box);
      state.next = page.has_more ? page.last_id : null;
      hasMore = page.has_more;
      rows = page.data.map((r) => ({id: r.id, customId: r.custom_id, status: r.status, error: r.error,
                                    body: r.response}));
    } else {
      $("results-note").textContent = "In submission order, read from the batch's results file once it has " +
        "ended; the status filter applies to all of them.";
      if (!view.batch.final) {
        clearNotice(box);
        renderResults([], false, "Results are available once the Message Batch has ended.");
        return;
      }
      if (state.lines === null) {
        try {
          const response = await api(`v1/messages/batches/${encodeURIComponent(view.id)}/results`,
                                      {anthropic: true, raw: true});
          const text = await response.text();
          state.lines = text.split("\n").filter((l) => l.trim()).map((line, i) => {
            const item = JSON.parse(line);
            const result = item.result || {};
            return {id: `#${i + 1}`, customId: item.custom_id, status: result.type, error: result.error || null,
                    body: result.message || null};
          });
        } catch (error) {
          if (apiKey()) showError(box, error instanceof ApiError ? error : new ApiError(-1, String(error)),
                                  "results", "message");
          return;
        }
      }
      clearNotice(box);
      const matching = state.lines.filter((r) => !filter || r.status === filter);
      rows = matching.slice(state.offset, state.offset + size);
      hasMore = state.offset + size < matching.length;
      state.next = hasMore ? state.offset + size : null;
      renderResults(rows, hasMore, matching.length ? null : "No results with that status.");
      return;
    }
    renderResults(rows, hasMore, rows.length ? null : filter ? "No results with that status." : "No results.");
  }

  // --- Newest finished (while a batch runs) ---------------------------------------------------------------

  const NEWEST_SHOWN = 10;
  const NEWEST_PAGES = 5;  // pages of 100 read per refresh at most: a large batch's backlog is read over a few

  /** The results that finished since the last look, read from the finished-order cursor (each comes once);
   * the newest NEWEST_SHOWN are shown, newest first. */
  async function loadNewest() {
    const state = view.newest;
    const id = view.id;
    if (view.batch.final) { show($("newest"), false); return; }
    show($("newest"), true);
    const message = view.api === "message";
    const path = message ? `v1/messages/batches/${encodeURIComponent(id)}/results`
      : `v1/batches/${encodeURIComponent(id)}/results`;
    try {
      for (let n = 0; n < NEWEST_PAGES; n += 1) {
        const page = await api(path, {anthropic: message, query: {order: "finished", limit: 100, after: state.after}});
        if (view.id !== id) return;
        for (const r of page.data) {
          const result = r.result || {};
          state.items.push(message ? {customId: r.custom_id, status: result.type, error: result.error || null}
            : {customId: r.custom_id, status: r.status, error: r.error});
        }
        state.items = state.items.slice(-NEWEST_SHOWN);
        state.after = page.last_id;
        if (!page.has_more) break;
      }
    } catch (error) {
      if (apiKey()) showError($("newest-alert"), error, "results", view.api);
      return;
    }
    clearNotice($("newest-alert"));
    const rows = state.items.slice().reverse().map((r) => el("tr", {},
      el("td", {"data-label": "custom_id", class: "mono custom-id", text: r.customId}),
      el("td", {"data-label": "Status"}, statusNode(r.status)),
      el("td", {"data-label": "Error", class: "error-text"}, errorText(r.error) || el("span", {class: "muted", text: "—"}))));
    replaceKeepingFocus($("newest-rows"), rows);
    show($("newest-table"), rows.length > 0);
    show($("newest-empty"), rows.length === 0);
  }

  function errorText(error) {
    if (!error) return null;
    const inner = error.error && typeof error.error === "object" ? error.error : error;  // Anthropic nests it
    const code = error.code || inner.type || inner.code;
    return `${code ? code + ": " : ""}${inner.message || JSON.stringify(error)}`;
  }

  function responseCell(result) {
    if (!result.body) return el("span", {class: "muted", text: "—"});
    const details = el("details", {dataset: {focusKey: `body:${result.id}`}},
                       el("summary", {text: "Response body"}));
    details.open = view.results.open.has(result.id);
    const fill = () => {
      if (details.open && !details.querySelector("pre")) {
        details.append(el("pre", {class: "body", tabindex: 0, text: JSON.stringify(result.body, null, 2)}));
      }
    };
    details.addEventListener("toggle", () => {
      if (details.open) view.results.open.add(result.id); else view.results.open.delete(result.id);
      fill();
    });
    fill();
    return details;
  }

  function renderResults(rows, hasMore, emptyText) {
    const state = view.results;
    const trs = rows.map((r) => el("tr", {dataset: {resultId: r.id}},
      el("td", {"data-label": "Result", class: "mono", text: r.id}),
      el("td", {"data-label": "custom_id", class: "mono custom-id", text: r.customId}),
      el("td", {"data-label": "Status"}, statusNode(r.status)),
      el("td", {"data-label": "Error", class: "error-text"}, errorText(r.error) || el("span", {class: "muted", text: "—"})),
      el("td", {"data-label": "Response"}, responseCell(r))));
    replaceKeepingFocus($("result-rows"), trs);
    show($("result-table"), rows.length > 0);
    $("results-empty").textContent = emptyText || "";
    show($("results-empty"), Boolean(emptyText));
    $("results-prev").disabled = state.stack.length === 0;
    $("results-next").disabled = !hasMore;
    $("results-page").textContent = `Page ${state.stack.length + 1}`;
  }

  function resultsPage(direction) {
    const state = view.results;
    const cursor = view.api === "openai" ? "after" : "offset";
    if (direction > 0 && state.next !== null) {
      state.stack.push(state[cursor]);
      state[cursor] = state.next;
    } else if (direction < 0 && state.stack.length) {
      state[cursor] = state.stack.pop();
    } else {
      return;
    }
    loadResults();
  }

  function restartResults() {
    const state = view.results;
    state.stack = [];
    state.after = null;
    state.offset = 0;
    loadResults();
  }

  // --- Webhook ------------------------------------------------------------------------------------------

  const events = {limit: 20, items: [], hasMore: false};
  // Bumped by every save and removal: a read of the webhook begun before one answers after it with what was
  // set before, and must not overwrite it (a slow first load once showed "No webhook is set." after a save).
  let webhookChanges = 0;

  async function loadWebhook() {
    show($("webhook"), true);
    const box = $("webhook-alert");
    const changes = webhookChanges;
    let current = null;
    try {
      current = await api("v1/batch_webhook");
    } catch (error) {
      if (error.status !== 404) {
        if (apiKey() && changes === webhookChanges) showError(box, error, "webhook-read", "openai");
        return;
      }
    }
    if (changes !== webhookChanges) return;
    renderWebhook(current);
    loadEvents();
  }

  function renderWebhook(current) {
    const items = current
      ? [field("URL", el("span", {class: "mono", text: current.url})), field("Set", timeNode(current.created_at)),
         field("Updated", timeNode(current.updated_at)),
         current.secret_created_at ? field("Secret created", timeNode(current.secret_created_at)) : []]
      : [field("URL", el("span", {class: "muted", text: "No webhook is set."}))];
    $("webhook-current").replaceChildren(...items.flat());
    show($("webhook-remove"), Boolean(current));
    if (current && !$("webhook-url").value) $("webhook-url").value = current.url;
  }

  async function saveWebhook(event) {
    event.preventDefault();
    const box = $("webhook-alert");
    const input = $("webhook-url");
    const url = input.value.trim();
    if (!url || !input.checkValidity()) {
      notify(box, "error", "Enter the full URL of your endpoint, such as https://example.com/hooks/batches.");
      input.focus();
      return;
    }
    // The button stays busy until the answer: a second click (or a box ticked meanwhile) must not race it.
    const submit = $("webhook-form").querySelector("button[type=submit]");
    const rotate = $("webhook-rotate").checked;
    let answer;
    submit.disabled = true;
    webhookChanges += 1;
    try {
      answer = await api("v1/batch_webhook", {method: "PUT", body: {url, rotate_secret: rotate}});
    } catch (error) {
      if (apiKey()) showError(box, error, "webhook", "openai");
      return;
    } finally {
      submit.disabled = false;
    }
    clearNotice(box);
    if (rotate) $("webhook-rotate").checked = false;
    renderWebhook(answer);
    if (answer.secret) {
      $("webhook-secret-value").value = answer.secret;
      $("webhook-copied").textContent = "";
      show($("webhook-secret"), true);
      $("webhook-secret-value").focus();
      $("webhook-secret-value").select();
    }
    flash("Webhook saved.");
    loadEvents();
  }

  function hideSecret() {
    $("webhook-secret-value").value = "";
    $("webhook-copied").textContent = "";
    show($("webhook-secret"), false);
  }

  async function copySecret() {
    const value = $("webhook-secret-value").value;
    try {
      await navigator.clipboard.writeText(value);
      $("webhook-copied").textContent = "Copied to the clipboard.";
    } catch {
      $("webhook-secret-value").select();
      $("webhook-copied").textContent = "The browser did not allow copying: the secret is selected, press Ctrl+C.";
    }
  }

  async function removeWebhook() {
    const sure = await confirmDialog("Remove the webhook?", "No more deliveries are sent; a new webhook gets a " +
                                     "new secret.", "Remove webhook");
    if (!sure) return;
    const box = $("webhook-alert");
    webhookChanges += 1;
    try {
      await api("v1/batch_webhook", {method: "DELETE"});
    } catch (error) {
      if (apiKey()) showError(box, error, "webhook-delete", "openai");
      return;
    }
    clearNotice(box);
    $("webhook-url").value = "";
    hideSecret();
    renderWebhook(null);
    flash("Webhook removed.");
    $("webhook-url").focus();
  }

  /** The newest deliveries (`more`: the page after those shown, added below them). */
  async function loadEvents(more = false) {
    const query = {limit: events.limit};
    if (more && events.items.length) query.after = events.items[events.items.length - 1].id;
    let page;
    try {
      page = await api("v1/batch_webhook/events", {query});
    } catch (error) {
      if (apiKey()) showError($("webhook-alert"), error, "webhook-events", "openai");
      return;
    }
    events.items = more ? [...events.items, ...page.data] : page.data;
    events.hasMore = Boolean(page.has_more);
    const rows = events.items.map((e) => {
      const delivery = e.delivery || {};
      const attempts = delivery.attempts || [];
      const last = attempts[attempts.length - 1];
      let attemptsText = String(attempts.length);
      if (last) {
        attemptsText += `; last: ${last.status_code ?? "no answer"}`;
        if (typeof last.duration_ms === "number") attemptsText += ` in ${last.duration_ms} ms`;
        if (last.error) attemptsText += ` (${last.error})`;
      }
      const batchId = e.data && e.data.id;
      return el("tr", {dataset: {eventId: e.id}},
        el("td", {"data-label": "Event", class: "mono", text: e.id}),
        el("td", {"data-label": "Type", text: e.type}),
        el("td", {"data-label": "Batch"}, batchId ? el("span", {class: "mono", text: batchId}) : "—"),
        el("td", {"data-label": "Created"}, timeNode(e.created_at)),
        el("td", {"data-label": "Delivery"}, statusNode(delivery.status || "unknown"),
           delivery.reason ? el("span", {class: "muted", text: ` ${delivery.reason}`}) : null),
        el("td", {"data-label": "Attempts", text: attemptsText}),
        el("td", {"data-label": "Next attempt"}, timeNode(delivery.next_attempt_at)));
    });
    replaceKeepingFocus($("event-rows"), rows);
    show($("event-table"), rows.length > 0);
    show($("events-empty"), rows.length === 0);
    show($("events-more"), events.hasMore);
  }

  // --- Start --------------------------------------------------------------------------------------------

  async function loadConfig() {
    try {
      const response = await fetch(new URL("console/config.json", ROOT), {credentials: "omit", cache: "no-store"});
      if (response.ok) config = {...config, ...(await response.json())};
    } catch { /* the defaults: no extensions */ }
    const on = [config.file_batches_enabled && "file batches", config.message_batches_enabled && "Message Batches",
                config.webhooks_enabled && "webhooks"].filter(Boolean);
    $("extensions").textContent = on.length ? `Extensions on: ${on.join(", ")}` : "No extensions on";
    show($("webhook"), config.webhooks_enabled);
    if (!config.batches_enabled) {
      notify($("sign-in-error"), "error", "Batch inference is unavailable at the moment: the service has batches " +
             "switched off, so every batch call answers 404.");
    }
  }

  function wire() {
    $("sign-in-form").addEventListener("submit", signIn);
    $("sign-out").addEventListener("click", () => { signOut(); flash("Signed out."); });
    $("list-size").addEventListener("change", () => { resetList(); loadList(); });
    $("list-refresh").addEventListener("click", () => loadList());
    $("list-prev").addEventListener("click", () => listPage(-1));
    $("list-next").addEventListener("click", () => listPage(1));
    $("results-status").addEventListener("change", restartResults);
    $("results-size").addEventListener("change", restartResults);
    $("results-prev").addEventListener("click", () => resultsPage(-1));
    $("results-next").addEventListener("click", () => resultsPage(1));
    $("webhook-form").addEventListener("submit", saveWebhook);
    $("webhook-remove").addEventListener("click", removeWebhook);
    $("webhook-copy").addEventListener("click", copySecret);
    $("webhook-secret-done").addEventListener("click", () => { hideSecret(); $("webhook-url").focus(); });
    $("webhook-events-refresh").addEventListener("click", () => loadEvents());
    $("events-more").addEventListener("click", () => loadEvents(true));
    window.addEventListener("hashchange", route);
  }

  document.addEventListener("DOMContentLoaded", async () => {
    wire();
    await loadConfig();
    route();
  });
})();
