// The run console. Like the approval page it talks only to this origin's /v1 API with the
// token kept in this tab's sessionStorage, and it shows everything from the API with
// textContent after `visible()`: a run's strings are data, whatever they contain.
"use strict";

(() => {
  const TOKEN_KEY = "ledgerloop.token";
  const PAGE = 50; // runs per list page
  const CHUNK = 200; // timeline entries rendered at a time: a 10,000-step run stays responsive
  const DETAIL_CHARS = 20000; // of one entry's JSON shown before "show all"
  const POLL_MS = 1500;
  const TERMINAL = new Set(["succeeded", "failed", "cancelled"]);
  // Effects a person settles: the ledger could not tell whether the write happened.
  const PARKED = new Set(["needs_human", "outcome_unknown"]);
  const byId = (id) => document.getElementById(id);

  class ApiError extends Error {
    constructor(status, error) {
      const fix = error.fix ? ` (${error.fix})` : "";
      super(`${status} ${error.type}: ${error.message}${fix}`);
      this.status = status;
    }
  }

  async function api(path, options = {}) {
    const headers = {
      Accept: "application/json",
      Authorization: `Bearer ${sessionStorage.getItem(TOKEN_KEY) || ""}`,
    };
    if (options.body !== undefined) headers["Content-Type"] = "application/json";
    let response;
    try {
      response = await fetch(path, { ...options, headers });
    } catch (err) {
      throw new Error(`could not reach the server: ${err.message}`);
    }
    let body = null;
    try {
      body = await response.json();
    } catch {
      // not JSON: reported below with the status alone
    }
    if (!response.ok) {
      if (body && body.error) throw new ApiError(response.status, body.error);
      throw new Error(`${response.status} ${response.statusText}`);
    }
    return body;
  }

  // Control characters (newlines included) and bidi controls as \uXXXX escapes: a name or a
  // model's text can neither reorder what follows it nor pass for two lines.
  const INVISIBLE = /[\u0000-\u001f\u007f-\u009f\u061c\u200b-\u200f\u2028-\u202e\u2060-\u2069\ufeff]/g;
  function visible(value) {
    return String(value ?? "").replace(
      INVISIBLE,
      (c) => `\\u${c.charCodeAt(0).toString(16).padStart(4, "0")}`,
    );
  }
  // JSON.stringify escapes control characters inside strings itself; its own line breaks
  // (the indentation) stay, and the bidi and zero-width ones it leaves are escaped here.
  function json(element, value) {
    element.textContent = value.replace(/[^\n]+/g, visible);
    return element;
  }
  function text(element, value) {
    element.textContent = visible(value);
    return element;
  }
  function el(tag, className, value) {
    const node = document.createElement(tag);
    if (className) node.className = className;
    if (value !== undefined) text(node, value);
    return node;
  }

  function show(id, message) {
    const box = byId(id);
    box.textContent = message ? visible(message).replaceAll("\\u000a", "\n") : "";
    box.hidden = !message;
  }

  function signedIn(yes) {
    byId("login").hidden = yes;
    byId("session").hidden = !yes;
    if (!yes) {
      byId("list-view").hidden = true;
      byId("run-view").hidden = true;
    }
  }

  function failed(err) {
    show("error", err.message);
    if (err instanceof ApiError && err.status === 401) {
      sessionStorage.removeItem(TOKEN_KEY);
      stopPolling();
      signedIn(false);
    }
  }

  const stamp = (iso) => (iso ? new Date(iso).toLocaleString() : "");
  const clock = (iso) => (iso ? new Date(iso).toLocaleTimeString() : "");
  const dollars = (value) => (value == null ? "" : `$${Number(value).toFixed(4)}`);

  let pollTimer = null;
  function stopPolling() {
    if (pollTimer !== null) clearTimeout(pollTimer);
    pollTimer = null;
  }
  function poll(fn) {
    stopPolling();
    pollTimer = setTimeout(async () => {
      pollTimer = null;
      await fn();
    }, POLL_MS);
  }

  // -- the list ------------------------------------------------------------------------

  // Counts read every matching run (about a second at a million): asked for when the
  // filters change and on every COUNT_EVERY-th refresh of the newest page, not on each.
  const COUNT_EVERY = 10;
  const list = { cursors: [null], filters: {}, polls: 0 };

  function filterParams() {
    const params = new URLSearchParams();
    for (const [name, value] of Object.entries(list.filters)) {
      if (!value) continue;
      if (name.startsWith("created_")) params.set(name, new Date(value).toISOString());
      else params.set(name, value);
    }
    return params;
  }

  async function loadList({ counts = false } = {}) {
    const params = filterParams();
    params.set("limit", String(PAGE));
    const cursor = list.cursors[list.cursors.length - 1];
    if (cursor) params.set("cursor", cursor);
    if (counts) params.set("counts", "true");
    const data = await api(`v1/runs?${params}`);
    signedIn(true);
    byId("list-view").hidden = false;
    byId("run-view").hidden = true;
    text(byId("crumb"), "");
    if (data.counts) renderCounts(data.counts);
    const rows = data.runs.map(runRow);
    byId("runs").tBodies[0].replaceChildren(...rows);
    byId("no-runs").hidden = rows.length > 0;
    byId("older").hidden = !data.next_cursor;
    byId("older").dataset.cursor = data.next_cursor || "";
    byId("newer").hidden = list.cursors.length === 1;
    // The newest page follows new runs as they start; an older page stays still.
    if (list.cursors.length === 1) {
      poll(() => {
        list.polls += 1;
        return loadList({ counts: list.polls % COUNT_EVERY === 0 }).catch(failed);
      });
    }
  }

  function renderCounts(counts) {
    const items = Object.entries(counts)
      .sort()
      .map(([status, n]) => {
        const item = el("li", `count status-${status}`);
        item.dataset.status = status;
        text(item, `${status}: ${n}`);
        return item;
      });
    const total = Object.values(counts).reduce((a, b) => a + b, 0);
    const asOf = el("li", "count as-of", `as of ${new Date().toLocaleTimeString()}`);
    byId("counts").replaceChildren(el("li", "count", `all: ${total}`), ...items, asOf);
  }

  function runRow(run) {
    const row = document.createElement("tr");
    row.dataset.runId = run.id;
    const link = el("a", "run-link", run.id);
    link.href = `#/runs/${encodeURIComponent(run.id)}`;
    const id = el("td");
    id.append(link);
    row.append(
      el("td", "created", stamp(run.created_at)),
      el("td", `status status-${run.status}`, run.status),
      el("td", "agent", run.agent),
      id,
      el("td", "key", run.idempotency_key || ""),
      el("td", "updated", stamp(run.updated_at)),
    );
    return row;
  }

  // -- one run -------------------------------------------------------------------------

  const detail = { runId: null, status: null, shown: CHUNK, entries: [], signature: "" };

  async function loadRun(runId) {
    if (detail.runId !== runId) Object.assign(detail, { runId, shown: CHUNK, signature: "" });
    const data = await api(`v1/runs/${encodeURIComponent(runId)}/timeline`);
    if (detail.runId !== runId) return; // the operator moved on meanwhile
    signedIn(true);
    byId("list-view").hidden = true;
    byId("run-view").hidden = false;
    text(byId("crumb"), `/ ${runId}`);
    renderSummary(data);
    // Re-render only when something changed: an open <details> stays open between polls.
    const signature = `${data.run.version}:${data.entries.length}:${JSON.stringify(
      data.entries.map((e) => e.status),
    )}`;
    if (signature !== detail.signature) {
      detail.signature = signature;
      detail.status = data.run.status;
      detail.entries = data.entries;
      renderTurns();
    }
    byId("truncated").hidden = !data.truncated;
    if (!TERMINAL.has(data.run.status)) poll(() => loadRun(runId).catch(failed));
  }

  function renderSummary(data) {
    const run = data.run;
    text(byId("run-id"), run.id);
    const status = byId("run-status");
    text(status, run.status);
    status.className = `status status-${run.status}`;
    text(byId("run-agent"), run.agent);
    text(byId("run-created"), stamp(run.created_at));
    const parent = byId("run-parent");
    const forkedFrom = (run.state || {}).forked_from;
    parent.replaceChildren();
    if (forkedFrom) {
      const link = el("a", "parent-link", forkedFrom.run_id);
      link.href = `#/runs/${encodeURIComponent(forkedFrom.run_id)}`;
      parent.append(link, el("span", "", ` from step ${forkedFrom.from_step}`));
    } else {
      text(parent, "none");
    }
    text(byId("run-totals"), totals(data));
    byId("cancel").hidden = TERMINAL.has(run.status);
  }

  function totals(data) {
    let tokensIn = 0;
    let tokensOut = 0;
    let calls = 0;
    let waitingMs = 0;
    for (const entry of data.entries) {
      const call = entry.detail.model_call;
      if (call) {
        calls += 1;
        tokensIn += call.input_tokens || 0;
        tokensOut += call.output_tokens || 0;
      }
      if (entry.kind === "approval" && entry.detail.decided_at) {
        waitingMs += new Date(entry.detail.decided_at) - new Date(entry.at);
      }
    }
    const wall = (new Date(data.run.updated_at) - new Date(data.run.created_at)) / 1000;
    let cost = data.cost_usd == null ? "" : `, cost ${dollars(data.cost_usd)}`;
    if (data.unpriced_calls) cost += ` (+${data.unpriced_calls} unpriced)`;
    return `${calls} model calls, ${tokensIn} tokens in, ${tokensOut} out${cost}, ` +
      `wall ${wall.toFixed(1)} s, waiting for people ${(waitingMs / 1000).toFixed(1)} s`;
  }

  // Turns: a new one starts at each think step (think-N) or planning event; what comes
  // before the first is the run's start.
  function turnOf(entry) {
    const match = /(?:^|\/)think-(\d+)$/.exec(entry.name);
    if (entry.kind === "step" && match) return Number(match[1]);
    return null;
  }

  function renderTurns() {
    const shown = detail.entries.slice(0, detail.shown);
    const groups = [];
    let current = { title: "Start", entries: [] };
    groups.push(current);
    shown.forEach((entry) => {
      const turn = turnOf(entry);
      if (turn !== null) {
        current = { title: `Turn ${turn}`, entries: [] };
        groups.push(current);
      }
      current.entries.push([entry]);
    });
    const nodes = groups
      .filter((g) => g.entries.length > 0)
      .map((group) => {
        const item = el("li", "turn");
        item.append(el("h2", "", group.title));
        const entries = el("ol", "entries");
        entries.append(...group.entries.map(([e]) => entryNode(e)));
        if (group.entries.some(([e]) => e.detail.cut_off)) item.classList.add("crash");
        item.append(entries);
        return item;
      });
    byId("turns").replaceChildren(...nodes);
    const more = byId("more");
    more.hidden = detail.entries.length <= detail.shown;
    text(more, `Show ${Math.min(CHUNK, detail.entries.length - detail.shown)} more ` +
      `of ${detail.entries.length - detail.shown}`);
  }

  function facts(entry) {
    const d = entry.detail;
    if (d.model_call) {
      const c = d.model_call;
      const parts = [c.model, `in ${c.input_tokens ?? "?"}`, `out ${c.output_tokens ?? "?"}`];
      if (c.cost_usd != null) parts.push(dollars(c.cost_usd));
      if (c.latency_ms != null) parts.push(`${c.latency_ms} ms`);
      if (c.stop_reason) parts.push(c.stop_reason);
      if (c.tool_uses && c.tool_uses.length) parts.push(`→ ${c.tool_uses.join(", ")}`);
      return parts.join(" · ");
    }
    if (entry.kind === "effect") {
      return `${d.destination} · key ${d.key} · ${d.attempts} attempt(s)`;
    }
    if (entry.kind === "approval") {
      const who = d.decided_by ? ` · by ${d.decided_by} ${clock(d.decided_at)}` : "";
      return `${d.summary || ""} · ${d.action_hash.slice(0, 12)}…${who}`;
    }
    if (entry.kind === "step") {
      const parts = [`step ${d.function_id}`];
      if (d.cut_off) parts.push("cut off by a crash; resumed after");
      if (d.error) parts.push(d.error);
      return parts.join(" · ");
    }
    if (entry.kind === "event" && d.payload && d.payload.error) return String(d.payload.error);
    return "";
  }

  function entryNode(entry) {
    const node = byId("entry").content.firstElementChild.cloneNode(true);
    const part = (selector) => node.querySelector(selector);
    node.dataset.kind = entry.kind;
    node.dataset.name = entry.name;
    text(part(".at"), clock(entry.at));
    text(part(".kind"), entry.kind);
    text(part(".name"), entry.name);
    if (entry.status) {
      text(part(".status"), entry.status);
      part(".status").className = `status status-${entry.status}`;
    }
    text(part(".facts"), facts(entry));
    const buttons = part(".buttons");
    if (entry.kind === "approval" && entry.status === "pending") {
      node.dataset.approvalId = entry.detail.id;
      const approve = el("button", "approve", "Approve");
      const reject = el("button", "reject", "Deny");
      approve.type = reject.type = "button";
      approve.addEventListener("click", () => decide(node, entry.detail.id, "approve"));
      reject.addEventListener("click", () => decide(node, entry.detail.id, "reject"));
      buttons.append(approve, reject);
    }
    if (entry.kind === "effect" && PARKED.has(entry.status)) {
      node.dataset.effectKey = entry.detail.key;
      const note = el("input", "resolution");
      note.type = "text";
      note.maxLength = 1000;
      note.placeholder = "reference, or why not";
      const happened = el("button", "resolve-succeeded", "It happened");
      const didNot = el("button", "resolve-failed", "It did not");
      const retry = el("button", "resolve-retry", "Try again");
      for (const b of [happened, didNot, retry]) b.type = "button";
      const resolve = (body) => resolveEffect(node, entry.detail.key, body);
      happened.addEventListener("click", () => resolve({ succeeded: note.value.trim() }));
      didNot.addEventListener("click", () => resolve({ failed: note.value.trim() }));
      retry.addEventListener("click", () => resolve({ retry: true }));
      buttons.append(note, happened, didNot, retry);
    }
    if (entry.kind === "step" && /^think-\d+$/.test(entry.name) && !entry.detail.workflow_id &&
        TERMINAL.has(detail.status)) {
      const fork = el("button", "fork", "Fork from here");
      fork.type = "button";
      fork.title = "A new run that asks the model again from this call";
      fork.addEventListener("click", () => forkFrom(node, entry.detail.function_id));
      buttons.append(fork);
    }
    // The JSON goes into the page only when opened, and cut: a 1 MB result costs nothing
    // until someone asks for it.
    const details = part("details");
    details.addEventListener("toggle", () => {
      if (!details.open || part(".detail").dataset.filled) return;
      const whole = JSON.stringify(entry.detail, null, 2);
      const pre = part(".detail");
      pre.dataset.filled = "1";
      json(pre, whole.slice(0, DETAIL_CHARS));
      if (whole.length > DETAIL_CHARS) {
        const all = el("button", "show-all", `show all ${whole.length} characters`);
        all.type = "button";
        all.addEventListener("click", () => {
          json(pre, whole);
          all.remove();
        });
        details.append(all);
      }
    });
    return node;
  }

  async function act(node, fn) {
    const buttons = node.querySelectorAll("button");
    buttons.forEach((b) => { b.disabled = true; });
    show("error", "");
    show("notice", "");
    try {
      await fn();
    } catch (err) {
      failed(err);
    } finally {
      buttons.forEach((b) => { b.disabled = false; });
    }
  }

  function decide(node, approvalId, decision) {
    return act(node, async () => {
      const result = await api(`v1/approvals/${encodeURIComponent(approvalId)}/decision`, {
        method: "POST",
        body: JSON.stringify({ decision }),
      });
      const decided = result.approval;
      show("notice", `${decided.status}: ${decided.tool} by ${decided.decided_by_name}`);
      await loadRun(detail.runId);
    });
  }

  function resolveEffect(node, key, body) {
    return act(node, async () => {
      // The key holds the model's tool call id: every character escaped in the path.
      const effect = await api(`v1/effects/${encodeURIComponent(key)}/resolve`, {
        method: "POST",
        body: JSON.stringify(body),
      });
      show("notice", `${effect.key} is ${effect.status}`);
      detail.signature = "";
      await loadRun(detail.runId);
    });
  }

  function forkFrom(node, fromStep) {
    const parentId = detail.runId;
    return act(node, async () => {
      const forked = await api(`v1/runs/${encodeURIComponent(parentId)}/fork`, {
        method: "POST",
        body: JSON.stringify({ from_step: fromStep }),
      });
      show("notice", `forked ${parentId} at step ${fromStep} as ${forked.run.id}`);
      location.hash = `#/runs/${encodeURIComponent(forked.run.id)}`;
    });
  }

  // -- routing -------------------------------------------------------------------------

  async function route() {
    stopPolling();
    if (!sessionStorage.getItem(TOKEN_KEY)) {
      signedIn(false);
      return;
    }
    const match = /^#\/runs\/([0-9a-fA-F-]{36})$/.exec(location.hash);
    try {
      if (match) await loadRun(match[1]);
      else await loadList({ counts: true });
    } catch (err) {
      failed(err);
    }
  }

  document.addEventListener("DOMContentLoaded", () => {
    byId("login").addEventListener("submit", async (event) => {
      event.preventDefault();
      const input = byId("token");
      sessionStorage.setItem(TOKEN_KEY, input.value.trim());
      input.value = "";
      show("error", "");
      await route();
    });
    byId("filters").addEventListener("submit", (event) => {
      event.preventDefault();
      list.filters = Object.fromEntries(new FormData(event.target));
      list.cursors = [null];
      show("error", "");
      loadList({ counts: true }).catch(failed);
    });
    byId("older").addEventListener("click", () => {
      stopPolling();
      list.cursors.push(byId("older").dataset.cursor);
      loadList().catch(failed);
    });
    byId("newer").addEventListener("click", () => {
      list.cursors = [null];
      loadList().catch(failed);
    });
    byId("more").addEventListener("click", () => {
      detail.shown += CHUNK;
      renderTurns();
    });
    byId("cancel").addEventListener("click", () => act(byId("summary"), async () => {
      const done = await api(`v1/runs/${encodeURIComponent(detail.runId)}/cancel`, {
        method: "POST",
        body: JSON.stringify({ reason: "cancelled from the console" }),
      });
      show("notice", `${done.run.id} is ${done.run.status}`);
      await loadRun(detail.runId);
    }));
    byId("refresh").addEventListener("click", () => {
      show("error", "");
      route();
    });
    byId("forget").addEventListener("click", () => {
      sessionStorage.removeItem(TOKEN_KEY);
      stopPolling();
      show("notice", "");
      show("error", "");
      signedIn(false);
    });
    window.addEventListener("hashchange", () => {
      show("error", "");
      route();
    });
    route();
  });
})();
