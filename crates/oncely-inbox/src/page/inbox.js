// The dev inbox's page script. The server makes (and escapes) every piece of HTML; this script
// only swaps in fresh server-made parts, shows times in the browser's zone, writes the
// suppressed feed's fields as text (never as HTML), and sends the page's actions as fetch
// calls (DELETE, or PUT with a JSON body) to the inbox's own origin.
"use strict";

const base = document.body.dataset.base || "";
const feed = document.body.dataset.feed;

/// "2026-12-01 19:08:14 GMT+9": date, time and zone, in the browser's time zone.
const format = new Intl.DateTimeFormat("en-US", {
  year: "numeric", month: "2-digit", day: "2-digit",
  hour: "2-digit", minute: "2-digit", second: "2-digit", hourCycle: "h23",
  timeZoneName: "short",
});

function localTime(date) {
  const p = Object.fromEntries(format.formatToParts(date).map((part) => [part.type, part.value]));
  return `${p.year}-${p.month}-${p.day} ${p.hour}:${p.minute}:${p.second} ${p.timeZoneName}`;
}

function localize(root) {
  for (const element of root.querySelectorAll("time[datetime]")) {
    const date = new Date(element.getAttribute("datetime"));
    if (Number.isNaN(date.getTime())) continue;
    element.textContent = localTime(date);
    element.title = date.toISOString();
  }
}

function query() {
  const field = document.querySelector("#search input[name=q]");
  return field ? field.value.trim() : "";
}

/// The server's HTML of each part the live refresh swaps, as last swapped in.
const parts = ["stats", "messages", "webhooks", "faults-summary"];
const seen = new Map();

/// Fetches the list page again (with the search) and swaps in its changed parts.
let refreshing = null;
async function refresh() {
  if (refreshing) return refreshing;
  refreshing = (async () => {
    const url = new URL(location.href);
    const q = query();
    if (q) url.searchParams.set("q", q); else url.searchParams.delete("q");
    try {
      const response = await fetch(url, { cache: "no-store", headers: { accept: "text/html" } });
      if (!response.ok) return;
      const fresh = new DOMParser().parseFromString(await response.text(), "text/html");
      for (const id of parts) {
        const now = document.getElementById(id);
        const next = fresh.getElementById(id);
        if (now && next && seen.get(id) !== next.innerHTML) {
          seen.set(id, next.innerHTML);
          now.replaceChildren(...Array.from(next.childNodes, (n) => document.importNode(n, true)));
          localize(now);
        }
      }
    } catch (_) {
      // The inbox is restarting or gone: try again at the next tick.
    }
    await loadSuppressed();
  })();
  try { await refreshing; } finally { refreshing = null; }
}

function cell(text, className) {
  const td = document.createElement("td");
  td.textContent = text;
  if (className) td.className = className;
  return td;
}

/// The suppressed emails, from the feed the server named; written as text.
async function loadSuppressed() {
  const section = document.getElementById("suppressed");
  if (!section || !feed) return;
  let rows;
  try {
    const response = await fetch(feed, { cache: "no-store", headers: { accept: "application/json" } });
    if (!response.ok) throw new Error(`HTTP ${response.status}`);
    rows = await response.json();
    if (!Array.isArray(rows)) throw new Error("not a list");
  } catch (error) {
    section.querySelector(".count").textContent = `(could not be read: ${error.message})`;
    return;
  }
  const q = query().toLowerCase();
  const shown = rows.filter((row) => !q || [row.to, row.kind, row.reason]
    .some((field) => typeof field === "string" && field.toLowerCase().includes(q)));
  const body = section.querySelector("tbody");
  const fresh = shown.map((row) => {
    const tr = document.createElement("tr");
    const when = document.createElement("td");
    when.className = "when";
    const time = document.createElement("time");
    time.setAttribute("datetime", String(row.at));
    time.textContent = String(row.at);
    when.append(time);
    tr.append(when, cell(row.to == null ? "(not recorded)" : String(row.to)),
      cell(String(row.kind)), cell(row.reason == null ? "" : String(row.reason), "reason"));
    return tr;
  });
  body.replaceChildren(...fresh);
  localize(body);
  section.querySelector(".count").textContent = `(${shown.length})`;
  section.querySelector(".empty").hidden = shown.length > 0;
}

async function act(method, path, body) {
  const init = { method, headers: {} };
  if (body !== undefined) {
    init.headers["content-type"] = "application/json";
    init.body = JSON.stringify(body);
  }
  const response = await fetch(base + path, init);
  if (!response.ok) throw new Error(await response.text() || `HTTP ${response.status}`);
  return response;
}

document.addEventListener("click", async (event) => {
  const button = event.target.closest("button[data-delete]");
  if (!button) return;
  button.disabled = true;
  try {
    await act("DELETE", `/messages/${encodeURIComponent(button.dataset.delete)}`);
  } catch (error) {
    button.disabled = false;
    button.title = error.message;
    return;
  }
  if (button.dataset.then) location.href = button.dataset.then; else await refresh();
});

const deleteAll = document.getElementById("delete-all");
if (deleteAll) {
  let disarm = null;
  deleteAll.addEventListener("click", async () => {
    // Two clicks: the first asks, the second deletes.
    if (!deleteAll.dataset.armed) {
      deleteAll.dataset.armed = "1";
      deleteAll.textContent = "Click again to delete every message";
      disarm = setTimeout(() => {
        delete deleteAll.dataset.armed;
        deleteAll.textContent = "Delete all";
      }, 5000);
      return;
    }
    clearTimeout(disarm);
    delete deleteAll.dataset.armed;
    deleteAll.textContent = "Delete all";
    await act("DELETE", "/messages", {});
    await refresh();
  });
}

const faults = document.getElementById("faults");
if (faults) {
  const status = document.getElementById("faults-status");
  const put = async (patch) => {
    try {
      const response = await act("PUT", "/faults", patch);
      await response.json();
      status.textContent = "Applied.";
    } catch (error) {
      status.textContent = `Not applied: ${error.message}`;
    }
    await refresh();
  };
  faults.addEventListener("submit", async (event) => {
    event.preventDefault();
    const patch = {};
    for (const field of faults.querySelectorAll("input[type=number]")) {
      patch[field.name] = Number(field.value || 0);
    }
    patch.rejection = faults.querySelector("select[name=rejection]").value;
    patch.dedupe_window_ms = faults.querySelector("input[name=provider]").checked ? 86400000 : null;
    await put(patch);
  });
  document.getElementById("faults-clear").addEventListener("click", async () => {
    for (const field of faults.querySelectorAll("input[type=number]")) {
      field.value = { retry_after_s: 1, webhook_reject_status: 503 }[field.name] ?? 0;
    }
    faults.querySelector("select[name=rejection]").value = "temporary";
    faults.querySelector("input[name=provider]").checked = false;
    faults.requestSubmit();
  });
}

const search = document.getElementById("search");
if (search) {
  let pending = null;
  search.addEventListener("input", () => {
    clearTimeout(pending);
    pending = setTimeout(() => {
      const url = new URL(location.href);
      const q = query();
      if (q) url.searchParams.set("q", q); else url.searchParams.delete("q");
      history.replaceState(null, "", url);
      refresh();
    }, 200);
  });
  search.addEventListener("submit", (event) => {
    event.preventDefault();
    refresh();
  });
}

for (const id of parts) {
  const element = document.getElementById(id);
  if (element) seen.set(id, element.innerHTML);
}
localize(document);
if (document.getElementById("messages")) {
  loadSuppressed();
  // Live: every 2 s while the page is visible and "Live" is on.
  setInterval(() => {
    const live = document.getElementById("live");
    if (document.visibilityState === "visible" && (!live || live.checked)) refresh();
  }, 2000);
}
