// The approval page. It talks only to this origin's /v1 API with the approver's token, which
// lives in sessionStorage (this tab) and nowhere else. Everything from the API is shown with
// textContent, never parsed as HTML: a preview is data, whatever it contains.
"use strict";

(() => {
  const TOKEN_KEY = "ledgerloop.token";
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

  function show(id, text) {
    const box = byId(id);
    box.textContent = text;
    box.hidden = !text;
  }

  function signedIn(yes) {
    byId("login").hidden = yes;
    byId("session").hidden = !yes;
    byId("queue").hidden = !yes;
  }

  function when(element, iso) {
    if (!iso) {
      element.textContent = "never";
      return;
    }
    element.dateTime = iso;
    element.title = iso;
    const minutes = Math.round((new Date(iso) - Date.now()) / 60000);
    const relative =
      minutes > 0 ? `in ${Math.floor(minutes / 60)} h ${minutes % 60} min`
        : minutes < 0 ? `${Math.floor(-minutes / 60)} h ${-minutes % 60} min ago` : "now";
    element.textContent = `${new Date(iso).toLocaleString()} (${relative})`;
  }

  function card(approval) {
    const node = byId("approval-card").content.firstElementChild.cloneNode(true);
    const part = (selector) => node.querySelector(selector);
    const preview = approval.preview || {};
    node.dataset.approvalId = approval.id;
    part(".tool").textContent = preview.tool || approval.tool;
    part(".summary").textContent = preview.summary || "";
    if (preview.arguments) {
      // One row per argument, its value as JSON in a box of its own: where an argument
      // begins and ends never depends on its text (escaped server-side, see preview.py).
      for (const argument of preview.arguments) {
        const row = document.createElement("tr");
        const name = document.createElement("th");
        name.textContent = argument.name;
        const value = document.createElement("td");
        const code = document.createElement("code");
        code.className = "argument-value";
        code.textContent = argument.value;
        value.append(code);
        row.append(name, value);
        part(".arguments tbody").append(row);
      }
      part(".arguments").hidden = false;
      part(".lines").hidden = true;
    }
    for (const line of preview.lines || []) {
      const item = document.createElement("li");
      item.textContent = line;
      part(".lines").append(item);
    }
    if (preview.note) {
      part(".note").textContent = preview.note;
      part(".note").hidden = false;
    }
    part(".hash").textContent = approval.action_hash;
    when(part(".expires"), approval.expires_at);
    when(part(".requested"), approval.requested_at);
    part(".run").textContent = approval.run_id;
    part(".roles").textContent = approval.required_roles.join(", ");
    part(".approve").addEventListener("click", () => decide(node, approval, "approve"));
    part(".reject").addEventListener("click", () => decide(node, approval, "reject"));
    return node;
  }

  async function decide(node, approval, decision) {
    const buttons = node.querySelectorAll("button");
    buttons.forEach((b) => { b.disabled = true; });
    show("error", "");
    show("notice", "");
    const reason = node.querySelector(".reason").value.trim();
    try {
      const result = await api(`v1/approvals/${encodeURIComponent(approval.id)}/decision`, {
        method: "POST",
        body: JSON.stringify(reason ? { decision, reason } : { decision }),
      });
      const decided = result.approval;
      show(
        "notice",
        `${decided.status}: ${decided.tool} ${decided.action_hash.slice(0, 12)}… ` +
          `by ${decided.decided_by_name}` + (result.outcome === "duplicate" ? " (already recorded)" : ""),
      );
      await load();
    } catch (err) {
      show("error", err.message);
      buttons.forEach((b) => { b.disabled = false; });
    }
  }

  async function load() {
    const list = byId("approvals");
    try {
      const data = await api("v1/approvals?status=pending&limit=200");
      list.replaceChildren(...data.approvals.map(card));
      byId("empty").hidden = data.approvals.length > 0;
      signedIn(true);
    } catch (err) {
      show("error", err.message);
      if (err instanceof ApiError && err.status === 401) {
        sessionStorage.removeItem(TOKEN_KEY);
        list.replaceChildren();
        signedIn(false);
      }
    }
  }

  document.addEventListener("DOMContentLoaded", () => {
    byId("login").addEventListener("submit", async (event) => {
      event.preventDefault();
      const input = byId("token");
      sessionStorage.setItem(TOKEN_KEY, input.value.trim());
      input.value = "";
      show("error", "");
      await load();
    });
    byId("refresh").addEventListener("click", () => {
      show("error", "");
      load();
    });
    byId("forget").addEventListener("click", () => {
      sessionStorage.removeItem(TOKEN_KEY);
      byId("approvals").replaceChildren();
      show("notice", "");
      show("error", "");
      signedIn(false);
    });
    if (sessionStorage.getItem(TOKEN_KEY)) load();
  });
})();
