// slotgate console: renders /api/report, /api/status, /api/dead,
// /api/executions, /api/forecast and /api/drafts, and refreshes on every
// `execution` event of /api/events.
"use strict";

const ATTENTION = new Set(["slot_taken", "missed_deadline", "not_due"]);
const HELD = new Set(["paused", "operator", "pruned"]);
const $ = (id) => document.getElementById(id);
let day = new URLSearchParams(location.search).get("day");
let lastStates = new Map();

function cls(state, reason) {
  if (state === "published") return "s-published";
  if (state === "claimed" || state === "publishing") return "s-open";
  if (state === "planned") return "s-planned";
  if (state === "failed") return "s-failed";
  if (ATTENTION.has(reason)) return "s-attention";
  if (HELD.has(reason)) return "s-held";
  return "s-skipped";
}
function esc(s) {
  return String(s ?? "").replace(/[&<>"']/g, (c) => ({ "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" }[c]));
}
function hms(t) { return t ? new Date(t).toISOString().slice(11, 19) : "–"; }
function when(t) { return t ? new Date(t).toISOString().replace("T", " ").slice(0, 19) : "–"; }
function ms(n) {
  if (n === null || n === undefined) return "–";
  const a = Math.abs(n);
  const s = a < 1000 ? a + " ms" : a < 60000 ? (a / 1000).toFixed(1) + " s" : a < 3600000 ? (a / 60000).toFixed(1) + " min" : (a / 3600000).toFixed(1) + " h";
  return (n < 0 ? "−" : "") + s;
}
async function get(path) {
  const r = await fetch(path, { cache: "no-store" });
  if (!r.ok) throw new Error(path + ": HTTP " + r.status);
  return r.json();
}
function chip(state, reason) {
  const label = reason ? state + "/" + reason : state;
  return `<span class="chip ${cls(state, reason)}">${esc(label)}</span>`;
}

function renderStatus(s) {
  $("leader").textContent = s.leader || "none";
  $("epoch").textContent = (s.leader ? "epoch " + s.epoch + " · lease " + ms(s.lease_ms_left) + " left" : "last epoch " + (s.epoch ?? "–"));
  const q = s.queue;
  for (const k of ["delayed", "ready", "pending", "dead"]) $("q-" + k).textContent = q[k];
  $("q-dead").classList.toggle("warn", q.dead > 0);
  $("q-oldest").textContent = q.oldest_pending_ms != null ? "oldest pending " + ms(q.oldest_pending_ms) : "";
  const ws = Object.entries(s.workers || {});
  $("workers").innerHTML = ws.length
    ? ws.map(([id, age]) => `<li><span class="mono">${esc(id)}</span><span class="age ${age > 15000 ? "stale" : ""}">${ms(age)} ago</span></li>`).join("")
    : '<li class="muted">no live workers</li>';
  const ps = s.paused || [];
  $("paused").innerHTML = ps.length
    ? ps.map((p) => `<li data-paused="${esc(p.kind)}"><span><span class="chip s-held">${esc(p.kind)}</span></span><span class="muted" title="${esc(p.note)}">${p.until ? "until " + when(p.until) : "until resumed"}</span></li>`).join("")
    : '<li class="muted">none</li>';
}

function renderTotals(t) {
  const parts = [`<span class="chip s-published">published ${t.published}</span>`];
  for (const [r, n] of Object.entries(t.skipped || {})) if (n > 0) parts.push(chip("skipped", r).replace("</span>", " " + n + "</span>"));
  for (const [r, n] of Object.entries(t.failed || {})) if (n > 0) parts.push(chip("failed", r).replace("</span>", " " + n + "</span>"));
  $("totals").innerHTML = parts.join(" ");
}

function timeline(slots) {
  // The span of the day's nominal and due times, padded to whole hours (a
  // start on another day, e.g. a backfill, is in the table, not here).
  const times = slots.flatMap((s) => [Date.parse(s.nominal_at), Date.parse(s.due_at)]);
  const H = 3600e3;
  const lo = Math.floor((Math.min(...times) - H / 2) / H) * H;
  const hi = Math.max(Math.ceil((Math.max(...times) + H / 2) / H) * H, lo + 2 * H);
  const x = (t) => ((t - lo) / (hi - lo)) * 100;
  let html = "";
  const step = [1, 2, 3, 4, 6].map((h) => h * H).find((s) => (hi - lo) / s <= 12) || 6 * H;
  for (let t = lo; t <= hi; t += step) html += `<span class="tick" style="left:${x(t)}%">${hms(t).slice(0, 5)}</span>`;
  const now = Date.now();
  if (now > lo && now < hi) html += `<span class="now" style="left:${x(now)}%" title="now"></span>`;
  for (const s of slots) {
    const tip = `${s.slot}\nnominal ${hms(s.nominal_at)} · due ${hms(s.due_at)}\nstarted ${hms(s.started_at)} · ${s.state}${s.reason ? "/" + s.reason : ""}` + (s.duplicates_blocked ? `\n${s.duplicates_blocked} duplicate(s) blocked` : "");
    html += `<span class="nominal" style="left:${x(Date.parse(s.nominal_at))}%" title="nominal ${hms(s.nominal_at)}"></span>`;
    html += `<span class="marker ${cls(s.state, s.reason)} ${s.duplicates_blocked ? "dupd" : ""}" data-marker="${esc(s.slot)}" style="left:${x(Date.parse(s.due_at))}%" title="${esc(tip)}"></span>`;
  }
  return `<div class="timeline">${html}</div>`;
}

function renderReport(r) {
  if (r.day && !day) $("day").value = r.day;
  renderTotals(r.totals);
  const byKind = new Map();
  for (const s of r.slots) { if (!byKind.has(s.kind)) byKind.set(s.kind, []); byKind.get(s.kind).push(s); }
  if (!byKind.size) { $("kinds").innerHTML = `<div class="kind"><p class="empty">Nothing planned for ${esc(r.day || "this day")}.</p></div>`; return; }
  const changed = [];
  let html = "";
  for (const [kind, slots] of byKind) {
    const kd = r.day || (r.days && r.days[kind]) || "";
    const pub = slots.filter((s) => s.state === "published").length;
    html += `<article class="kind" data-kind="${esc(kind)}"><h2>${esc(kind)} <span class="muted">${esc(kd)} · ${slots.length} slots · ${pub} published</span></h2>`;
    html += timeline(slots);
    html += `<table class="grid"><thead><tr><th>slot</th><th>nominal</th><th>due (jitter)</th><th>started</th><th>lag</th><th>state</th><th>draft</th><th>deliveries</th><th>dups blocked</th></tr></thead><tbody>`;
    for (const s of slots) {
      const c = cls(s.state, s.reason);
      const jitter = Date.parse(s.due_at) - Date.parse(s.nominal_at);
      const key = s.state + "/" + (s.reason || "");
      if (lastStates.has(s.slot) && lastStates.get(s.slot) !== key) changed.push(s.slot);
      lastStates.set(s.slot, key);
      const rowCls = c === "s-attention" || s.duplicates_blocked ? "attention" : c === "s-failed" ? "failed" : "";
      html += `<tr class="${rowCls}" data-slot="${esc(s.slot)}" data-state="${esc(s.state)}" data-reason="${esc(s.reason || "")}" title="${esc(s.reason ? "reason: " + s.reason : s.state)}">
        <td class="mono">#${s.slot_no}</td><td class="mono">${hms(s.nominal_at)}</td>
        <td class="mono">${hms(s.due_at)} <span class="muted">(+${ms(jitter)})</span></td>
        <td class="mono">${hms(s.started_at)}</td><td class="mono">${ms(s.lag_ms)}</td>
        <td>${chip(s.state, s.reason)}</td>
        <td>${/^https?:\/\//i.test(s.url || "") ? `<a href="${esc(s.url)}" title="${esc(s.url)}" rel="noreferrer">${s.draft_id}</a>` : `<span title="${esc(s.url || "")}">${s.draft_id ?? "–"}</span>`}</td>
        <td class="mono">${s.deliveries}</td><td class="mono ${s.duplicates_blocked ? "dups" : ""}">${s.duplicates_blocked}</td></tr>`;
    }
    html += `</tbody></table></article>`;
  }
  $("kinds").innerHTML = html;
  for (const slot of changed) {
    const tr = document.querySelector(`tr[data-slot="${CSS.escape(slot)}"]`);
    if (tr) tr.classList.add("flash");
  }
}

function renderExecs(v) {
  const rows = v.executions.map((e) => `<tr class="${ATTENTION.has(e.reason) ? "attention" : e.outcome === "failed" ? "failed" : ""}" data-execution="${e.id}">
    <td class="mono">${e.id}</td><td class="mono">${esc(e.slot)}</td><td>${chip(e.outcome, e.reason)}</td>
    <td>${esc(e.caller)}</td><td class="mono">${esc(e.worker)}</td><td class="mono">${when(e.finished_at)}</td></tr>`);
  $("execs").tBodies[0].innerHTML = rows.join("") || '<tr><td colspan="6" class="empty">no executions yet</td></tr>';
}

function renderDead(v) {
  const rows = v.dead.map((d) => `<tr class="failed" data-dead="${esc(d.id)}">
    <td class="mono">${when(d.at)}</td><td class="mono">${esc(JSON.stringify(d.slot ?? null))}</td><td>${esc(d.caller ?? "–")}</td>
    <td>${chip("failed", d.reason)}</td><td class="mono">${esc(d.entry_id ?? "–")}</td>
    <td class="mono">${when(d.due_at)}</td><td class="mono">${when(d.deadline)}${d.past_deadline ? " (past)" : ""}</td>
    <td>${d.deadline ? (d.planned ? "yes" : "no") : "–"}</td></tr>`);
  $("dead").tBodies[0].innerHTML = rows.join("") || '<tr><td colspan="8" class="empty">no dead letters</td></tr>';
}

// One strip per kind: a cell per local day, green with what would publish,
// amber/red with what would be skipped and why (the cell's title), and the
// first dry day called out.
function renderRunway(f) {
  const html = f.kinds.map((k) => {
    const cells = k.days.map((d) => {
      const skipped = Object.entries(d.skipped);
      const why = skipped.map(([r, n]) => `${r} ${n}`).join(", ");
      const dry = d.skipped.no_ready_draft ? " s-failed" : skipped.length ? " s-skipped" : d.slots ? " s-published" : "";
      return `<span class="day${dry}" data-day="${esc(d.day)}" title="${esc(d.day)}: ${d.slots} slots, ${d.publish} publish${why ? "; skipped " + esc(why) : ""}">${d.publish}/${d.slots}</span>`;
    }).join("");
    const dry = k.runs_dry_on ? `<span class="chip s-failed" data-dry="${esc(k.runs_dry_on)}">runs dry ${esc(k.runs_dry_on)}</span>` : `<span class="chip s-published">lasts</span>`;
    return `<div class="strip" data-kind="${esc(k.kind)}"><span class="mono">${esc(k.kind)}</span> ${dry}<div class="days">${cells}</div></div>`;
  });
  $("runway").innerHTML = html.join("") || '<p class="muted">no kinds</p>';
}

function renderReady(v) {
  const rows = v.map((d) => `<tr data-draft="${d.id}">
    <td class="mono">${d.id}</td><td class="mono">${esc(d.kind)}</td><td class="mono">${d.priority}</td>
    <td>${esc(d.category ?? "–")}</td><td class="mono">${when(d.ready_at)}</td><td>${esc(d.title)}</td></tr>`);
  $("ready").tBodies[0].innerHTML = rows.join("") || '<tr><td colspan="6" class="empty">no ready drafts</td></tr>';
}

async function refresh() {
  const q = day ? "?day=" + encodeURIComponent(day) : "";
  const results = await Promise.allSettled([
    get("/api/report" + q).then(renderReport),
    get("/api/status").then(renderStatus),
    get("/api/executions?limit=15").then(renderExecs),
    get("/api/dead?limit=15").then(renderDead),
    get("/api/forecast?days=14").then(renderRunway),
    get("/api/drafts?next=30").then(renderReady),
  ]);
  const bad = results.filter((r) => r.status === "rejected").map((r) => r.reason.message);
  $("updated").textContent = (bad.length ? "errors: " + bad.join("; ") + " · " : "") + "updated " + new Date().toISOString().slice(11, 19) + " UTC";
  document.body.dataset.loaded = String(Number(document.body.dataset.loaded || 0) + 1);
}

let pending = null;
function soon() {
  if (pending) return;
  pending = setTimeout(() => { pending = null; refresh(); }, 250);
}

function setDay(d) {
  day = d || null;
  lastStates = new Map();
  const u = new URL(location.href);
  if (day) u.searchParams.set("day", day); else u.searchParams.delete("day");
  history.replaceState(null, "", u);
  if (day) $("day").value = day;
  refresh();
}
function shift(n) {
  const base = $("day").value || new Date().toISOString().slice(0, 10);
  const d = new Date(base + "T12:00:00Z");
  d.setUTCDate(d.getUTCDate() + n);
  setDay(d.toISOString().slice(0, 10));
}
$("day").addEventListener("change", (e) => setDay(e.target.value));
$("prev").addEventListener("click", () => shift(-1));
$("next").addEventListener("click", () => shift(1));
$("today").addEventListener("click", () => { $("day").value = ""; setDay(null); });
if (day) $("day").value = day;

function listen() {
  const es = new EventSource("/api/events");
  es.addEventListener("open", () => { $("live").textContent = "live"; $("live").className = "live on"; });
  es.addEventListener("execution", soon);
  es.addEventListener("lagged", soon);
  es.addEventListener("error", () => { $("live").textContent = "reconnecting"; $("live").className = "live off"; });
}
refresh();
listen();
// Heartbeat ages and the lease move without executions.
setInterval(() => get("/api/status").then(renderStatus).catch(() => {}), 5000);
