// The admin dashboard: reads the admin API with the token the person gives,
// kept in this tab's session storage only, and acts through the same API.
// Everything from the server is shown as text (textContent), never as HTML.
"use strict";

const TOKEN_KEY = "datum-admin-token";
const REFRESH_MS = 2000;
// Lag samples kept per pipeline for its sparkline: ten minutes.
const HISTORY = 300;
const history = new Map();
let timer = null;

function token() {
  return sessionStorage.getItem(TOKEN_KEY);
}

function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs || {})) {
    if (key === "class") node.className = value;
    else if (key.startsWith("on")) node.addEventListener(key.slice(2), value);
    else node.setAttribute(key, value);
  }
  for (const child of children) {
    if (child === null || child === undefined) continue;
    node.append(typeof child === "string" || typeof child === "number" ? String(child) : child);
  }
  return node;
}

function showError(message) {
  const box = document.getElementById("error");
  box.textContent = message;
  box.hidden = !message;
}

function showLogin(message) {
  if (timer) clearInterval(timer);
  timer = null;
  document.getElementById("login").hidden = false;
  document.getElementById("forget").hidden = true;
  document.getElementById("pipelines").replaceChildren();
  if (message) showError(message);
}

// Calls the admin API; an answer that is not 2xx throws with the API's
// message. A refused token asks for it again.
async function api(method, path, body) {
  const headers = { Authorization: "Bearer " + (token() || "") };
  const init = { method, headers };
  if (body instanceof ArrayBuffer) {
    headers["Content-Type"] = "application/wasm";
    init.body = body;
  } else if (body !== undefined) {
    headers["Content-Type"] = "application/json";
    init.body = JSON.stringify(body);
  }
  const response = await fetch(path, init);
  let json = null;
  try {
    json = await response.json();
  } catch (_) {
    json = null;
  }
  if (response.status === 401) {
    sessionStorage.removeItem(TOKEN_KEY);
    const message = (json && json.error && json.error.message) || "the token was refused";
    showLogin("Refused: " + message);
    throw new Error(message);
  }
  if (!response.ok) {
    const message = (json && json.error && json.error.message) || response.statusText;
    throw new Error(message);
  }
  return json;
}

function bytes(n) {
  if (n === null || n === undefined) return "—";
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let i = 0;
  while (n >= 1024 && i < units.length - 1) {
    n /= 1024;
    i += 1;
  }
  return (i === 0 ? n : n.toFixed(1)) + " " + units[i];
}

function number(n, digits) {
  if (n === null || n === undefined) return "—";
  return Number(n).toLocaleString("en", { maximumFractionDigits: digits || 0 });
}

function figure(label, value, cls) {
  return el("div", { class: "figure " + (cls || "") }, el("b", {}, value), el("span", {}, label));
}

function sparkline(samples) {
  const svg = document.createElementNS("http://www.w3.org/2000/svg", "svg");
  svg.setAttribute("class", "spark");
  svg.setAttribute("viewBox", "0 0 100 20");
  svg.setAttribute("preserveAspectRatio", "none");
  if (samples.length > 0) {
    // One sample draws a flat line until the next comes.
    const drawn = samples.length === 1 ? [samples[0], samples[0]] : samples;
    const max = Math.max(1, ...drawn);
    const points = drawn
      .map((v, i) => `${(i * 100) / (drawn.length - 1)},${20 - (v * 19) / max}`)
      .join(" ");
    const line = document.createElementNS("http://www.w3.org/2000/svg", "polyline");
    line.setAttribute("points", points);
    svg.append(line);
  }
  return svg;
}

async function act(what, run) {
  try {
    const answer = await run();
    showError("");
    notice(what + ": done" + (answer && answer.version !== undefined ? ` (version ${answer.version})` : ""));
  } catch (err) {
    showError(what + " failed: " + err.message);
  }
  refresh();
}

function notice(text) {
  document.getElementById("updated").textContent = text;
}

// A button that asks for a .wasm file and POSTs it to `path` (the
// module keeps its active configuration).
function uploadButton(label, cls, module, path, what) {
  const input = el("input", { type: "file", accept: ".wasm,application/wasm", class: cls, "data-module": module, hidden: "" });
  input.addEventListener("change", () => {
    const file = input.files && input.files[0];
    if (!file) return;
    act(what, async () => api("POST", path, await file.arrayBuffer()));
  });
  const button = el("button", { type: "button", onclick: () => input.click() }, label);
  return el("span", {}, button, input);
}

function modulesTable(pipeline, modules) {
  if (!modules.length) return el("p", {}, "No modules: changes go to the sink as they come.");
  const rows = modules.map((m) => {
    const versions = m.versions.map((v) => v.version).join(", ");
    const base = `/v1/pipelines/${encodeURIComponent(pipeline)}/modules/${encodeURIComponent(m.name)}`;
    const swap = uploadButton("Swap…", "swap-file", m.name, base + "/versions", `swap of ${m.name}`);
    const canary = uploadButton("Canary…", "canary-file", m.name, base + "/canary", `canary of ${m.name}`);
    const rollback = el(
      "button",
      {
        type: "button",
        class: "rollback",
        "data-module": m.name,
        onclick: () => {
          if (!confirm(`Roll ${m.name} back to its previous version?`)) return;
          act(`rollback of ${m.name}`, () =>
            api("POST", `/v1/pipelines/${encodeURIComponent(pipeline)}/modules/${encodeURIComponent(m.name)}/rollback`, {}),
          );
        },
      },
      "Roll back",
    );
    return el(
      "tr",
      { "data-module": m.name },
      el("td", {}, m.name),
      el("td", { class: "active-version" }, String(m.active.version)),
      el("td", {}, m.active.sha256.slice(0, 12)),
      el("td", {}, versions),
      el("td", {}, rollback, " ", swap, " ", canary),
    );
  });
  return el(
    "table",
    { class: "modules" },
    el("thead", {}, el("tr", {}, ...["module", "active", "sha256", "versions", ""].map((h) => el("th", {}, h)))),
    el("tbody", {}, ...rows),
  );
}

function snapshotsTable(snapshots) {
  const tables = snapshots.filter((s) => s.table !== "*");
  if (!tables.length) return null;
  const rows = tables.map((s) => {
    const max = Math.max(s.estimated_rows || 0, s.rows || 0, 1);
    const bar = el("progress", { max: String(max), value: String(s.state === "done" ? max : s.rows || 0) });
    const eta = s.eta_seconds !== null && s.eta_seconds !== undefined ? number(s.eta_seconds) + " s" : "";
    return el(
      "tr",
      { "data-table": s.table, "data-state": s.state },
      el("td", {}, s.table),
      el("td", { class: "snapshot-state" }, s.state),
      el("td", {}, bar),
      el("td", { class: "rows" }, number(s.rows)),
      el("td", {}, s.rows_per_second ? number(s.rows_per_second) + " rows/s" : ""),
      el("td", {}, eta),
      el("td", { class: "last-error" }, s.error || ""),
    );
  });
  return el(
    "table",
    { class: "snapshots" },
    el("thead", {}, el("tr", {}, ...["table", "state", "progress", "rows", "rate", "eta", ""].map((h) => el("th", {}, h)))),
    el("tbody", {}, ...rows),
  );
}

function deadLettersTable(pipeline, letters) {
  if (!letters.length) return el("p", { class: "no-dead-letters" }, "No dead letters.");
  const path = (l) => `/v1/pipelines/${encodeURIComponent(pipeline)}/dead-letters/${l.id}`;
  const rows = letters.map((l) =>
    el(
      "tr",
      { "data-dead-letter": String(l.id) },
      el("td", {}, String(l.id)),
      el("td", {}, l.commit_lsn || ""),
      el("td", {}, number(l.changes)),
      el("td", { class: "last-error" }, l.error),
      el(
        "td",
        {},
        el("button", { type: "button", class: "show", onclick: () => showLetter(pipeline, l.id) }, "Show"),
        " ",
        el(
          "button",
          {
            type: "button",
            class: "replay",
            onclick: () => act(`replay of dead letter ${l.id}`, () => api("POST", path(l) + "/replay")),
          },
          "Replay",
        ),
        " ",
        el(
          "button",
          {
            type: "button",
            class: "discard",
            onclick: () => {
              if (!confirm(`Discard dead letter ${l.id}? Its batch is lost.`)) return;
              act(`discard of dead letter ${l.id}`, () => api("DELETE", path(l)));
            },
          },
          "Discard",
        ),
      ),
    ),
  );
  return el(
    "table",
    { class: "dead-letters" },
    el("thead", {}, el("tr", {}, ...["id", "commit LSN", "changes", "error", ""].map((h) => el("th", {}, h)))),
    el("tbody", {}, ...rows),
  );
}

function showDetail(title, text) {
  document.getElementById("detail-title").textContent = title;
  document.getElementById("detail-body").textContent = text;
  document.getElementById("detail").hidden = false;
}

async function showLetter(pipeline, id) {
  try {
    const letter = await api("GET", `/v1/pipelines/${encodeURIComponent(pipeline)}/dead-letters/${id}`);
    showDetail("Dead letter " + id, JSON.stringify(letter, null, 2));
  } catch (err) {
    showError("dead letter " + id + ": " + err.message);
  }
}

async function showDifferences(pipeline) {
  try {
    const report = await api("GET", `/v1/pipelines/${encodeURIComponent(pipeline)}/canary`);
    const parts = (report.differences || []).map(
      (d) =>
        `transaction ${d.xid} (commit ${d.commit_lsn}), ${d.changes_different} ` +
        `${d.changes_different === 1 ? "change" : "changes"} different in ${d.tables.join(", ")}\n${d.diff}`,
    );
    showDetail(
      `Canary differences: ${report.module} version ${report.version}`,
      parts.length ? parts.join("\n") : "No difference so far.",
    );
  } catch (err) {
    showError("canary differences: " + err.message);
  }
}

function canaryPanel(pipeline, c) {
  if (!c) return el("p", { class: "no-canary" }, "No canary since the host started.");
  const base = `/v1/pipelines/${encodeURIComponent(pipeline)}/canary`;
  const failures = Object.entries(c.failures || {})
    .map(([kind, n]) => `${kind} ${n}`)
    .join(", ");
  const actions = [];
  if (c.state === "running") {
    actions.push(
      el(
        "button",
        {
          type: "button",
          class: "promote",
          onclick: () => {
            if (!confirm(`Make ${c.module} version ${c.version} the active version?`)) return;
            act(`promotion of ${c.module}`, () => api("POST", base + "/promote"));
          },
        },
        "Promote",
      ),
      " ",
      el(
        "button",
        { type: "button", class: "abort", onclick: () => act(`abort of the canary`, () => api("POST", base + "/abort")) },
        "Abort",
      ),
      " ",
    );
  }
  actions.push(el("button", { type: "button", class: "differences", onclick: () => showDifferences(pipeline) }, "Differences"));
  return el(
    "div",
    { class: "canary", "data-state": c.state },
    el(
      "div",
      { class: "figures" },
      figure("canary", `${c.module} v${c.version} beside v${c.active_version}`, "canary-module"),
      figure("state", c.state, "canary-state"),
      figure("batches compared", number(c.batches.compared), "canary-compared"),
      figure("equal", number(c.batches.equal), "canary-equal"),
      figure("different", number(c.batches.different), "canary-different"),
      figure("failed", number(c.batches.failed), "canary-failed"),
      figure("not compared", number(c.batches.not_compared), "canary-behind"),
      figure("failures", failures || "none", "canary-failures"),
      figure("CPU, canary / active", `${number(c.cpu.canary_seconds, 3)} / ${number(c.cpu.active_seconds, 3)} s`, "canary-cpu"),
    ),
    c.reason ? el("p", { class: "canary-reason" }, c.reason) : null,
    el("p", {}, ...actions),
  );
}

function pipelineCard(p, modules, letters) {
  const samples = history.get(p.name) || [];
  samples.push(p.lag.bytes || 0);
  while (samples.length > HISTORY) samples.shift();
  history.set(p.name, samples);
  const error = p.last_error ? el("p", { class: "last-error" }, "Last error: " + p.last_error.message) : null;
  return el(
    "section",
    { class: "pipeline", "data-pipeline": p.name, "data-state": p.state },
    el("h2", {}, p.name, el("span", { class: "state " + p.state }, p.state)),
    el(
      "div",
      { class: "figures" },
      figure("lag", bytes(p.lag.bytes), "lag-bytes"),
      figure("lag, commit time", number(p.lag.seconds, 1) + " s", "lag-seconds"),
      el("div", { class: "figure" }, sparkline(samples), el("span", {}, "lag, last minutes")),
      figure("changes/s", number(p.rates.changes_per_second), "rate"),
      figure("checkpoint", p.lsn.checkpointed, "checkpoint"),
      figure("changes written", number(p.totals.changes_out), "written"),
    ),
    error,
    el("h3", {}, "Snapshots"),
    snapshotsTable(p.snapshots) || el("p", {}, "No table copies."),
    el("h3", {}, "Modules"),
    modulesTable(p.name, modules),
    el("h3", {}, "Canary"),
    canaryPanel(p.name, p.canary),
    el("h3", {}, "Dead letters"),
    deadLettersTable(p.name, letters),
  );
}

async function refresh() {
  if (!token()) return showLogin("");
  try {
    const { pipelines } = await api("GET", "/v1/pipelines");
    const cards = [];
    for (const p of pipelines) {
      const name = encodeURIComponent(p.name);
      const [{ modules }, { dead_letters }] = await Promise.all([
        api("GET", `/v1/pipelines/${name}/modules`),
        api("GET", `/v1/pipelines/${name}/dead-letters`),
      ]);
      cards.push(pipelineCard(p, modules, dead_letters));
    }
    document.getElementById("pipelines").replaceChildren(...cards);
    document.getElementById("login").hidden = true;
    document.getElementById("forget").hidden = false;
    document.body.dataset.loaded = String(Date.now());
  } catch (err) {
    if (token()) showError(err.message);
  }
}

function start() {
  if (timer) clearInterval(timer);
  refresh();
  timer = setInterval(refresh, REFRESH_MS);
}

document.addEventListener("DOMContentLoaded", () => {
  document.getElementById("login").addEventListener("submit", (event) => {
    event.preventDefault();
    sessionStorage.setItem(TOKEN_KEY, document.getElementById("token").value.trim());
    document.getElementById("token").value = "";
    showError("");
    start();
  });
  document.getElementById("forget").addEventListener("click", () => {
    sessionStorage.removeItem(TOKEN_KEY);
    showLogin("");
  });
  document.getElementById("detail-close").addEventListener("click", () => {
    document.getElementById("detail").hidden = true;
  });
  if (token()) start();
  else showLogin("");
});
