// The Allot dashboard: reads /api/v1 with the bearer token it is given and follows
// /api/v1/events (Server-Sent Events) to refresh what changed. No framework, no build step.
"use strict";

const $ = (sel) => document.querySelector(sel);
let token = new URLSearchParams(location.hash.slice(1)).get("token") || localStorage.getItem("allot-token") || "";
let source = null;
let lookingBack = null;
let refreshTimer = null;

function esc(s) {
  return String(s ?? "").replace(/[&<>"']/g, (c) => ({ "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" })[c]);
}

async function api(path) {
  const r = await fetch(path, { headers: { Authorization: "Bearer " + token } });
  if (!r.ok) {
    let detail = r.statusText;
    try { detail = (await r.json()).detail; } catch (_) {}
    throw new Error(r.status + ": " + detail);
  }
  return r.json();
}

// Every node, page by page (the API answers at most 1,000 at a time).
async function allNodes() {
  const nodes = [];
  let cursor = null;
  do {
    const page = await api("/api/v1/nodes?limit=1000" + (cursor ? "&cursor=" + cursor : ""));
    nodes.push(...page.items);
    cursor = page.next_cursor;
  } while (cursor);
  return nodes;
}

function eta(when) {
  if (!when) return "unknown";
  const s = Math.round((Date.parse(when) - Date.now()) / 1000);
  if (s <= 0) return "now";
  if (s < 90) return "in " + s + "s";
  if (s < 5400) return "in " + Math.round(s / 60) + "m";
  return "in " + (s / 3600).toFixed(1) + "h";
}

function renderCluster(nodes) {
  const held = (n) => n.state !== "ready" || n.schedulable === false;
  $("#cluster").innerHTML = nodes.map((n) => `
    <div class="node ${held(n) ? "held" : ""} ${n.state === "unreachable" ? "unreachable" : ""}" data-node="${esc(n.name)}" title="${esc(n.reason || n.state)}">
      <div class="name"><b>${esc(n.name)}</b><span>${esc(n.state)}</span></div>
      <div class="gpus">${n.gpus.map((g) => {
        const used = g.allocations.reduce((a, x) => a + x.milli, 0);
        const util = g.utilization_pct ?? 0;
        const cls = ["gpu", used > 0 ? "busy" : "", (g.temperature_c ?? 0) >= 83 ? "hot" : "", g.in_service ? "" : "out"].join(" ");
        const who = g.allocations.map((a) => a.workload ? `${a.workload}/${a.task} (${a.team})` : "another team").join(", ");
        return `<div class="${cls}" data-util="${util}" title="GPU ${g.index} ${esc(g.model)}: ${util}% util, ${g.temperature_c ?? "?"} °C, ${g.health}${who ? " — " + esc(who) : ""}"><div class="fill" style="height:${util}%"></div></div>`;
      }).join("")}</div>
    </div>`).join("") || '<p class="muted">no nodes yet</p>';
}

function renderQueue(items, total) {
  $("#queue-count").textContent = total === undefined ? "" : `(${total} waiting)`;
  $("#queue tbody").innerHTML = items.map((q) => `
    <tr data-task="${q.task_id}"><td>${q.position}</td><td>${esc(q.workload ? q.workload + "/" + q.task : "task-" + q.task_id)}</td>
    <td>${esc(q.team)}</td><td>${q.gpus === 1 && q.gpu_milli < 1000 ? q.gpu_milli + "m" : q.gpus}</td>
    <td class="reason">${esc(q.reason)}</td><td class="${q.at_risk ? "at-risk" : ""}">${eta(q.eta)}${q.at_risk ? " (deadline at risk)" : ""}</td></tr>`).join("")
    || '<tr><td colspan="6" class="muted">no task is waiting</td></tr>';
}

function renderRunning(rows) {
  $("#running tbody").innerHTML = rows.map((a) => `
    <tr data-task="${a.task_id}"><td>${esc(a.workload ? a.workload + "/" + a.task : "task-" + a.task_id)}</td><td>${esc(a.team)}</td><td>${esc(a.node)}</td><td>${a.gpus.map((g) => g[0] + (g[1] < 1000 ? ":" + g[1] + "m" : "")).join(" ")}</td></tr>`).join("")
    || '<tr><td colspan="4" class="muted">nothing runs</td></tr>';
}

function allocationsOf(nodes) {
  const out = new Map();
  for (const n of nodes) for (const g of n.gpus) for (const a of g.allocations) {
    if (!a.task_id) continue;
    const key = a.task_id + "@" + n.name;
    const row = out.get(key) || { task_id: a.task_id, workload: a.workload, task: a.task, team: a.team, node: n.name, gpus: [] };
    row.gpus.push([g.index, a.milli]);
    out.set(key, row);
  }
  return [...out.values()];
}

function money(micros, currency) {
  return (micros / 1e6).toFixed(2) + " " + (currency || "");
}

function chart(id, series, key, max) {
  const svg = $(id);
  if (series.length < 2) {
    // One point a minute: a line needs two.
    svg.innerHTML = '<text class="empty" x="150" y="55" font-size="10" text-anchor="middle">collecting: one point a minute</text>';
    return;
  }
  const top = max ?? Math.max(1, ...series.map((p) => p[key]));
  const step = series.length > 1 ? 300 / (series.length - 1) : 0;
  const pts = series.map((p, i) => `${(i * step).toFixed(1)},${(98 - (p[key] / top) * 96).toFixed(1)}`).join(" ");
  svg.innerHTML = `<polyline points="${pts}"></polyline><text x="2" y="10" font-size="9">${top === 1 ? "100%" : top}</text>`;
}

async function refresh() {
  if (!token || lookingBack) return;
  try {
    const [nodes, queue, workloads, costs, budgets, kpis] = await Promise.all([
      allNodes(), api("/api/v1/queue?limit=200"), api("/api/v1/workloads?limit=30"),
      api("/api/v1/costs"), api("/api/v1/budgets"), api("/api/v1/kpis"),
    ]);
    // A look-back asked for while these were on their way wins: live data must not paint over it.
    if (lookingBack) return;
    renderCluster(nodes);
    renderQueue(queue.items, queue.total);
    renderRunning(allocationsOf(nodes));
    $("#workloads tbody").innerHTML = workloads.items.map((w) => {
      const all = Object.values(w.tasks).reduce((a, b) => a + b, 0) || 1;
      const done = w.tasks.succeeded || 0;
      return `<tr data-workload="${esc(w.id)}"><td>${esc(w.id)}</td><td>${esc(w.team)}</td><td>${esc(w.state)}</td>
        <td><span class="progress"><span style="width:${(100 * done / all).toFixed(0)}%"></span></span> ${done}/${all}</td></tr>`;
    }).join("") || '<tr><td colspan="4" class="muted">no workloads</td></tr>';
    const budgetOf = new Map(budgets.map((b) => [b.team, b]));
    $("#costs tbody").innerHTML = costs.teams.map((t) => {
      const b = budgetOf.get(t.team);
      return `<tr><td>${esc(t.team)}</td><td>${money(t.amount_micros, t.currency)}</td><td>${b ? money(b.budget_micros, b.currency) + " (" + esc(b.level) + ")" : "–"}</td></tr>`;
    }).join("") || '<tr><td colspan="3" class="muted">nothing billed yet</td></tr>';
    const pools = kpis.pools.map((p) => `${p.pool}: ${(p.allocated_milli / 1000).toFixed(1)}/${(p.capacity_milli / 1000).toFixed(0)} GPUs allocated, ${p.waiting} waiting`);
    $("#usage").textContent = pools.join("; ");
    chart("#chart-alloc", kpis.series, "allocation_ratio", 1);
    chart("#chart-wr", kpis.series, "wastage_ratio", 1);
    chart("#chart-tp", kpis.series, "finished");
  } catch (e) {
    $("#who").textContent = String(e.message);
  }
}

function soon() {
  clearTimeout(refreshTimer);
  refreshTimer = setTimeout(refresh, 300);
}

function follow() {
  if (source) source.close();
  source = new EventSource("/api/v1/events?access_token=" + encodeURIComponent(token));
  source.onopen = () => { $("#live").textContent = "live"; $("#live").className = "badge on"; };
  source.onerror = () => { $("#live").textContent = "reconnecting"; $("#live").className = "badge off"; };
  const show = (e) => {
    const li = document.createElement("li");
    li.value = Number(e.lastEventId) || 0;
    li.textContent = `${e.type} ${e.data}`;
    const list = $("#events");
    list.prepend(li);
    while (list.children.length > 200) list.lastChild.remove();
    soon();
  };
  for (const kind of ["workload", "task", "decision", "node", "remediation", "cost", "budget", "abort_requested", "abort_answered"]) {
    source.addEventListener(kind, show);
  }
  source.addEventListener("reset", refresh);
}

async function lookBack() {
  const value = $("#lookback-at").value;
  if (!value) return;
  const at = new Date(value).toISOString();
  try {
    const view = await api("/api/v1/lookback?at=" + encodeURIComponent(at));
    lookingBack = at;
    const nodes = await allNodes();
    const held = new Map();
    for (const a of view.allocations) held.set(a.node + "/" + a.task_id, a);
    for (const n of nodes) for (const g of n.gpus) {
      g.allocations = view.allocations.filter((a) => a.node === n.name && a.gpus.some((x) => x[0] === g.index))
        .map((a) => ({ task_id: a.task_id, workload: a.workload, task: a.task, team: a.team, milli: a.gpus.find((x) => x[0] === g.index)[1] }));
      g.utilization_pct = g.allocations.length ? 100 : 0;
    }
    renderCluster(nodes);
    renderQueue(view.queue, view.queue.length);
    renderRunning(view.allocations);
    $("#usage").textContent = view.pools.map((p) => `${p.pool}: ${(p.allocated_milli / 1000).toFixed(1)}/${(p.capacity_milli / 1000).toFixed(0)} GPUs allocated, ${p.waiting} waiting`).join("; ");
    // Said once the page shows it, not before.
    $("#mode").textContent = "as it was at " + new Date(at).toLocaleString();
    $("#live-only").hidden = true;
    $("#lookback-live").hidden = false;
  } catch (e) {
    $("#mode").textContent = String(e.message);
  }
}

function backToLive() {
  lookingBack = null;
  $("#mode").textContent = "live";
  $("#live-only").hidden = false;
  $("#lookback-live").hidden = true;
  refresh();
}

function start() {
  if (!token) { $("#who").textContent = "sign in with a token"; return; }
  localStorage.setItem("allot-token", token);
  $("#who").textContent = "";
  refresh();
  follow();
}

$("#login").addEventListener("submit", (e) => { e.preventDefault(); token = $("#token").value.trim(); start(); });
$("#lookback-go").addEventListener("click", lookBack);
$("#lookback-live").addEventListener("click", backToLive);
setInterval(refresh, 5000);
start();
