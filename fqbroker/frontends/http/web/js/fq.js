// fq broker web UI.
//
// Polls /stats.json once a second (as fqd's own UI does), with /frontends.json beside it,
// turns counter deltas into msg/s rates, keeps the last minute of each rate for the
// charts, and keeps one card per exchange, per queue, per upstream peer and per front
// end, updated in place so nothing jumps while you read it. Exchanges and queues are
// filtered, sorted and paged (lists.js): only the page shown is built. /node.json gives
// the node overview (node.js); admins get actions on queues and bindings (admin.js). No
// libraries: the broker serves these files and nothing else is fetched.
//
// Stable hooks for tests and scripts: every exchange card has data-exchange=<name> and
// data-bound (false: no binding, its messages go nowhere), every queue card
// data-queue=<name>, every upstream card data-peer=<host:port>, data-source=<source> and
// data-state=<state>, every front-end card data-frontend=<name> and
// data-transport=<main|tcp|tls|udp>; rates are elements with data-field="rate"
// (exchanges, upstreams), "rate-in"/"rate-out" (queues), each with the raw number in
// data-value; a front end's counters are elements with data-field=<counter> and the raw
// number in data-value, its connections the rows of its table. The panels of what front
// ends count of their own (topics, fyrehose, OpenCluster, ...) and their hooks are
// described in ownpanels.js, the list tools in lists.js, the charts in charts.js, the
// node panel in node.js and the admin actions in admin.js.

import * as admin from "./admin.js";
import { drawSpark, spark } from "./charts.js";
import { ListView } from "./lists.js";
import { onNode, pollNode, tickUptime } from "./node.js";
import { panelCounters, renderPanels } from "./ownpanels.js";
import { peerKey, renderFrontends, renderPeers } from "./panels.js";
import { history, rates, resetRates } from "./rates.js";
import { fmtBytes, fmtInt, fmtNs, fmtRate, h, num, rateEl, setRate, setText, stat, syncCards } from "./util.js";

const INTERVAL_MS = 1000;
const MAX_ROWS = 50; // binding and client rows a card lists before "and N more"
let lastStats = null; // the latest stats.json and its rates: lists redraw from them at once
let lastRates = new Map();

// --- exchanges ------------------------------------------------------------------------

const exchangeCards = new Map();
const exchangeList = new ListView(
  "exchanges",
  [
    ["name", "name", ([name]) => name, "asc"],
    ["rate", "msg/s", ([name], r) => r.get("x:" + name) || 0, "desc"],
    ["messages", "messages", ([, ex]) => ex.messages, "desc"],
    ["no_route", "no route", ([, ex]) => ex.no_route, "desc"],
    ["bindings", "bindings", ([, ex]) => Object.keys(ex.routes || {}).length, "asc"],
  ],
  () => lastStats && renderExchanges(lastStats, lastRates),
);

function createExchange(name) {
  const card = h("article", { class: "card exchange" });
  card.dataset.exchange = name;
  const f = {};
  f.rate = rateEl("rate", "rate");
  f.unbound = h("span", { class: "badge unbound", text: "no binding" });
  f.spark = spark(["in"], ["in"]);
  const stats = h("dl", { class: "stats" });
  for (const [key, label] of [
    ["messages", "messages"],
    ["octets", "payload"],
    ["routed", "routed"],
    ["dropped", "dropped"],
    ["no_route", "no route"],
  ]) {
    const [wrap, dd] = stat(label);
    stats.append(wrap);
    f[key] = dd;
  }
  f.routes = h("tbody");
  f.table = h(
    "table",
    { class: "routes" },
    h(
      "thead",
      {},
      h(
        "tr",
        {},
        h("th", { class: "n", text: "id" }),
        h("th", { text: "program" }),
        h("th", { text: "queue" }),
        h("th", { class: "n", text: "invocations" }),
        h("th", { class: "n", text: "avg" }),
        h("th", { class: "n admin-only", text: "" }),
      ),
    ),
    f.routes,
  );
  f.note = h("p", { class: "note" });
  f.more = h("button", { type: "button", class: "ghost more" });
  f.more.addEventListener("click", () => {
    f.showAll = !f.showAll;
    f.rowsKey = null;
    if (lastStats) renderExchanges(lastStats, lastRates);
  });
  card.append(
    h("div", { class: "card-head" }, h("h3", { text: name, title: name }), f.unbound, f.rate),
    f.spark,
    stats,
    f.table,
    f.more,
    f.note,
  );
  card.fields = f;
  return card;
}

function updateExchange(card, ex, name, r) {
  const f = card.fields;
  setRate(f.rate, r.get("x:" + name));
  drawSpark(f.spark, [history.get("x:" + name) || []]);
  setText(f.messages, fmtInt(ex.messages));
  setText(f.octets, fmtBytes(ex.octets));
  setText(f.routed, fmtInt(ex.routed));
  setText(f.dropped, fmtInt(ex.dropped));
  setText(f.no_route, fmtInt(ex.no_route));
  f.dropped.className = ex.dropped ? "bad" : "";
  f.no_route.className = ex.no_route ? "warn" : "";
  const all = Object.values(ex.routes || {}).sort((a, b) => a.route_id - b.route_id);
  // An exchange bound to a thousand queues lists the first rows, the rest on request.
  const routes = f.showAll ? all : all.slice(0, MAX_ROWS);
  f.more.hidden = all.length <= MAX_ROWS;
  setText(f.more, f.showAll ? "show fewer" : `and ${fmtInt(all.length - MAX_ROWS)} more bindings`);
  // An exchange outlives its bindings (fq never deletes one): with none left, whatever
  // is published to it goes nowhere, which is worth seeing at a glance.
  const bound = all.length > 0;
  card.dataset.bound = String(bound);
  card.classList.toggle("unbound", !bound && ex.messages > 0);
  f.unbound.hidden = bound;
  f.unbound.title = "no binding: messages published here reach no queue";
  f.table.hidden = !bound;
  f.note.hidden = bound;
  setText(
    f.note,
    ex.messages
      ? `No binding: its ${fmtInt(ex.messages)} messages reached no queue (counted as no route).`
      : "No binding: nothing published here would reach a queue.",
  );
  // The rows are rebuilt only when the bindings change, so a button stays under the pointer.
  const rowsKey = JSON.stringify(routes.map((rt) => [rt.route_id, rt.program, rt.queue, rt.permanent]));
  if (f.rowsKey !== rowsKey) {
    f.rowsKey = rowsKey;
    f.cells = [];
    f.routes.replaceChildren(
      ...routes.map((rt) => {
        const program = h("td", { class: "code", text: rt.program });
        if (rt.permanent) program.append(h("span", { class: "tag", text: "permanent" }));
        const cells = [h("td", { class: "n" }), h("td", { class: "n" })];
        f.cells.push(cells);
        const row = h(
          "tr",
          {},
          h("td", { class: "n muted", text: String(rt.route_id) }),
          program,
          h("td", { class: "code", text: rt.queue }),
          ...cells,
          admin.routeAction(name, rt),
        );
        row.dataset.routeId = String(rt.route_id);
        return row;
      }),
    );
  }
  routes.forEach((rt, i) => {
    setText(f.cells[i][0], fmtInt(rt.invocations));
    setText(f.cells[i][1], rt.avg_ns ? fmtNs(rt.avg_ns) : "–");
  });
}

function renderExchanges(stats, r) {
  const exchanges = Object.entries(stats.exchanges).filter(([name]) => name !== "_aggregate");
  const shown = exchangeList.view(exchanges, r);
  syncCards(document.getElementById("exchanges"), exchangeCards, shown, createExchange, (card, ex, name) =>
    updateExchange(card, ex, name, r),
  );
  setText(document.getElementById("exchange-count"), String(exchanges.length));
  const unbound = exchanges.filter(([, ex]) => Object.keys(ex.routes || {}).length === 0).length;
  const summary = document.getElementById("exchange-summary");
  setText(summary, unbound ? `${fmtInt(unbound)} without a binding` : "");
  summary.className = "summary" + (unbound ? " warn" : "");
  document.getElementById("exchanges-empty").hidden = exchanges.length > 0;
}

// --- queues ---------------------------------------------------------------------------

const queueCards = new Map();
const queueList = new ListView(
  "queues",
  [
    ["name", "name", ([name]) => name, "asc"],
    ["backlog", "backlog", ([, q]) => q.backlog, "desc"],
    ["rate-in", "msg/s in", ([name], r) => r.get("qi:" + name) || 0, "desc"],
    ["rate-out", "msg/s out", ([name], r) => r.get("qo:" + name) || 0, "desc"],
    ["clients", "clients", ([, q]) => (q.clients || []).length, "desc"],
    ["dropped", "dropped", ([, q]) => q.dropped_to, "desc"],
  ],
  () => lastStats && renderQueues(lastStats, lastRates),
);

function createQueue(name) {
  const card = h("article", { class: "card queue" });
  card.dataset.queue = name;
  const f = {};
  f.badges = h("span", { class: "badges" });
  f.rateIn = rateEl("rate-in", "rate");
  f.rateOut = rateEl("rate-out", "rate out");
  f.fill = h("div", { class: "fill" });
  f.bar = h("div", { class: "bar", role: "meter" }, f.fill);
  f.barLabel = h("span", { class: "bar-label" });
  f.spark = spark(["in", "out"], ["in", "out"]);
  f.actions = admin.queueActions(name);
  const stats = h("dl", { class: "stats" });
  for (const [key, label] of [
    ["dropped_to", "dropped"],
    ["clients", "clients"],
  ]) {
    const [wrap, dd] = stat(label);
    stats.append(wrap);
    f[key] = dd;
  }
  f.clientRows = h("tbody");
  f.clientTable = h(
    "table",
    { class: "clients" },
    h(
      "thead",
      {},
      h(
        "tr",
        {},
        h("th", { text: "user" }),
        h("th", { text: "address" }),
        h("th", { text: "mode" }),
        h("th", { class: "n", text: "msgs in" }),
        h("th", { class: "n", text: "msgs out" }),
        h("th", { class: "n", text: "out msg/s" }),
        h("th", { class: "n", text: "octets out" }),
      ),
    ),
    f.clientRows,
  );
  card.append(
    h("div", { class: "card-head" }, h("h3", { text: name, title: name }), f.badges, f.rateIn, f.rateOut),
    h("div", { class: "backlog" }, f.bar, f.barLabel),
    f.spark,
    h("div", { class: "card-foot" }, stats, f.actions),
    f.clientTable,
    (f.moreClients = h("div", { class: "more" })),
  );
  card.fields = f;
  return card;
}

function updateQueue(card, q, name, r) {
  const f = card.fields;
  const badges = [q.type, q.private ? "private" : "public", q.policy];
  const badgeKey = badges.join(",");
  if (f.badgeKey !== badgeKey) {
    f.badges.replaceChildren(...badges.map((b) => h("span", { class: "badge " + b, text: b })));
    f.badgeKey = badgeKey;
  }
  setRate(f.rateIn, r.get("qi:" + name), "in ");
  setRate(f.rateOut, r.get("qo:" + name), "out ");
  drawSpark(f.spark, [history.get("qi:" + name) || [], history.get("qo:" + name) || []]);
  admin.updateQueueActions(f.actions, name);

  // backlog_limit is signed as fqd prints it: -1 (any negative) means unlimited.
  const limit = q.backlog_limit;
  const unlimited = limit < 0;
  const share = unlimited ? 0 : limit === 0 ? 1 : Math.min(1, q.backlog / limit);
  f.bar.classList.toggle("unlimited", unlimited);
  f.fill.style.width = (share * 100).toFixed(1) + "%";
  f.fill.className = "fill" + (share >= 0.9 ? " high" : share >= 0.5 ? " mid" : "");
  f.bar.setAttribute("aria-valuenow", String(q.backlog));
  f.barLabel.replaceChildren(h("strong", { text: fmtInt(q.backlog) }), " / " + (unlimited ? "∞" : fmtInt(limit)));
  f.barLabel.dataset.backlog = String(q.backlog);

  setText(f.dropped_to, fmtInt(q.dropped_to));
  f.dropped_to.className = q.dropped_to ? "bad" : "";
  const clients = q.clients || [];
  setText(f.clients, String(clients.length));
  f.clientTable.hidden = clients.length === 0;
  f.moreClients.hidden = clients.length <= MAX_ROWS;
  setText(f.moreClients, `and ${fmtInt(clients.length - MAX_ROWS)} more clients`);
  f.clientRows.replaceChildren(
    ...clients.slice(0, MAX_ROWS).map((c, i) => {
      const key = clientKey(name, c, i);
      return h(
        "tr",
        {},
        h("td", { class: "code", text: c.user }),
        h("td", { class: "code muted", text: address(c) }),
        h("td", { class: "muted", text: c.mode || "unpaired" }),
        h("td", { class: "n", text: c.mode ? fmtInt(num(c.msgs_in)) : "–" }),
        h("td", { class: "n", text: c.mode ? fmtInt(num(c.msgs_out)) : "–" }),
        h("td", { class: "n", text: c.mode ? fmtRate(r.get(key) || 0) : "–" }),
        h("td", { class: "n", text: c.mode ? fmtBytes(num(c.octets_out)) : "–" }),
      );
    }),
  );
}

// A broker that does not name clients to this reader (auth = "password", no login) sends
// "" for the address: such clients are told apart by their place in the list.
function clientKey(queue, c, i) {
  return c.remote_addr ? `c:${queue}\u0000${c.remote_addr}:${c.remote_port}` : `c:${queue}\u0000#${i}`;
}

function address(c) {
  return c.remote_addr ? `${c.remote_addr}:${c.remote_port}` : "–";
}

function renderQueues(stats, r) {
  const queues = Object.entries(stats.queues);
  const shown = queueList.view(queues, r);
  syncCards(document.getElementById("queues"), queueCards, shown, createQueue, (card, q, name) =>
    updateQueue(card, q, name, r),
  );
  setText(document.getElementById("queue-count"), String(queues.length));
  document.getElementById("queues-empty").hidden = queues.length > 0;
}

// --- one poll -------------------------------------------------------------------------

// Flattens the counters that get a rate into one map, so rates() treats them alike.
function counters(stats) {
  const values = new Map();
  const agg = stats.exchanges._aggregate || {};
  values.set("a:messages", agg.messages || 0);
  values.set("a:routed", agg.routed || 0);
  for (const [name, ex] of Object.entries(stats.exchanges)) {
    if (name !== "_aggregate") values.set("x:" + name, ex.messages);
  }
  for (const [name, q] of Object.entries(stats.queues)) {
    // stats.json has no per-queue message counter. Out is what its clients took; in
    // is out plus the change in backlog plus what it dropped.
    let out = 0;
    for (const [i, c] of (q.clients || []).entries()) {
      const taken = num(c.msgs_out);
      out += taken;
      values.set(clientKey(name, c, i), taken);
    }
    values.set("qo:" + name, out);
    values.set("qi:" + name, out + q.backlog + q.dropped_to);
  }
  for (const p of stats.peers || []) values.set("p:" + peerKey(p), num(p.msgs_in));
  return values;
}

function render(stats, r) {
  lastStats = stats;
  lastRates = r;
  const agg = stats.exchanges._aggregate || {};
  const aggRate = document.getElementById("agg-rate");
  aggRate.dataset.value = String(r.get("a:messages"));
  setText(aggRate, fmtRate(r.get("a:messages")));
  drawSpark(aggSpark, [history.get("a:messages") || []]);
  setText(document.getElementById("agg-messages"), fmtInt(agg.messages || 0));
  setText(document.getElementById("agg-octets"), fmtBytes(agg.octets || 0));
  setText(document.getElementById("agg-routed"), fmtInt(agg.routed || 0));
  setText(document.getElementById("agg-routed-rate"), fmtRate(r.get("a:routed")) + "/s");
  const dropped = document.getElementById("agg-dropped");
  setText(dropped, fmtInt(agg.dropped || 0));
  dropped.classList.toggle("nonzero", (agg.dropped || 0) > 0);
  setText(document.getElementById("agg-size-dropped"), fmtInt(agg.size_dropped || 0) + " too large");
  const noRoute = document.getElementById("agg-no-route");
  setText(noRoute, fmtInt(agg.no_route || 0));
  noRoute.classList.toggle("nonzero", (agg.no_route || 0) > 0);
  setText(document.getElementById("agg-no-exchange"), fmtInt(agg.no_exchange || 0) + " no exchange");

  renderExchanges(stats, r);
  renderQueues(stats, r);
  const queues = Object.values(stats.queues);
  const clients = queues.reduce((n, q) => n + (q.clients || []).length, 0);
  setText(document.getElementById("agg-clients"), fmtInt(clients));
  setText(document.getElementById("agg-queues"), fmtInt(queues.length) + (queues.length === 1 ? " queue" : " queues"));

  renderPeers(stats.peers || [], r);
  tickUptime();

  document.title = `fq · ${fmtRate(r.get("a:messages"))} msg/s`;
}

function setStatus(state, text) {
  const el = document.getElementById("status");
  el.dataset.state = state;
  setText(el, text);
}

async function poll() {
  const started = performance.now();
  try {
    // Both at once, rendered together: one poll is one picture.
    const [response, frontends] = await Promise.all([
      fetch("stats.json", { cache: "no-store" }),
      fetch("frontends.json", { cache: "no-store" })
        .then((r) => (r.ok ? r.json() : null))
        .catch(() => null),
    ]);
    if (!response.ok) throw new Error("HTTP " + response.status);
    const stats = await response.json();
    const list = frontends && Array.isArray(frontends.frontends) ? frontends.frontends : null;
    const values = counters(stats);
    panelCounters(list, values);
    const r = rates(values, performance.now());
    render(stats, r);
    renderFrontends(list);
    renderPanels(list, r);
    setStatus("live", "live · " + new Date().toLocaleTimeString());
  } catch (err) {
    // Keep the last picture; the next poll may find the broker back.
    resetRates();
    setStatus("down", "disconnected · retrying");
    document.getElementById("status").title = String(err);
    console.error(err);
  } finally {
    setTimeout(poll, Math.max(0, INTERVAL_MS - (performance.now() - started)));
  }
}

const aggSpark = spark(["in"], ["published"]);
aggSpark.id = "agg-spark";
aggSpark.classList.add("chart-wide");
document.getElementById("agg-spark-slot").replaceWith(aggSpark);
document.getElementById("exchanges-tools").replaceWith(exchangeList.el);
document.getElementById("queues-tools").replaceWith(queueList.el);
admin.setupAdmin();
admin.onChange(() => {
  clearTimeout(poll.soon);
  poll.soon = setTimeout(pollOnce, 150);
});
onNode(admin.nodeSeen);
poll();
pollNode();

// After an admin action: one extra poll, so the change shows at once.
async function pollOnce() {
  try {
    const response = await fetch("stats.json", { cache: "no-store" });
    if (response.ok) {
      const stats = await response.json();
      render(stats, lastRates);
    }
  } catch {
    // the regular poll reports it
  }
}
