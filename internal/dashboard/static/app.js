// cellfork dashboard: plain DOM, no framework. Every call goes to this
// origin's public API with the key the user signed in with; nothing from
// the API is ever parsed as HTML.
"use strict";

const ENVD = 49983, CODE = 49999;
const KEY = "cellfork.key";
let timers = [];

// ---- small helpers -------------------------------------------------------

function h(tag, attrs, ...kids) {
  const el = document.createElementNS(tag.startsWith("svg:") ? "http://www.w3.org/2000/svg" : "http://www.w3.org/1999/xhtml",
    tag.replace(/^svg:/, ""));
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === undefined || v === null || v === false) continue;
    if (k.startsWith("on")) el.addEventListener(k.slice(2), v);
    else if (k === "style") el.style.cssText = v; // CSSOM: allowed by the CSP, unlike a style attribute
    else el.setAttribute(k, v === true ? "" : String(v));
  }
  for (const kid of kids.flat()) {
    if (kid === undefined || kid === null || kid === false) continue;
    el.append(kid instanceof Node ? kid : document.createTextNode(String(kid)));
  }
  return el;
}

function every(ms, f) { f(); timers.push(setInterval(f, ms)); }
function stopTimers() { timers.forEach(clearInterval); timers = []; }

function short(id) { return id ? id.slice(0, 8) : ""; }
function bytes(n) {
  n = Number(n) || 0;
  const u = ["B", "KiB", "MiB", "GiB", "TiB"];
  let i = 0;
  while (n >= 1024 && i < u.length - 1) { n /= 1024; i++; }
  return (i ? n.toFixed(1) : n) + " " + u[i];
}
function age(iso) {
  const s = Math.max(0, (Date.now() - Date.parse(iso)) / 1000);
  if (s < 60) return Math.floor(s) + "s";
  if (s < 3600) return Math.floor(s / 60) + "m";
  if (s < 86400) return Math.floor(s / 3600) + "h" + Math.floor((s % 3600) / 60) + "m";
  return Math.floor(s / 86400) + "d";
}
function badge(state) { return h("span", { class: "badge " + String(state || "").toLowerCase() }, state || "?"); }
function bar(frac) {
  const pct = Math.max(0, Math.min(1, frac || 0)) * 100;
  return h("div", { class: "bar", title: pct.toFixed(0) + "%" }, h("span", { style: "width:" + pct.toFixed(1) + "%" }));
}
function card(title, ...kids) { return h("section", { class: "card" }, title ? h("h2", {}, title) : null, ...kids); }
function kv(pairs) {
  return h("dl", { class: "kv" }, pairs.filter(p => p[1] !== undefined && p[1] !== "").flatMap(([k, v]) => [h("dt", {}, k), h("dd", {}, v)]));
}
function table(head, rows) {
  return h("div", { class: "table-wrap" }, h("table", {},
    h("thead", {}, h("tr", {}, head.map(c => h("th", { class: c.narrow === false ? "hide-narrow" : null }, c.label || c)))),
    h("tbody", {}, rows)));
}

// ---- API -----------------------------------------------------------------

function key() { return sessionStorage.getItem(KEY) || localStorage.getItem(KEY) || ""; }

class APIError extends Error {
  constructor(status, message) { super(message); this.status = status; }
}

// check throws an APIError for a failed response; a 401 of the control
// plane means the key is no longer good.
async function check(resp, control) {
  if (resp.ok) return resp;
  let msg = resp.status + " " + resp.statusText;
  try { const b = await resp.json(); if (b.message) msg = b.message; } catch (_) { /* not JSON */ }
  if (resp.status === 401 && control) signOut("The key was refused: " + msg);
  throw new APIError(resp.status, msg);
}

async function api(path, opts = {}) {
  const headers = Object.assign({ "X-API-KEY": key() }, opts.body ? { "Content-Type": "application/json" } : {});
  const resp = await check(await fetch(path, { method: opts.method || "GET", headers, body: opts.body ? JSON.stringify(opts.body) : undefined }), true);
  return resp.status === 204 ? null : resp.json();
}

// tokens caches each sandbox's data-plane access token.
const tokens = new Map();
async function token(id) {
  if (!tokens.has(id)) tokens.set(id, (await api("/sandboxes/" + encodeURIComponent(id))).envdAccessToken);
  return tokens.get(id);
}

// data sends a request to a port inside a sandbox through the daemon.
async function data(id, port, path, opts = {}) {
  const headers = Object.assign({ "E2b-Sandbox-Id": id, "E2b-Sandbox-Port": String(port), "X-Access-Token": await token(id) }, opts.headers || {});
  return check(await fetch(path, { method: opts.method || "GET", headers, body: opts.body }), false);
}

async function rpc(id, method, msg) {
  const resp = await data(id, ENVD, method, { method: "POST", body: JSON.stringify(msg),
    headers: { "Content-Type": "application/json", "Connect-Protocol-Version": "1" } });
  return resp.json();
}

// ---- sign in -------------------------------------------------------------

function signOut(message) {
  sessionStorage.removeItem(KEY);
  localStorage.removeItem(KEY);
  tokens.clear();
  stopTimers();
  document.getElementById("nav").hidden = true;
  document.getElementById("view").replaceChildren();
  document.getElementById("signin").hidden = false;
  document.getElementById("signin-error").textContent = message || "";
}

async function signIn(ev) {
  ev.preventDefault();
  const k = document.getElementById("key").value.trim();
  const err = document.getElementById("signin-error");
  err.textContent = "";
  // Any keyed call tells; this one a daemon and a cluster gateway both serve.
  const resp = await fetch("/v2/sandboxes?limit=1", { headers: { "X-API-KEY": k } });
  if (!resp.ok) {
    err.textContent = resp.status === 401 ? "That key is not valid for this daemon." : "The daemon answered " + resp.status + ".";
    return;
  }
  (document.getElementById("remember").checked ? localStorage : sessionStorage).setItem(KEY, k);
  document.getElementById("key").value = "";
  route();
}

// ---- router --------------------------------------------------------------

function route() {
  stopTimers();
  const view = document.getElementById("view");
  if (!key()) { signOut(); return; }
  document.getElementById("signin").hidden = true;
  document.getElementById("nav").hidden = false;
  const parts = location.hash.replace(/^#\/?/, "").split("/").map(decodeURIComponent);
  const name = parts[0] || "sandboxes";
  for (const a of document.querySelectorAll("nav a")) a.classList.toggle("active", a.dataset.view === name || (name === "sandbox" && a.dataset.view === "sandboxes"));
  view.replaceChildren();
  const pages = { sandboxes: sandboxesPage, sandbox: sandboxPage, snapshots: snapshotsPage, templates: templatesPage, host: hostPage };
  (pages[name] || sandboxesPage)(view, parts.slice(1)).catch(e => view.append(card("Error", h("p", { class: "error" }, e.message))));
}

// ---- sandboxes -----------------------------------------------------------

async function listSandboxes() {
  return api("/v2/sandboxes?state=running,paused&limit=100");
}

async function sandboxesPage(view) {
  const body = h("tbody", {});
  const count = h("span", { class: "muted" });
  const tmpl = h("input", { type: "text", value: "base", "aria-label": "template", style: "width:12rem" });
  const err = h("p", { class: "error" });
  const createBtn = h("button", { type: "button", onclick: async () => {
    createBtn.disabled = true; err.textContent = "";
    try { const sb = await api("/v2/sandboxes", { method: "POST", body: { templateID: tmpl.value || "base" } }); location.hash = "#/sandbox/" + sb.sandboxID; }
    catch (e) { err.textContent = e.message; }
    finally { createBtn.disabled = false; }
  } }, "New sandbox");
  view.append(h("div", { class: "row" }, h("h1", {}, "Sandboxes"), count, h("span", { class: "spacer" }), tmpl, createBtn), err,
    card(null, h("div", { class: "table-wrap" }, h("table", { id: "sandboxes" },
      h("thead", {}, h("tr", {}, h("th", {}, "Sandbox"), h("th", {}, "State"), h("th", {}, "Template"), h("th", {}, "Age"),
        h("th", {}, "CPU"), h("th", {}, "Memory"), h("th", { class: "hide-narrow" }, "Limits"))), body))));
  every(3000, async () => {
    const list = await listSandboxes();
    count.textContent = list.length + (list.length === 1 ? " sandbox" : " sandboxes");
    const running = list.filter(s => s.state === "running").map(s => s.sandboxID);
    let m = {};
    if (running.length) {
      try { m = (await api("/sandboxes/metrics?sandbox_ids=" + running.map(encodeURIComponent).join(","))).sandboxes; } catch (_) { m = {}; }
    }
    body.replaceChildren(...list.map(s => {
      const x = m[s.sandboxID];
      return h("tr", { class: "click", "data-id": s.sandboxID, onclick: () => { location.hash = "#/sandbox/" + s.sandboxID; } },
        h("td", { class: "mono" }, s.sandboxID), h("td", {}, badge(s.state)), h("td", {}, s.templateID), h("td", {}, age(s.startedAt)),
        h("td", {}, x ? x.cpuUsedPct.toFixed(0) + "%" : "–"),
        h("td", {}, x ? bytes(x.memUsed) + " / " + bytes(x.memTotal) : "–"),
        h("td", { class: "hide-narrow muted" }, s.cpuCount + " CPU, " + s.memoryMB + " MiB"));
    }));
    if (!list.length) body.append(h("tr", {}, h("td", { colspan: 7, class: "muted" }, "No sandboxes. Create one above, with an SDK or the CLI.")));
  });
}

// ---- one sandbox ---------------------------------------------------------

async function sandboxPage(view, [id]) {
  const sb = await api("/sandboxes/" + encodeURIComponent(id));
  tokens.set(id, sb.envdAccessToken);
  const err = h("p", { class: "error" });
  const act = (label, f, cls) => h("button", { type: "button", class: cls || "secondary", onclick: async (e) => {
    e.target.disabled = true; err.textContent = "";
    try { await f(); } catch (x) { err.textContent = x.message; } finally { e.target.disabled = false; }
  } }, label);
  const path = "/sandboxes/" + encodeURIComponent(id);
  const actions = h("div", { class: "row" },
    sb.state === "paused" ? act("Resume", async () => { await api("/v2" + path + "/connect", { method: "POST", body: {} }); route(); })
      : act("Pause", async () => { await api(path + "/pause", { method: "POST" }); route(); }),
    act("Snapshot", async () => { await api(path + "/snapshots", { method: "POST", body: {} }); route(); }),
    act("Fork", async () => { await api(path + "/fork", { method: "POST", body: { count: 1 } }); route(); }),
    act("Kill", async () => { if (confirm("Kill sandbox " + id + "?")) { await api(path, { method: "DELETE" }); location.hash = "#/"; } }, "danger"));
  view.append(h("div", { class: "row" }, h("h1", {}, "Sandbox ", h("span", { class: "mono" }, id)), badge(sb.state)), actions, err);
  const info = card("Details", kv([
    ["Template", sb.templateID], ["Started", sb.startedAt + " (" + age(sb.startedAt) + " ago)"], ["Ends", sb.endAt],
    ["Boot", sb.bootMode], ["Limits", sb.cpuCount + " CPU, " + sb.memoryMB + " MiB memory, " + sb.diskSizeMB + " MiB disk"],
    ["Forked from", sb.parentSandboxID ? h("a", { href: "#/sandbox/" + sb.parentSandboxID, class: "mono" }, sb.parentSandboxID) : ""],
    ["State from", sb.snapshotID ? h("span", { class: "mono" }, sb.snapshotID) : ""],
    ["Internet", sb.allowInternetAccess ? "allowed" : "off"],
  ]));
  const grid = h("div", { class: "grid" }, info);
  view.append(grid);
  if (sb.state === "running") {
    grid.append(metricsCard(id), processesCard(id));
    view.append(h("div", { class: "grid" }, filesCard(id), runCard(id)));
  } else {
    grid.append(card("Paused", h("p", { class: "muted" }, "Resume it to see its processes, files and usage.")));
  }
  view.append(await lineageCard(id));
}

// metricsCard charts CPU and memory: the daemon's history (a sample every
// few seconds, the last hour kept), then new samples as they come.
function metricsCard(id) {
  const pts = [];
  const cpu = h("div", { class: "chart" }), mem = h("div", { class: "chart" });
  const now = h("p", { class: "muted" });
  every(3000, async () => {
    const since = pts.length ? "?start=" + (pts[pts.length - 1].timestampUnix + 1) : "";
    const ms = await api("/sandboxes/" + encodeURIComponent(id) + "/metrics" + since);
    for (const m of ms) if (!pts.length || m.timestampUnix > pts[pts.length - 1].timestampUnix) pts.push(m);
    pts.splice(0, Math.max(0, pts.length - 720));
    if (!pts.length) return;
    const m = pts[pts.length - 1];
    now.textContent = "CPU " + m.cpuUsedPct.toFixed(1) + "% of " + m.cpuCount + " · memory " + bytes(m.memUsed) + " of " + bytes(m.memTotal) +
      " · " + pts.length + " samples since " + new Date(pts[0].timestampUnix * 1000).toLocaleTimeString();
    cpu.replaceChildren(chart(pts.map(p => p.cpuUsedPct), 100, "cpu"));
    mem.replaceChildren(chart(pts.map(p => p.memUsed), m.memTotal, "mem"));
  });
  return card("Usage over time", now, h("p", { class: "muted" }, "CPU %"), cpu, h("p", { class: "muted" }, "Memory"), mem);
}

function chart(values, top, cls) {
  const W = 300, H = 100, n = Math.max(values.length, 2);
  const y = v => H - (Math.min(v, top) / (top || 1)) * (H - 4) - 2;
  const d = values.map((v, i) => (i ? "L" : "M") + ((i / (n - 1)) * W).toFixed(1) + " " + y(v).toFixed(1)).join(" ");
  return h("svg:svg", { viewBox: `0 0 ${W} ${H}`, preserveAspectRatio: "none", role: "img" },
    h("svg:line", { class: "axis", x1: 0, y1: H - 1, x2: W, y2: H - 1 }),
    h("svg:path", { class: "line " + cls, d, "vector-effect": "non-scaling-stroke" }));
}

function processesCard(id) {
  const body = h("tbody", {});
  every(5000, async () => {
    const res = await rpc(id, "/process.Process/List", {});
    const ps = (res.processes || []).sort((a, b) => a.pid - b.pid);
    body.replaceChildren(...ps.map(p => h("tr", {}, h("td", {}, p.pid), h("td", { class: "mono" },
      [p.config.cmd].concat(p.config.args || []).join(" ").slice(0, 120)), h("td", { class: "hide-narrow muted" }, p.tag || ""))));
    if (!ps.length) body.append(h("tr", {}, h("td", { colspan: 3, class: "muted" }, "No processes started through the API.")));
  });
  return card("Processes", table(["PID", "Command", { label: "Tag", narrow: false }], body));
}

function filesCard(id) {
  const list = h("ul", { class: "files" });
  const where = h("div", { class: "mono" });
  const preview = h("div", {});
  async function open(dir) {
    const res = await rpc(id, "/filesystem.Filesystem/ListDir", { path: dir, depth: 1 });
    where.textContent = dir;
    const entries = (res.entries || []).sort((a, b) => (a.type > b.type ? 1 : a.type < b.type ? -1 : a.name.localeCompare(b.name)));
    const up = dir.replace(/\/[^/]*\/?$/, "") || "/";
    list.replaceChildren(
      dir !== "/" ? h("li", {}, h("button", { type: "button", class: "link", onclick: () => open(up) }, "../")) : null,
      ...entries.map(e => h("li", {}, e.type === "FILE_TYPE_DIRECTORY"
        ? h("button", { type: "button", class: "link", onclick: () => open(e.path) }, e.name + "/")
        : h("button", { type: "button", class: "link", onclick: () => show(e) }, e.name), " ",
        e.type !== "FILE_TYPE_DIRECTORY" ? h("span", { class: "muted" }, bytes(e.size)) : null)));
  }
  async function show(e) {
    const resp = await data(id, ENVD, "/files?path=" + encodeURIComponent(e.path));
    const blob = await resp.blob();
    const type = blob.type || "";
    if (type.startsWith("image/")) {
      const url = await new Promise(r => { const fr = new FileReader(); fr.onload = () => r(fr.result); fr.readAsDataURL(blob); });
      preview.replaceChildren(h("p", { class: "mono" }, e.path), h("div", { class: "out" }, h("img", { src: url, alt: e.name })));
    } else {
      const text = await blob.slice(0, 65536).text();
      preview.replaceChildren(h("p", { class: "mono" }, e.path + (blob.size > 65536 ? " (first 64 KiB)" : "")), h("pre", { class: "out" }, text));
    }
  }
  open("/home/user").catch(e => list.replaceChildren(h("li", { class: "error" }, e.message)));
  return card("Files", where, list, preview);
}

function runCard(id) {
  const mode = h("select", { "aria-label": "language" }, h("option", { value: "python" }, "Python"), h("option", { value: "bash" }, "Shell command"));
  const code = h("textarea", { "aria-label": "code", spellcheck: "false" }, "import sys\nprint(sys.version)\n1 + 1");
  const out = h("pre", { class: "out run", hidden: true });
  const imgs = h("div", { class: "out" });
  const run = h("button", { type: "button", onclick: async () => {
    run.disabled = true; out.hidden = false; out.replaceChildren(); imgs.replaceChildren();
    try { await (mode.value === "python" ? runPython(id, code.value, out, imgs) : runShell(id, code.value, out)); }
    catch (e) { out.append(h("span", { class: "stderr" }, e.message)); }
    finally { run.disabled = false; }
  } }, "Run");
  return card("Run", h("div", { class: "row" }, mode, h("span", { class: "spacer" }), run), code, out, imgs);
}

async function runPython(id, src, out, imgs) {
  const resp = await data(id, CODE, "/execute", { method: "POST", body: JSON.stringify({ code: src }), headers: { "Content-Type": "application/json" } });
  await lines(resp, ev => {
    if (ev.type === "stdout") out.append(ev.text);
    else if (ev.type === "stderr") out.append(h("span", { class: "stderr" }, ev.text));
    else if (ev.type === "result") {
      for (const f of ["png", "jpeg"]) if (ev[f]) imgs.append(h("img", { src: "data:image/" + f + ";base64," + ev[f], alt: "result" }));
      if (ev.text && !ev.png && !ev.jpeg) out.append(ev.text + "\n");
    } else if (ev.type === "error") out.append(h("span", { class: "stderr" }, ev.name + ": " + ev.value + "\n" + (ev.traceback || "")));
  });
}

// lines reads an NDJSON stream as it comes.
async function lines(resp, f) {
  const reader = resp.body.getReader(), dec = new TextDecoder();
  let buf = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (value) buf += dec.decode(value, { stream: true });
    let i;
    while ((i = buf.indexOf("\n")) >= 0) {
      const line = buf.slice(0, i).trim(); buf = buf.slice(i + 1);
      if (line) f(JSON.parse(line));
    }
    if (done) return;
  }
}

// runShell runs a command through envd's Connect server stream
// (process.Process/Start; each message is a 5-byte envelope plus JSON).
async function runShell(id, cmd, out) {
  const msg = new TextEncoder().encode(JSON.stringify({ process: { cmd: "/bin/bash", args: ["-l", "-c", cmd] }, stdin: false }));
  const env = new Uint8Array(5 + msg.length);
  new DataView(env.buffer).setUint32(1, msg.length);
  env.set(msg, 5);
  const resp = await data(id, ENVD, "/process.Process/Start", { method: "POST", body: env,
    headers: { "Content-Type": "application/connect+json", "Connect-Protocol-Version": "1" } });
  const reader = resp.body.getReader(), dec = new TextDecoder();
  let buf = new Uint8Array(0);
  const b64 = s => dec.decode(Uint8Array.from(atob(s), c => c.charCodeAt(0)));
  for (;;) {
    const { value, done } = await reader.read();
    if (value) { const n = new Uint8Array(buf.length + value.length); n.set(buf); n.set(value, buf.length); buf = n; }
    while (buf.length >= 5) {
      const len = new DataView(buf.buffer, buf.byteOffset).getUint32(1);
      if (buf.length < 5 + len) break;
      const flags = buf[0], m = JSON.parse(dec.decode(buf.subarray(5, 5 + len)));
      buf = buf.subarray(5 + len);
      if (flags & 2) { if (m.error) out.append(h("span", { class: "stderr" }, m.error.message + "\n")); continue; }
      const e = m.event || {};
      if (e.data && e.data.stdout) out.append(b64(e.data.stdout));
      if (e.data && e.data.stderr) out.append(h("span", { class: "stderr" }, b64(e.data.stderr)));
      if (e.end) out.append(h("span", { class: "muted" }, "\nexit code " + (e.end.exitCode || 0) + "\n"));
    }
    if (done) return;
  }
}

// ---- lineage graph -------------------------------------------------------

// lineage builds the graph of snapshots and sandboxes: a snapshot hangs
// under its parent snapshot; a sandbox under the sandbox it was forked
// from if it still has that sandbox's state (the same snapshot behind
// both), else under the snapshot its state came from, else under its
// fork parent.
function lineage(snaps, sandboxes) {
  const nodes = new Map();
  const byID = new Map(sandboxes.map(s => [s.sandboxID, s]));
  for (const s of snaps) nodes.set(s.snapshotID, { id: s.snapshotID, kind: "snap", label: (s.names && s.names[0]) || short(s.snapshotID), title: s.snapshotID + " from sandbox " + s.sandboxID + ", " + bytes(s.sizeBytes), parent: s.parentID, kids: [] });
  for (const s of sandboxes) {
    const p = byID.get(s.parentSandboxID);
    const parent = p && (p.snapshotID || "") === (s.snapshotID || "") ? p.sandboxID : (s.snapshotID || s.parentSandboxID);
    nodes.set(s.sandboxID, { id: s.sandboxID, kind: "sbx", state: s.state, label: short(s.sandboxID), title: s.sandboxID + " (" + s.state + ")", parent, fork: s.parentSandboxID, kids: [] });
  }
  for (const n of nodes.values()) {
    if (n.parent && nodes.has(n.parent)) nodes.get(n.parent).kids.push(n);
    else n.parent = null;
  }
  return nodes;
}

function component(nodes, id) {
  let n = nodes.get(id);
  while (n && n.parent) n = nodes.get(n.parent);
  return n;
}

function drawForest(roots, nodes, here) {
  const BW = 92, BH = 24, XG = 14, YG = 46;
  let slot = 0;
  const place = (n, depth) => {
    n.depth = depth;
    if (!n.kids.length) { n.x = slot++; return; }
    n.kids.sort((a, b) => (a.kind > b.kind ? 1 : -1));
    n.kids.forEach(k => place(k, depth + 1));
    n.x = (n.kids[0].x + n.kids[n.kids.length - 1].x) / 2;
  };
  roots.forEach(r => place(r, 0));
  const all = [];
  const walk = n => { all.push(n); n.kids.forEach(walk); };
  roots.forEach(walk);
  const W = Math.max(1, slot) * (BW + XG) + XG, H = (Math.max(0, ...all.map(n => n.depth)) + 1) * (BH + YG);
  const cx = n => XG + n.x * (BW + XG) + BW / 2, cy = n => 10 + n.depth * (BH + YG);
  const svg = h("svg:svg", { width: W, height: H + 10, viewBox: `0 0 ${W} ${H + 10}`, role: "img", "aria-label": "snapshot tree" });
  for (const n of all) for (const k of n.kids) {
    svg.append(h("svg:path", { class: "edge" + (k.kind === "sbx" && k.fork === n.id ? " fork" : ""),
      d: `M${cx(n)} ${cy(n) + BH} C${cx(n)} ${cy(n) + BH + YG / 2} ${cx(k)} ${cy(k) - YG / 2} ${cx(k)} ${cy(k)}` }));
  }
  for (const n of all) {
    const g = h("svg:g", { class: [n.kind, n.state || "", n.id === here ? "here" : ""].join(" "), "data-id": n.id });
    g.append(h("svg:title", {}, n.title),
      h("svg:rect", { x: cx(n) - BW / 2, y: cy(n), width: BW, height: BH, rx: n.kind === "snap" ? 3 : 12 }),
      h("svg:text", { x: cx(n), y: cy(n) + 16, "text-anchor": "middle" }, (n.kind === "snap" ? "◆ " : "") + n.label.slice(0, 12)));
    if (n.kind === "sbx") g.addEventListener("click", () => { location.hash = "#/sandbox/" + n.id; });
    svg.append(g);
  }
  return h("div", { class: "graph" }, svg);
}

const legend = () => h("div", { class: "legend" }, h("span", {}, "◆ snapshot"), h("span", {}, "rounded: sandbox (its state came from the box above)"),
  h("span", {}, "dashed: fork"), h("span", {}, "two sandboxes under one snapshot, or a snapshot beside newer ones: rollbacks and creates from it"));

async function lineageCard(id) {
  const [snaps, sandboxes] = await Promise.all([api("/snapshots"), listSandboxes()]);
  const nodes = lineage(snaps, sandboxes);
  const root = component(nodes, id);
  if (!root || (!root.kids.length && root.id === id)) return card("Snapshot tree", h("p", { class: "muted" }, "No snapshots or forks yet."));
  return card("Snapshot tree", legend(), drawForest([root], nodes, id));
}

// ---- snapshots -----------------------------------------------------------

async function snapshotsPage(view) {
  const [snaps, sandboxes, usage] = await Promise.all([api("/snapshots"), listSandboxes(), api("/snapshots/usage")]);
  const nodes = lineage(snaps, sandboxes);
  const roots = [...nodes.values()].filter(n => !n.parent && (n.kind === "snap" || n.kids.length));
  view.append(h("h1", {}, "Snapshots"),
    card("Disk", h("p", {}, bytes(usage.totalBytes) + " in " + usage.count + " snapshots" + (usage.limitBytes ? " of a " + bytes(usage.limitBytes) + " cap" : "")),
      usage.limitBytes ? bar(usage.totalBytes / usage.limitBytes) : null),
    card("Tree", roots.length ? [legend(), drawForest(roots, nodes, "")] : h("p", { class: "muted" }, "No snapshots yet.")),
    card("All", table(["Snapshot", "Names", "From sandbox", "Parent", "Size", "Chunk store", { label: "Created", narrow: false }, ""],
      snaps.map(s => h("tr", {}, h("td", { class: "mono" }, s.snapshotID), h("td", {}, (s.names || []).join(", ")),
        h("td", { class: "mono" }, short(s.sandboxID)), h("td", { class: "mono" }, short(s.parentID || "")), h("td", {}, bytes(s.sizeBytes)),
        // uploading, uploaded (its manifest's root on hover) or failed (why on hover); "" without a store.
        h("td", { class: "upload", title: s.uploadError || s.storeRoot || "" }, s.uploadState || ""),
        h("td", { class: "hide-narrow" }, age(s.createdAt) + " ago"),
        h("td", {}, h("button", { type: "button", class: "danger", onclick: async () => {
          if (confirm("Delete snapshot " + s.snapshotID + "?")) { await api("/snapshots/" + encodeURIComponent(s.snapshotID), { method: "DELETE" }); route(); }
        } }, "Delete")))))));
}

// ---- templates -----------------------------------------------------------

async function templatesPage(view, [id, buildID]) {
  view.append(h("h1", {}, "Templates"));
  let list;
  try { list = await api("/templates"); } catch (e) {
    if (e.status !== 404 && e.status !== 405) throw e;
    // No templates API on this daemon: say what it has.
    const host = await api("/host");
    const names = new Set([...Object.keys(host.pool.ready || {}), ...Object.keys(host.templates || {}).filter(t => t !== "snapshot")]);
    view.append(card("Built-in templates", h("p", { class: "muted" }, "This daemon has no templates API (GET /templates answered " + e.status + "); these are the templates it serves:"),
      table(["Template", "Ready in pool", "Sandboxes"], [...names].sort().map(n => h("tr", {}, h("td", {}, n), h("td", {}, host.pool.ready[n] || 0),
        h("td", {}, Object.values(host.templates[n] || {}).reduce((a, b) => a + b, 0)))))));
    return;
  }
  if (id) return templatePage(view, id, buildID);
  view.append(card(null, table(["Template", "Names", "Status", "Resources", { label: "Updated", narrow: false }],
    (list || []).map(t => h("tr", { class: "click", onclick: () => { location.hash = "#/templates/" + encodeURIComponent(t.templateID); } },
      h("td", { class: "mono" }, t.templateID), h("td", {}, (t.names || t.aliases || []).join(", ")), h("td", {}, badge(t.buildStatus || t.status || "")),
      h("td", {}, (t.cpuCount || "?") + " CPU, " + (t.memoryMB || "?") + " MiB"), h("td", { class: "hide-narrow" }, t.updatedAt ? age(t.updatedAt) + " ago" : ""))))));
}

async function templatePage(view, id, buildID) {
  const t = await api("/templates/" + encodeURIComponent(id));
  const builds = t.builds || [];
  view.append(card(id, kv([["Names", (t.names || t.aliases || []).join(", ")], ["Created", t.createdAt], ["Spawned", t.spawnCount]]),
    table(["Build", "Status", "Created", "Finished"], builds.map(b => h("tr", { class: "click", onclick: () => { location.hash = "#/templates/" + encodeURIComponent(id) + "/" + encodeURIComponent(b.buildID); } },
      h("td", { class: "mono" }, b.buildID), h("td", {}, badge(b.status)), h("td", {}, b.createdAt || ""), h("td", {}, b.finishedAt || ""))))));
  const pick = buildID || (builds[0] && builds[0].buildID);
  if (!pick) return;
  const out = h("pre", { class: "out" });
  const status = h("span", {});
  view.append(card("Build " + pick + " logs", status, out));
  let offset = 0;
  every(2000, async () => {
    const st = await api("/templates/" + encodeURIComponent(id) + "/builds/" + encodeURIComponent(pick) + "/status?logsOffset=" + offset);
    status.replaceChildren(badge(st.status));
    const entries = st.logEntries && st.logEntries.length ? st.logEntries.map(e => (e.timestamp ? e.timestamp + " " : "") + e.message) : (st.logs || []);
    if (entries.length) { out.append(entries.join("\n") + "\n"); offset += entries.length; }
    if (st.status !== "building" && st.status !== "waiting") stopTimers();
  });
}

// ---- host ----------------------------------------------------------------

async function hostPage(view) {
  const box = h("div", {});
  view.append(h("h1", {}, "Host"), box);
  const clusterBox = h("div", {});
  view.append(clusterBox);
  every(3000, async () => {
    let x;
    try { x = await api("/host"); } catch (e) {
      if (e.status !== 404) throw e;
      // A cluster gateway: no one host's levels; its hosts are listed below.
      box.replaceChildren(h("p", { class: "muted" }, "This is a cluster gateway: its hosts are listed below."));
      return;
    }
    const c = x.capacity, p = x.pool, a = x.admission, s = x.snapshots;
    box.replaceChildren(h("div", { class: "grid" },
      card("Capacity", kv([
        ["CPUs", h("div", {}, x.allocated.cpus + " of " + c.cpus + " given to running sandboxes", bar(x.allocated.cpus / c.cpus))],
        ["Memory", h("div", {}, bytes(x.allocated.memoryBytes) + " given, " + bytes(c.memoryAvailableBytes) + " available of " + bytes(c.memoryBytes), bar(1 - c.memoryAvailableBytes / c.memoryBytes))],
        ["Disk", h("div", {}, bytes(c.diskFreeBytes) + " free of " + bytes(c.diskBytes), bar(1 - c.diskFreeBytes / c.diskBytes))],
        ["Sandboxes", x.sandboxes.running + " running, " + x.sandboxes.paused + " paused"]])),
      card("Pool", kv([
        ...Object.entries(p.ready).map(([t, n]) => ["Ready: " + t, h("div", {}, n + " of " + p.readyTarget, bar(n / (p.readyTarget || 1)))]),
        ["Shells", h("div", {}, p.shells + " of " + p.shellTarget, bar(p.shells / (p.shellTarget || 1)))],
        ["Standbys", p.standbysReady + " ready, " + (p.standbys - p.standbysReady) + " pending (at most " + p.standbyMax + ")"]])),
      card("Starts", kv([["Running", a.running + " of " + a.slots + " slots"], ["Waiting", a.waiting + " (503 past " + a.queueCapacity + ")"]])),
      card("Snapshots", kv([["Disk", bytes(s.bytes) + (s.capBytes ? " of " + bytes(s.capBytes) : "")], ["Count", s.count]]), s.capBytes ? bar(s.bytes / s.capBytes) : null)));
  });
  // In cluster mode the gateway lists its hosts and regions.
  try {
    const hosts = await api("/hosts");
    clusterBox.append(card("Hosts", table(["Host", "Region", "State", "Sandboxes"], (hosts || []).map(x => h("tr", {},
      h("td", { class: "mono" }, x.id || x.hostID || ""), h("td", {}, x.region || ""), h("td", {}, badge(x.state || "")), h("td", {}, x.sandboxes ?? ""))))));
  } catch (_) { /* a single daemon: no hosts to list */ }
}

// ---- start ---------------------------------------------------------------

document.getElementById("signin-form").addEventListener("submit", signIn);
document.getElementById("signout").addEventListener("click", () => signOut());
window.addEventListener("hashchange", route);
route();
