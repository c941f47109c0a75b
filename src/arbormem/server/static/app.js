// arbormem tree explorer: plain DOM, no build step. Every piece of stored text is inserted
// with textContent (never innerHTML), so a stored message cannot inject markup or script.
"use strict";

const $ = (id) => document.getElementById(id);
const state = { token: sessionStorage.getItem("arbormem.token") || "", user: sessionStorage.getItem("arbormem.user") || "", nodes: new Map() };

function el(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (k === "class") node.className = v;
    else if (k.startsWith("on")) node.addEventListener(k.slice(2), v);
    else node.setAttribute(k, v);
  }
  for (const c of children) if (c !== null && c !== undefined) node.append(c instanceof Node ? c : String(c));
  return node;
}

function status(text, isError = false) {
  $("status").textContent = text;
  $("status").className = isError ? "error" : "";
}

async function api(method, path, body) {
  const res = await fetch(path, {
    method,
    headers: { "Authorization": "Bearer " + state.token, ...(body ? { "Content-Type": "application/json" } : {}) },
    body: body ? JSON.stringify(body) : undefined,
  });
  const data = res.status === 204 ? null : await res.json();
  if (!res.ok) {
    const err = (data && data.error) || { code: "http_error", message: res.statusText };
    throw new Error(`${err.code}: ${err.message}`);
  }
  return data;
}

// Each pane shows the answer to its latest request only: a click on a theme and then on one of
// its topics sends two requests, and the slower (older) answer must not overwrite the newer.
const latest = { topic: 0, search: 0, recall: 0 };
const ticket = (pane) => ++latest[pane];
const stale = (pane, n) => n !== latest[pane];

const userPath = (suffix) => `/v1/users/${encodeURIComponent(state.user)}${suffix}`;
const day = (iso) => (iso ? iso.slice(0, 10) : "");
const span = (t) => (t.first_at ? (day(t.first_at) === day(t.last_at) ? day(t.first_at) : `${day(t.first_at)} – ${day(t.last_at)}`) : "");

// -- tree ------------------------------------------------------------------------------------
function renderNode(t) {
  state.nodes.set(t.id, t);
  const hasKids = t.children && t.children.length > 0;
  const li = el("li", { class: `node kind-${t.kind}`, role: "treeitem", "data-id": t.id, "data-kind": t.kind });
  const label = el("div", { class: "label" },
    el("span", { class: "twist" }, hasKids ? "▾" : "•"),
    el("span", { class: "title" }, t.title || "(untitled)"),
    el("span", { class: "size", title: "exchanges" }, t.size),
    el("span", { class: "dates" }, span(t)),
    el("span", { class: "kw" }, (t.keywords || []).slice(0, 4).join(", ")),
  );
  label.addEventListener("click", () => {
    if (hasKids) {
      li.classList.toggle("collapsed");
      label.firstChild.textContent = li.classList.contains("collapsed") ? "▸" : "▾";
    }
    showTopic(t.id).catch((e) => status(e.message, true));
  });
  li.append(label);
  if (hasKids) {
    const ul = el("ul", { role: "group" });
    for (const c of t.children) ul.append(renderNode(c));
    li.append(ul);
    // Top-level themes start open (their topics visible); deeper themes start collapsed.
    if (t.depth >= 2) { li.classList.add("collapsed"); label.firstChild.textContent = "▸"; }
  }
  return li;
}

async function loadTree() {
  const root = await api("GET", userPath("/tree"));
  state.nodes.clear();
  const ul = $("tree");
  ul.replaceChildren();
  for (const c of root.children) ul.append(renderNode(c));
  const n = [...state.nodes.values()];
  $("tree-stats").textContent = `${root.size} exchanges · ${n.filter((t) => t.kind === "topic").length} topics · ${n.filter((t) => t.kind === "theme").length} themes`;
  if (!root.children.length) ul.append(el("li", { class: "muted" }, "No memory for this user yet."));
}

function expandAll() {
  document.querySelectorAll(".node.collapsed").forEach((li) => {
    li.classList.remove("collapsed");
    li.querySelector(".twist").textContent = "▾";
  });
}

// -- a topic ---------------------------------------------------------------------------------
function messageList(ex) {
  const box = el("div");
  box.append(el("div", { class: "muted" }, `#${ex.seq} · ${day(ex.user_at)}${ex.session_id ? " · " + ex.session_id : ""}`));
  for (const m of ex.messages) {
    const text = typeof m.content === "string" ? m.content : (m.content || []).map((p) => p.text || "").join("\n");
    // A multi-party chat names its participants (OpenAI's `name`); show who spoke, as recall does.
    box.append(el("div", { class: "msg" }, el("span", { class: "role" }, (m.name || m.role) + ":"), text));
  }
  return box;
}

async function showTopic(id) {
  document.querySelectorAll(".node.selected").forEach((n) => n.classList.remove("selected"));
  const li = document.querySelector(`.node[data-id="${CSS.escape(id)}"]`);
  if (li) li.classList.add("selected");
  const n = ticket("topic");
  const data = await api("GET", userPath(`/topics/${encodeURIComponent(id)}?depth=2`));
  if (stale("topic", n)) return;
  const t = data.topic;
  $("topic").hidden = false;
  $("topic-path").textContent = (t.path || []).slice(0, -1).join(" › ");
  $("topic-title").textContent = t.title;
  $("topic-meta").textContent = `${t.kind} · ${t.size} exchanges · ${span(t)}${t.start_seq !== null ? ` · #${t.start_seq}–${t.end_seq}` : ""}${t.frozen ? "" : " · open"}`;
  $("topic-keywords").replaceChildren(...(t.keywords || []).map((k) => el("span", {}, k)));
  $("topic-summary").textContent = t.summary || "(no summary)";
  $("topic-detail").textContent = data.detail || "";
  $("topic-detail-src").textContent = data.detail_source ? `(${data.detail_source})` : "";
  $("topic-packet").textContent = data.text || "";
  $("topic-exchanges").replaceChildren(...(data.exchanges || []).map((ex) => el("li", { "data-exchange": ex.id }, messageList(ex))));
  state.shown = t.id;
  state.forget = null;
  $("forget-box").hidden = true;
  // A topic clicked far down a long tree: bring its card into view (it sits at the top of
  // the detail pane, which had scrolled off-screen).
  const box = $("topic").getBoundingClientRect();
  if (box.top < 0 || box.top > window.innerHeight - 80) $("topic").scrollIntoView({ block: "start" });
}

// -- forgetting the shown topic or theme: preview first (the count), then delete exactly that ---
const plural = (n, word) => `${n} ${word}${n === 1 ? "" : "s"}`;

async function askForget() {
  const id = state.shown;
  if (!id) return;
  const n = ticket("topic");
  const p = await api("GET", userPath(`/topics/${encodeURIComponent(id)}/forget`));
  if (stale("topic", n)) return;
  state.forget = p;
  $("forget-msg").textContent = `Delete ${plural(p.exchange_count, "exchange")} in ${plural(p.topic_count, "topic")}?`;
  $("forget-list").replaceChildren(
    el("li", {}, `${(p.path || []).join(" › ") || p.title} — this cannot be undone`),
    el("li", {}, `exchanges #${p.seqs.join(", #")}`));
  $("forget-box").hidden = false;
}

async function doForget() {
  const p = state.forget;
  if (!p) return;
  // The server refuses (409) if the topic gained or lost exchanges since the preview.
  const r = await api("DELETE", userPath(`/topics/${encodeURIComponent(p.topic_id)}?confirm=true&expect_exchanges=${p.exchange_count}`));
  state.forget = null;
  state.shown = null;
  $("forget-box").hidden = true;
  $("topic").hidden = true;
  await loadTree();
  status(`deleted ${plural(r.exchange_count, "exchange")} in ${plural(r.topic_count, "topic")}`);
}

// -- search and recall -----------------------------------------------------------------------
async function search(ev) {
  ev.preventDefault();
  const q = $("search-q").value.trim();
  const out = $("search-results");
  out.replaceChildren();
  const n = ticket("search");
  if (!q) return;
  const { hits } = await api("POST", userPath("/search"), { query: q, limit: 10 });
  if (stale("search", n)) return;
  if (!hits.length) out.append(el("p", { class: "muted" }, "No matches."));
  for (const h of hits) {
    const row = el("div", { class: "hit", "data-exchange": h.exchange.id },
      el("div", { class: "path" }, (h.path || []).join(" › "), ` · score ${h.score.toFixed(4)}`),
      el("div", {}, h.exchange.user_text.slice(0, 240)));
    if (h.topic_id) row.addEventListener("click", () => showTopic(h.topic_id).catch((e) => status(e.message, true)));
    out.append(row);
  }
}

async function recall(ev) {
  ev.preventDefault();
  const q = $("recall-q").value.trim();
  if (!q) return;
  const n = parseInt($("recall-n").value, 10) || 0;
  const mine = ticket("recall");
  const r = await api("POST", userPath("/recall"), { query: q, max_tokens: n });
  if (stale("recall", mine)) return;
  $("recall-out").hidden = false;
  $("recall-meta").textContent = `${r.tokens} of ${n} tokens · ${r.exchanges.length} exchanges from ${r.topics.length} topics · ${Math.round(r.trace.timings_ms.total || 0)} ms`;
  const byTopic = new Map(r.topics.map((t) => [t.id, t]));
  $("recall-prov").replaceChildren(...r.exchanges.map((ex) => {
    const t = byTopic.get(ex.topic_id);
    const li = el("li", { "data-exchange": ex.id },
      el("span", { class: "path" }, t ? (t.path || []).join(" › ") : "(recent)"),
      ` · #${ex.seq} · ${day(ex.user_at)} · `, ex.user_text.slice(0, 120));
    if (ex.topic_id) li.addEventListener("click", () => showTopic(ex.topic_id).catch((e) => status(e.message, true)));
    return li;
  }));
  $("recall-text").textContent = r.text || "(nothing to inject)";
}

// -- start -----------------------------------------------------------------------------------
async function open(ev) {
  if (ev) ev.preventDefault();
  state.token = $("token").value.trim();
  state.user = $("user").value.trim();
  sessionStorage.setItem("arbormem.token", state.token);
  try {
    const me = await api("GET", "/v1/me");
    const users = me.users === "*" ? [] : me.users;
    $("users").replaceChildren(...users.map((u) => el("option", { value: u })));
    if (!state.user && users.length) { state.user = users[0]; $("user").value = state.user; }
    if (!state.user) { status("enter a user id"); return; }
    sessionStorage.setItem("arbormem.user", state.user);
    await loadTree();
    status(`user ${state.user}`);
  } catch (e) {
    $("tree").replaceChildren();
    status(e.message, true);
  }
}

function guard(fn) {
  return async (ev) => { try { await fn(ev); } catch (e) { if (ev) ev.preventDefault(); status(e.message, true); } };
}

$("login").addEventListener("submit", guard(open));
$("search-form").addEventListener("submit", guard(search));
$("recall-form").addEventListener("submit", guard(recall));
$("expand-all").addEventListener("click", expandAll);
$("forget").addEventListener("click", guard(askForget));
$("forget-yes").addEventListener("click", guard(doForget));
$("forget-no").addEventListener("click", () => { state.forget = null; $("forget-box").hidden = true; });
$("token").value = state.token;
$("user").value = state.user;
if (state.token) open();
