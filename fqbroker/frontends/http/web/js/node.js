// The node overview, from /node.json every few seconds: versions, node id, uptime (ticking
// between polls), memory, the queue directory's disk use, listeners and upstreams.
//
// Hooks: #node-panel; its numbers are elements with data-field=<name> ("node-id",
// "version", "uptime", "rss", "disk", ...) whose data-value holds the raw value;
// listeners are .listener chips with data-address, peers .peer-chip with data-state.

import { fmtBytes, fmtDuration, fmtInt, h, plural, setText } from "./util.js";

const NODE_INTERVAL_MS = 5000;
let last = null; // the latest /node.json, and when it came
let lastAt = 0;
const listeners = [];

// fn(node) is called with every /node.json (admin.js decides from it what to offer).
export function onNode(fn) {
  listeners.push(fn);
}

function field(name, value, text, title) {
  const el = document.querySelector(`#node-panel [data-field="${name}"]`);
  if (!el) return null;
  el.dataset.value = value === null || value === undefined ? "" : String(value);
  setText(el, text);
  if (title !== undefined) el.title = title;
  return el;
}

function render(node) {
  document.getElementById("node-panel").hidden = false;
  field("node-id", node.node_id, node.node_id, `${node.hostname} · pid ${node.pid}`);
  field("hostname", node.hostname, `${node.hostname} · pid ${node.pid}`);
  field("version", node.version, "fqbroker " + node.version, `Python ${node.python}`);
  field("fq-version", node.fq_version, "fq protocol " + node.fq_version);
  // The header names this broker's release; the fq protocol it speaks is its title.
  const header = document.getElementById("version");
  setText(header, "fqbroker " + node.version);
  header.title = "fq protocol " + node.fq_version;
  tickUptime();
  field("rss", node.rss_bytes, node.rss_bytes == null ? "–" : fmtBytes(node.rss_bytes));
  field(
    "budget",
    node.memory_budget_used,
    `${fmtBytes(node.memory_budget_used)} of ${fmtBytes(node.memory_budget_limit)} budget`,
  );
  field("disk", node.queue_dir_bytes, fmtBytes(node.queue_dir_bytes), node.queue_dir);
  const free = node.disk_free_bytes == null ? "" : ` · ${fmtBytes(node.disk_free_bytes)} free`;
  field("disk-files", node.queue_dir_files, plural(node.queue_dir_files, "file", "files") + free, node.queue_dir);
  field(
    "counts",
    node.queues,
    [plural(node.queues, "queue", "queues"), plural(node.exchanges, "exchange", "exchanges"), plural(node.bindings, "binding", "bindings")].join(" · "),
  );
  field("clients", node.clients, `${plural(node.clients, "client", "clients")} · auth ${node.auth}`);
  const chips = (node.listeners || []).map((l) => {
    const chip = h(
      "span",
      { class: "listener", title: (l.front_ends || []).join(", ") },
      h("strong", { text: l.name }),
      " " + l.address,
    );
    chip.dataset.address = l.address;
    chip.dataset.name = l.name;
    return chip;
  });
  const off = (node.front_ends || []).filter((f) => f.address === null).map((f) => f.name);
  if (off.length) chips.push(h("span", { class: "listener off", text: "off: " + off.join(", ") }));
  document.querySelector('#node-panel [data-field="listeners"]').replaceChildren(...chips);
  const peers = (node.peers || []).map((p) => {
    const chip = h("span", {
      class: "peer-chip " + (p.state === "connected" ? "ok" : "warn"),
      text: `${p.host}:${p.port} · ${p.state}`,
      title: `${p.source} · ${(p.exchanges || []).join(", ")}`,
    });
    chip.dataset.state = p.state;
    return chip;
  });
  document.querySelector('#node-panel [data-field="peers"]').replaceChildren(...(peers.length ? peers : ["none"]));
  renderDiskAlarm(node.disk_alarm);
}

// The disk alarm: a banner while a file system the broker writes to is below
// disk_free_limit, naming it (when the reader may see paths) and its free space.
function renderDiskAlarm(alarm) {
  const banner = document.getElementById("disk-alarm");
  if (!banner) return;
  const raised = Boolean(alarm && alarm.raised);
  banner.hidden = !raised;
  banner.dataset.raised = raised ? "1" : "0";
  if (!raised) return;
  const low = (alarm.filesystems || []).filter((fs) => fs.alarm);
  const where = low
    .map((fs) => `${fs.path || "a file system"}: ${fmtBytes(fs.free_bytes)} free, limit ${fmtBytes(fs.limit_bytes)}`)
    .join("; ");
  setText(
    banner,
    `Disk alarm: free space below disk_free_limit${where ? " (" + where + ")" : ""}. ` +
      "Publishers into disk queues and topics are refused or held back until it clears.",
  );
}

// The uptime moves every second, from the last answer and the time since it came.
export function tickUptime() {
  if (!last) return;
  const up = last.uptime_seconds + (performance.now() - lastAt) / 1000;
  field("uptime", Math.floor(up), fmtDuration(up), `up since ${new Date(Date.now() - up * 1000).toLocaleString()}`);
}

export async function pollNode() {
  try {
    const response = await fetch("node.json", { cache: "no-store" });
    if (!response.ok) throw new Error("HTTP " + response.status);
    last = await response.json();
    lastAt = performance.now();
    render(last);
    for (const fn of listeners) fn(last);
  } catch (err) {
    console.warn("node.json:", err); // an older broker has none: the panel stays hidden
  } finally {
    setTimeout(pollNode, NODE_INTERVAL_MS);
  }
}
