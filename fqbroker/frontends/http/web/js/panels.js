// The panels beside the exchange and queue lists: upstream peers and front ends. Each is
// hidden while its part of stats.json (or /frontends.json) is absent. What a front end
// counts of its own has a panel of its own (ownpanels.js).

import { drawSpark, spark } from "./charts.js";
import { history } from "./rates.js";
import { byName, fmtBytes, fmtInt, h, num, rateEl, setRate, setText, stat, syncCards } from "./util.js";

// --- upstreams ------------------------------------------------------------------------

// Peers this broker pulls from ("peers" in stats.json, only present when configured).
// A link is one connection: host, port and source together (rows may share a host).
const peerCards = new Map();
const PEER_STATES = { connected: "ok", reconnecting: "warn" }; // anything else is grey

export function peerKey(p) {
  return `${p.host}:${p.port}\u0000${p.source}`;
}

function createPeer() {
  const card = h("article", { class: "card peer" });
  const f = {};
  f.title = h("h3");
  f.state = h("span", { class: "state" });
  f.rate = rateEl("rate", "rate");
  f.source = h("div", { class: "source" });
  f.spark = spark(["in"], ["received"]);
  const stats = h("dl", { class: "stats" });
  for (const [key, label] of [
    ["msgs_in", "received"],
    ["octets_in", "bytes"],
    ["routed", "routed"],
    ["dropped", "dropped"],
    ["looped", "looped"],
    ["duplicates", "duplicates"],
    ["reconnects", "reconnects"],
  ]) {
    const [wrap, dd] = stat(label);
    stats.append(wrap);
    f[key] = dd;
  }
  f.bindings = h("tbody");
  const table = h(
    "table",
    { class: "bindings" },
    h(
      "thead",
      {},
      h(
        "tr",
        {},
        h("th", { text: "exchange" }),
        h("th", { text: "program" }),
        h("th", { class: "n", text: "route id" }),
      ),
    ),
    f.bindings,
  );
  card.append(h("div", { class: "card-head" }, f.title, f.state, f.rate), f.source, f.spark, stats, table);
  card.fields = f;
  return card;
}

function updatePeer(card, p, key, r) {
  const f = card.fields;
  const address = `${p.host}:${p.port}`;
  card.dataset.peer = address;
  card.dataset.source = p.source;
  card.dataset.state = p.state;
  setText(f.title, address);
  f.title.title = address;
  setText(f.state, p.state);
  f.state.className = "state " + (PEER_STATES[p.state] || "idle");
  setText(f.source, p.source);
  f.source.title = "logs in as " + p.source;
  setRate(f.rate, r.get("p:" + key) || 0);
  drawSpark(f.spark, [history.get("p:" + key) || []]);
  setText(f.msgs_in, fmtInt(num(p.msgs_in)));
  setText(f.octets_in, fmtBytes(num(p.octets_in)));
  setText(f.routed, fmtInt(num(p.routed)));
  setText(f.dropped, fmtInt(num(p.dropped)));
  setText(f.looped, fmtInt(num(p.looped)));
  setText(f.duplicates, fmtInt(num(p.duplicates)));
  setText(f.reconnects, fmtInt(num(p.reconnects)));
  f.dropped.className = num(p.dropped) ? "bad" : "";
  f.reconnects.className = num(p.reconnects) ? "warn" : "";
  const bindings = p.bindings || [];
  const rowsKey = JSON.stringify(bindings);
  if (f.rowsKey !== rowsKey) {
    f.rowsKey = rowsKey;
    f.bindings.replaceChildren(
      ...bindings.map((b) => {
        const program = h("td", { class: "code", text: b.program || "prefix:" });
        if (b.permanent) program.append(h("span", { class: "tag", text: "permanent" }));
        const route =
          b.route_id == null
            ? h("td", { class: "n warn", text: "pending", title: "not yet accepted upstream" })
            : h("td", { class: "n muted", text: String(b.route_id) });
        return h("tr", {}, h("td", { class: "code", text: b.exchange }), program, route);
      }),
    );
  }
}

export function renderPeers(peers, r) {
  const panel = document.getElementById("peers-panel");
  panel.hidden = peers.length === 0;
  syncCards(
    document.getElementById("peers"),
    peerCards,
    peers.map((p) => [peerKey(p), p]).sort(byName),
    createPeer,
    (card, p, key) => updatePeer(card, p, key, r),
  );
  setText(document.getElementById("peer-count"), String(peers.length));
  const up = peers.filter((p) => p.state === "connected").length;
  const summary = document.getElementById("peer-summary");
  setText(summary, up === peers.length ? "all connected" : `${up} of ${peers.length} connected`);
  summary.className = "summary " + (up === peers.length ? "ok" : "warn");
}

// --- front ends -----------------------------------------------------------------------

// Every front end of the broker's table alike: name, how it is reached, its counters,
// and a row per connection with whatever facts the front end gives for it.
const frontendCards = new Map();
const MAX_ROWS = 50; // connections listed per front end; the count says how many more
const FRONTEND_COUNTERS = [
  ["open", "open"],
  ["accepted", "accepted"],
  ["refused", "refused"],
  ["datagrams", "datagrams"],
  ["bytes_in", "bytes in"],
  ["bytes_out", "bytes out"],
];
const TRANSPORTS = { main: "main port", tcp: "tcp", tls: "tls", udp: "udp" };

function createFrontend(name) {
  const card = h("article", { class: "card frontend" });
  card.dataset.frontend = name;
  const f = {};
  f.transport = h("span", { class: "badge" });
  f.address = h("span", { class: "address" });
  f.summary = h("div", { class: "summary" });
  f.stats = h("dl", { class: "stats" });
  f.counters = {};
  for (const [key, label] of FRONTEND_COUNTERS) {
    const [wrap, dd] = stat(label);
    dd.dataset.field = key;
    dd.dataset.value = "0";
    f.counters[key] = [wrap, dd];
  }
  f.head = h("tr");
  f.rows = h("tbody");
  f.table = h("table", { class: "connections" }, h("thead", {}, f.head), f.rows);
  f.more = h("div", { class: "more" });
  card.append(
    h("div", { class: "card-head" }, h("h3", { text: name, title: name }), f.transport, f.address),
    f.summary,
    f.stats,
    f.table,
    f.more,
  );
  card.fields = f;
  return card;
}

function updateFrontend(card, fe) {
  const f = card.fields;
  card.dataset.transport = fe.transport;
  setText(f.transport, TRANSPORTS[fe.transport] || fe.transport);
  setText(f.address, fe.host == null ? "off" : `${fe.host}:${fe.port}`);
  setText(f.summary, fe.summary || "");
  // Only the counters this front end keeps: a missing one is not a zero.
  const shown = FRONTEND_COUNTERS.filter(([key]) => fe[key] !== undefined);
  f.stats.replaceChildren(...shown.map(([key]) => f.counters[key][0]));
  for (const [key] of shown) {
    const dd = f.counters[key][1];
    const value = num(fe[key]);
    dd.dataset.value = String(value);
    setText(dd, key.startsWith("bytes") ? fmtBytes(value) : fmtInt(value));
    dd.className = key === "refused" && value ? "warn" : "";
  }
  const conns = fe.connections || [];
  const facts = [];
  for (const c of conns.slice(0, MAX_ROWS)) {
    for (const key of Object.keys(c)) {
      if (key !== "remote_addr" && key !== "remote_port" && !facts.includes(key)) facts.push(key);
    }
  }
  const headKey = facts.join("\u0000");
  if (f.headKey !== headKey) {
    f.headKey = headKey;
    f.head.replaceChildren(h("th", { text: "address" }), ...facts.map((k) => h("th", { text: k })));
  }
  f.table.hidden = conns.length === 0;
  f.rows.replaceChildren(
    ...conns.slice(0, MAX_ROWS).map((c) =>
      h(
        "tr",
        {},
        // "" when the broker does not name clients to this reader (auth = "password").
        h("td", { class: "code muted", text: c.remote_addr ? `${c.remote_addr}:${c.remote_port}` : "–" }),
        ...facts.map((k) => h("td", { class: "code", text: c[k] === undefined ? "–" : String(c[k]) })),
      ),
    ),
  );
  f.more.hidden = conns.length <= MAX_ROWS;
  setText(f.more, `and ${fmtInt(conns.length - MAX_ROWS)} more`);
}

export function renderFrontends(frontends) {
  const panel = document.getElementById("frontends-panel");
  panel.hidden = frontends === null;
  if (frontends === null) return; // a broker without /frontends.json
  // The table's order is the broker's: keep it.
  syncCards(
    document.getElementById("frontends"),
    frontendCards,
    frontends.map((fe, i) => [String(i).padStart(4, "0") + fe.name, fe]),
    (key) => createFrontend(key.slice(4)),
    (card, fe) => updateFrontend(card, fe),
  );
  setText(document.getElementById("frontend-count"), String(frontends.length));
  const open = frontends.reduce((n, fe) => n + num(fe.open), 0);
  setText(document.getElementById("frontend-summary"), `${fmtInt(open)} connections open`);
}
