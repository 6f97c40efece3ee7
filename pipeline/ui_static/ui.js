// The pipeline page (pipeline/ui.py serves it): polls /api/pipeline, draws the DAG and the sparklines as
// plain SVG, fills the tables, and shows one table's /api/history when it is clicked. No framework, nothing
// loaded from elsewhere; every text from the pipeline goes through textContent, never through HTML.
"use strict";

const POLL_MS = 3000;
const SVG = "http://www.w3.org/2000/svg";
const NODE_W = 190, NODE_H = 46, GAP_X = 70, GAP_Y = 18, PAD = 10;
const SPARK_W = 124, SPARK_H = 24;

let selected = decodeURIComponent((location.hash.match(/^#table=(.+)$/) || [])[1] || "") || null;
let last = null;  // the newest /api/pipeline answer
let drawnDag = "";  // what the drawn graph shows: it is redrawn only when that changes

// ------------------------------------------------------------------------------------------ formatting

function fmtSeconds(s) {  // as pipeline.monitor.fmt_seconds: 0.4s, 12s, 3m05s, 2h10m, 3d4h
  if (s === null || s === undefined) return "";
  if (s < 10) return s.toFixed(1) + "s";
  s = Math.round(s);
  if (s < 60) return s + "s";
  if (s < 3600) return Math.floor(s / 60) + "m" + String(s % 60).padStart(2, "0") + "s";
  if (s < 86400) return Math.floor(s / 3600) + "h" + String(Math.floor(s % 3600 / 60)).padStart(2, "0") + "m";
  return Math.floor(s / 86400) + "d" + Math.floor(s % 86400 / 3600) + "h";
}

function fmtMs(ms) {
  if (ms === null || ms === undefined) return "";
  return ms < 1000 ? Math.round(ms) + " ms" : fmtSeconds(ms / 1000);
}

function fmtTime(epoch) {  // UTC, like the CLI
  if (!epoch) return "";
  return new Date(epoch * 1000).toISOString().replace("T", " ").slice(0, 19);
}

function el(tag, attrs, ...children) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (k === "class") e.className = v; else e.setAttribute(k, v);
  }
  for (const c of children) e.append(c === null || c === undefined ? "" : c);
  return e;
}

function svg(tag, attrs, text) {
  const e = document.createElementNS(SVG, tag);
  for (const [k, v] of Object.entries(attrs || {})) e.setAttribute(k, v);
  if (text !== undefined) e.textContent = text;
  return e;
}

function clip(text, n) {
  return text.length <= n ? text : text.slice(0, n - 1) + "…";
}

// ------------------------------------------------------------------------------------------------ DAG

// Layered (Sugiyama-style, in small): base tables in the left column, each stream table one column right of
// its deepest source (the server's dag.layers). An edge that spans several columns passes through a slot of
// its own in each column between (a "dummy" node), so it never runs behind a table's box. Within a column,
// nodes and slots are ordered by the mean position of what they come from, which keeps most edges from
// crossing on pipelines of the size a page can show.
const SLOT_H = 14;  // height of an edge's slot in a column it crosses

function layout(nodes, edges) {
  const depth = Object.fromEntries(nodes.map(n => [n.id, n.depth]));
  const cols = [];
  const put = item => (cols[item.depth] = cols[item.depth] || []).push(item);
  nodes.forEach(n => put({id: n.id, depth: n.depth, h: NODE_H, from: []}));
  const byId = Object.fromEntries(cols.flat().map(i => [i.id, i]));
  const routes = [];  // per edge: the ids it passes through, source first
  for (const e of edges) {
    if (depth[e.source] === undefined || depth[e.reader] === undefined) continue;
    let prev = e.source;
    const route = [e.source];
    for (let d = depth[e.source] + 1; d < depth[e.reader]; d++) {
      const id = `${e.source}->${e.reader}@${d}`;
      byId[id] = {id, depth: d, h: SLOT_H, from: [prev], dummy: true};
      put(byId[id]);
      route.push(id);
      prev = id;
    }
    byId[e.reader].from.push(prev);
    route.push(e.reader);
    routes.push({edge: e, route});
  }
  const rank = {};
  cols.forEach((col, x) => {
    if (!col) { cols[x] = []; return; }
    if (x > 0) {
      const bary = i => {
        const ys = i.from.map(f => rank[f]).filter(v => v !== undefined);
        return ys.length ? ys.reduce((a, b) => a + b, 0) / ys.length : 0;
      };
      col.sort((a, b) => bary(a) - bary(b) || a.id.localeCompare(b.id));
    }
    col.forEach((item, i) => { rank[item.id] = i; });
  });
  const colHeight = col => col.reduce((a, i) => a + i.h, 0) + Math.max(0, col.length - 1) * GAP_Y;
  const tallest = Math.max(NODE_H, ...cols.map(colHeight));
  const pos = {};
  cols.forEach((col, x) => {
    let y = PAD + (tallest - colHeight(col)) / 2;
    for (const item of col) {
      pos[item.id] = {x: PAD + x * (NODE_W + GAP_X), y, h: item.h};
      y += item.h + GAP_Y;
    }
  });
  return {pos, routes, width: 2 * PAD + cols.length * (NODE_W + GAP_X) - GAP_X, height: 2 * PAD + tallest};
}

// An edge's path: a curve across each gap between columns, a straight line through each column it crosses.
function edgePath(route, pos) {
  const mid = p => p.y + p.h / 2;
  const a = pos[route[0]];
  let d = `M ${a.x + NODE_W} ${mid(a)}`;
  for (let i = 1; i < route.length; i++) {
    const from = pos[route[i - 1]], to = pos[route[i]];
    const x1 = from.x + NODE_W, x2 = to.x, c = (x1 + x2) / 2;
    d += ` C ${c} ${mid(from)}, ${c} ${mid(to)}, ${x2} ${mid(to)}`;
    if (i < route.length - 1) d += ` L ${to.x + NODE_W} ${mid(to)}`;
  }
  return d;
}

function drawDag(doc) {
  const box = document.getElementById("dag");
  const {nodes, edges} = doc.dag;
  if (!nodes.length) { box.replaceChildren(el("p", {class: "hint"}, "No stream tables in this catalog yet.")); return; }
  const rows = Object.fromEntries(doc.tables.map(t => [t.name.toLowerCase(), t]));
  const down = new Set(doc.sources.filter(s => s.status === "DOWN").map(s => String(s.name).toLowerCase()));
  const shown = JSON.stringify([nodes, edges, [...down], selected,
    doc.tables.map(t => [t.name, t.status, t.refresh_mode, t.schedule, t.staleness, t.last_error])]);
  if (shown === drawnDag) return;
  drawnDag = shown;
  const {pos, routes, width, height} = layout(nodes, edges);
  const root = svg("svg", {width, height, viewBox: `0 0 ${width} ${height}`, role: "img",
                           "aria-label": "dependency graph of sources and stream tables"});
  const defs = svg("defs");
  const marker = svg("marker", {id: "arrow", viewBox: "0 0 10 10", refX: 10, refY: 5, markerWidth: 7,
                                markerHeight: 7, orient: "auto-start-reverse"});
  marker.append(svg("path", {d: "M 0 0 L 10 5 L 0 10 z"}));
  defs.append(marker);
  root.append(defs);
  for (const {edge, route} of routes) {
    root.append(svg("path", {class: "edge", d: edgePath(route, pos), "marker-end": "url(#arrow)",
                             "data-source": edge.source, "data-reader": edge.reader}));
  }
  for (const n of nodes) {
    const p = pos[n.id], row = rows[n.id];
    const kind = n.kind === "stream table" ? "st" : n.kind;
    const classes = ["node", kind];
    if (row) classes.push("status-" + row.status);
    if (down.has(n.id)) classes.push("down");
    if (n.id === selected) classes.push("selected");
    const g = svg("g", {class: classes.join(" "), "data-name": n.id, transform: `translate(${p.x},${p.y})`});
    g.append(svg("title", {}, n.name + (row && row.last_error ? "\n" + row.last_error : "")));
    g.append(svg("rect", {width: NODE_W, height: NODE_H, rx: kind === "st" ? 6 : 14}));
    g.append(svg("text", {class: "name", x: 10, y: 19}, clip(n.name, 24)));
    const label = row ? `${row.refresh_mode} · ${row.schedule || "-"}` + (row.staleness ? ` · stale ${row.staleness}` : "")
                      : n.label + (down.has(n.id) ? " · DOWN" : "");
    g.append(svg("text", {class: "label", x: 10, y: 36}, clip(label, 32)));
    if (row) {
      g.append(svg("circle", {class: "dot status-" + row.status, cx: NODE_W - 12, cy: 12, r: 5,
                              fill: row.status === "ACTIVE" ? "#2e7d32" : row.status === "ERROR" ? "#c62828" : "#9e9e9e"}));
      g.addEventListener("click", () => select(row.name));
    }
    root.append(g);
  }
  box.replaceChildren(root);
}

// --------------------------------------------------------------------------------------- the tables

// Bars, one per refresh, oldest left; heights on a log scale (a NO_DATA check takes milliseconds, a FULL
// refresh minutes: both stay visible), colours by action as in the legend of the CSS.
function sparkline(points) {
  const s = svg("svg", {class: "spark", width: SPARK_W, height: SPARK_H, viewBox: `0 0 ${SPARK_W} ${SPARK_H}`});
  if (!points.length) return s;
  const top = Math.log1p(Math.max(...points.map(p => p.ms || 0), 1));
  const step = SPARK_W / Math.max(points.length, 12);
  points.forEach((p, i) => {
    const h = 2 + (SPARK_H - 2) * Math.log1p(p.ms || 0) / top;
    const r = svg("rect", {class: p.action, x: (i * step).toFixed(1), y: (SPARK_H - h).toFixed(1),
                           width: Math.max(1, step - 1).toFixed(1), height: h.toFixed(1)});
    r.append(svg("title", {}, `${p.action} ${fmtMs(p.ms)} at ${fmtTime(p.at)}`));
    s.append(r);
  });
  return s;
}

function drawTables(doc) {
  const body = document.querySelector("#tables tbody");
  body.replaceChildren(...doc.tables.map(t => {
    const latest = t.latest
      ? `${t.latest.action} ${fmtMs(t.latest.ms)}, ${fmtSeconds(Math.max(0, doc.now - t.latest.at))} ago` : "";
    const work = t.last_refresh_ms !== null
      ? `${t.last_refresh_action} ${fmtMs(t.last_refresh_ms)} (p95 ${fmtMs(t.p95_refresh_ms)})` : "";
    const errors = t.consecutive_errors ? `${t.consecutive_errors}× ${t.last_error || ""}` : (t.last_error || "");
    const tr = el("tr", {"data-name": t.name.toLowerCase(), class: t.name.toLowerCase() === selected ? "selected" : ""},
      el("td", {class: "name"}, t.name),
      el("td", {class: "status status-" + t.status}, t.status),
      el("td", {class: "mode"}, t.refresh_mode),
      el("td", {}, t.schedule || ""),
      el("td", {class: "staleness num"}, t.staleness),
      el("td", {class: "num"}, t.data_age),
      el("td", {class: "latest"}, latest),
      el("td", {class: "work"}, work),
      el("td", {class: "recent"}, sparkline(t.recent)),
      el("td", {class: "error-text", title: t.last_error || ""}, errors));
    tr.addEventListener("click", () => select(t.name));
    return tr;
  }));
  const broken = doc.tables.filter(t => t.last_error || t.status === "ERROR");
  const downs = doc.sources.filter(s => s.status === "DOWN" || s.error);
  document.getElementById("errors-section").hidden = !(broken.length || downs.length);
  document.getElementById("errors").replaceChildren(
    ...broken.map(t => el("li", {"data-name": t.name.toLowerCase()}, el("b", {}, t.name), ` (${t.status}, `,
      `${t.consecutive_errors} failure${t.consecutive_errors === 1 ? "" : "s"} in a row): `,
      el("span", {class: "msg"}, t.last_error || "in ERROR"))),
    ...downs.map(s => el("li", {}, el("b", {}, "source " + s.name), ` (${s.status}): `,
      el("span", {class: "msg"}, s.error || s.schema_error || ""))));
  document.getElementById("sources-section").hidden = !doc.sources.length;
  document.querySelector("#sources tbody").replaceChildren(...doc.sources.map(s => el("tr", {},
    el("td", {}, s.name), el("td", {class: "status status-" + s.status}, s.status), el("td", {}, s.topic || ""),
    el("td", {class: "num"}, s.lag_offsets ?? ""), el("td", {class: "num"}, s.lag || ""),
    el("td", {class: "num"}, s.dead_letters ?? ""), el("td", {class: "error-text"}, s.error || s.schema_error || ""))));
}

function drawHeader(doc) {
  document.getElementById("where").textContent =
    (doc.mode === "run" ? "trickle run " : "warehouse ") + doc.title + (doc.mode === "run" ? " (live)" : " (read-only)");
  const counts = {};
  for (const t of doc.tables) counts[t.status] = (counts[t.status] || 0) + 1;
  document.getElementById("summary").textContent = `${doc.tables.length} stream tables: ` +
    Object.entries(counts).map(([k, v]) => `${v} ${k}`).join(", ");
  document.getElementById("updated").textContent = "as of " + fmtTime(doc.now) + " UTC";
}

// ---------------------------------------------------------------------------------------- history

async function drawHistory() {
  const section = document.getElementById("history-section");
  const row = last && last.tables.find(t => t.name.toLowerCase() === selected);
  if (!selected || !row) { section.hidden = true; return; }
  const answer = await fetch("api/history/" + encodeURIComponent(selected) + "?limit=50");
  if (!answer.ok) { section.hidden = true; return; }
  const doc = await answer.json();
  if (selected !== doc.name.toLowerCase()) return;  // another table was clicked meanwhile
  document.getElementById("history-name").textContent = row.name;
  document.getElementById("history-query").textContent =
    row.query + (row.full_reason ? `\n-- refreshed FULL: ${row.full_reason}` : "");
  document.querySelector("#history tbody").replaceChildren(...doc.records.map(r => {
    const why = el("td", {class: "why"}, r.error ? el("span", {class: "msg status-ERROR"}, r.error) : (r.reason || ""));
    if (r.traceback) why.append(el("details", {}, el("summary", {}, "traceback"), el("pre", {}, r.traceback)));
    return el("tr", {"data-status": r.status},
      el("td", {}, fmtTime(r.started_at)),
      el("td", {class: "status status-" + r.status}, r.status),
      el("td", {class: "action"}, r.action || ""),
      el("td", {class: "num"}, fmtMs(r.duration_ms)),
      el("td", {class: "num"}, `+${r.rows_inserted || 0} -${r.rows_deleted || 0} ~${r.rows_updated || 0}`),
      why);
  }));
  section.hidden = false;
}

function select(name) {
  selected = name.toLowerCase();
  history.replaceState(null, "", "#table=" + encodeURIComponent(selected));
  if (last) draw(last);
  drawHistory().then(() => document.getElementById("history-section").scrollIntoView({block: "nearest"}));
}

// -------------------------------------------------------------------------------------------- polling

function draw(doc) {
  drawHeader(doc);
  drawDag(doc);
  drawTables(doc);
}

async function poll() {
  const problem = document.getElementById("problem");
  try {
    const answer = await fetch("api/pipeline");
    const doc = await answer.json();
    if (!answer.ok) throw new Error(doc.error || answer.statusText);
    last = doc;
    problem.hidden = true;
    draw(doc);
    await drawHistory();
    document.body.dataset.loaded = "yes";  // for tests and scripts: the first answer is drawn
  } catch (e) {
    problem.textContent = "Cannot read the pipeline (the page shows the last answer): " + e.message;
    problem.hidden = false;
  }
  setTimeout(poll, POLL_MS);
}

poll();
