// fq broker web UI.
//
// Polls /stats.json once a second (as fqd's own UI does), with /frontends.json beside it,
// turns counter deltas into msg/s rates, keeps the last minute of each rate for the
// sparklines, and keeps one card per exchange, per queue, per upstream peer and per front
// end, updated in place so nothing jumps while you read it. No libraries: the broker
// serves this file and nothing else is fetched.
//
// Stable hooks for tests and scripts: every exchange card has data-exchange=<name>, every
// queue card data-queue=<name>, every upstream card data-peer=<host:port>,
// data-source=<source> and data-state=<state>, every front-end card data-frontend=<name>
// and data-transport=<main|tcp|tls|udp>; rates are elements with data-field="rate"
// (exchanges, upstreams), "rate-in"/"rate-out" (queues), each with the raw number in
// data-value; a front end's counters are elements with data-field=<counter> and the raw
// number in data-value, its connections the rows of its table; the fyrehose panel's
// numbers are elements with data-field=<name> (data-value: the raw number), its
// subscribers chips with data-remote and data-journaling; the OpenCluster panel's likewise
// (data-field="keys", "sets-rate", "gets-rate", "hit-ratio", "expired", ...).
(function () {
  "use strict";

  const INTERVAL_MS = 1000;
  const HISTORY = 60; // sparkline samples: one minute at one per second
  const SVG_NS = "http://www.w3.org/2000/svg";
  const SPARK_W = 240;
  const SPARK_H = 40;

  // --- formatting ---------------------------------------------------------------------

  const intFmt = new Intl.NumberFormat("en-US");
  const compactFmt = new Intl.NumberFormat("en-US", {
    notation: "compact",
    maximumFractionDigits: 1,
  });

  function fmtInt(n) {
    return n >= 1e7 ? compactFmt.format(n) : intFmt.format(n);
  }

  function fmtRate(r) {
    if (r === 0) return "0";
    if (r < 10) return r.toFixed(1);
    return r >= 1e5 ? compactFmt.format(r) : intFmt.format(Math.round(r));
  }

  function fmtBytes(n) {
    const units = ["B", "KiB", "MiB", "GiB", "TiB"];
    let i = 0;
    while (n >= 1024 && i < units.length - 1) {
      n /= 1024;
      i += 1;
    }
    return (i === 0 ? String(n) : n.toFixed(n < 10 ? 1 : 0)) + " " + units[i];
  }

  function fmtNs(ns) {
    if (ns < 1e3) return ns + " ns";
    if (ns < 1e6) return (ns / 1e3).toFixed(1) + " µs";
    return (ns / 1e6).toFixed(1) + " ms";
  }

  // fqd prints client counters and ports as strings; everything else is a number.
  const num = (v) => (typeof v === "number" ? v : Number(v) || 0);

  // --- DOM helpers ----------------------------------------------------------------------

  function h(tag, attrs, ...children) {
    const el = document.createElement(tag);
    for (const [key, value] of Object.entries(attrs || {})) {
      if (key === "text") el.textContent = value;
      else el.setAttribute(key, value);
    }
    el.append(...children);
    return el;
  }

  function setText(el, text) {
    if (el.textContent !== text) el.textContent = text;
  }

  function rateEl(field, cls) {
    const el = h("span", { class: cls, "data-field": field, "data-value": "0" });
    el.append(h("span", { class: "v", text: "0" }), " ", h("span", { class: "unit", text: "msg/s" }));
    return el;
  }

  function setRate(el, value, prefix) {
    el.dataset.value = String(value);
    setText(el.firstChild, (prefix || "") + fmtRate(value));
  }

  function stat(label) {
    const dd = h("dd", { text: "0" });
    return [h("div", {}, h("dt", { text: label }), dd), dd];
  }

  function spark(series) {
    const svg = document.createElementNS(SVG_NS, "svg");
    svg.setAttribute("class", "spark");
    svg.setAttribute("viewBox", `0 0 ${SPARK_W} ${SPARK_H}`);
    svg.setAttribute("preserveAspectRatio", "none");
    svg.setAttribute("aria-hidden", "true");
    addSparkPaths(svg, series);
    return svg;
  }

  // Each series is drawn as a filled area under a line; "in" and "out" have own colours.
  function addSparkPaths(svg, series) {
    for (const cls of series) {
      for (const part of ["area", "line"]) {
        const path = document.createElementNS(SVG_NS, "path");
        path.setAttribute("class", `${part} ${cls}`);
        svg.append(path);
      }
    }
  }

  // Draws each series (newest value last) right-aligned, on a shared scale.
  function drawSpark(svg, seriesList) {
    let max = 1;
    for (const s of seriesList) for (const v of s) if (v > max) max = v;
    const step = SPARK_W / (HISTORY - 1);
    const paths = svg.querySelectorAll("path");
    seriesList.forEach((values, i) => {
      const area = paths[2 * i];
      const line = paths[2 * i + 1];
      if (values.length === 0) {
        area.setAttribute("d", "");
        line.setAttribute("d", "");
        return;
      }
      const x0 = SPARK_W - (values.length - 1) * step;
      const pts = values.map((v, j) => {
        const x = (x0 + j * step).toFixed(1);
        const y = (SPARK_H - 2 - (v / max) * (SPARK_H - 6)).toFixed(1);
        return `${x},${y}`;
      });
      line.setAttribute("d", "M" + pts.join("L"));
      area.setAttribute("d", `M${x0.toFixed(1)},${SPARK_H}L${pts.join("L")}L${SPARK_W},${SPARK_H}Z`);
    });
  }

  // Keeps `container` showing one element per name, sorted, reusing existing elements.
  function syncCards(container, cards, entries, create, update) {
    const seen = new Set();
    entries.sort((a, b) => (a[0] < b[0] ? -1 : a[0] > b[0] ? 1 : 0));
    entries.forEach(([name, data], i) => {
      seen.add(name);
      let card = cards.get(name);
      if (!card) {
        card = create(name);
        cards.set(name, card);
      }
      update(card, data, name);
      if (container.children[i] !== card) container.insertBefore(card, container.children[i] || null);
    });
    for (const [name, card] of cards) {
      if (!seen.has(name)) {
        card.remove();
        cards.delete(name);
      }
    }
  }

  // --- rates ----------------------------------------------------------------------------

  // Counters of the previous poll by key, and the rate history of each key.
  let prevValues = new Map();
  let prevTime = 0;
  const history = new Map();

  function rates(values, now) {
    const dt = prevTime ? (now - prevTime) / 1000 : 0;
    const out = new Map();
    for (const [key, value] of values) {
      const before = prevValues.get(key);
      // A counter seen for the first time, or one that went down (a client left, the
      // broker restarted), has no meaningful rate this second.
      const r = dt > 0 && before !== undefined && value >= before ? (value - before) / dt : 0;
      out.set(key, r);
      let h = history.get(key);
      if (!h) history.set(key, (h = []));
      h.push(r);
      if (h.length > HISTORY) h.shift();
    }
    for (const key of history.keys()) if (!values.has(key)) history.delete(key);
    prevValues = values;
    prevTime = now;
    return out;
  }

  // --- exchanges ------------------------------------------------------------------------

  const exchangeCards = new Map();

  function createExchange(name) {
    const card = h("article", { class: "card exchange" });
    card.dataset.exchange = name;
    const f = {};
    f.rate = rateEl("rate", "rate");
    f.spark = spark(["in"]);
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
    const table = h(
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
        ),
      ),
      f.routes,
    );
    card.append(h("div", { class: "card-head" }, h("h3", { text: name, title: name }), f.rate), f.spark, stats, table);
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
    const rows = Object.values(ex.routes || {})
      .sort((a, b) => a.route_id - b.route_id)
      .map((rt) => {
        const program = h("td", { class: "code", text: rt.program });
        if (rt.permanent) program.append(h("span", { class: "tag", text: "permanent" }));
        return h(
          "tr",
          {},
          h("td", { class: "n muted", text: String(rt.route_id) }),
          program,
          h("td", { class: "code", text: rt.queue }),
          h("td", { class: "n", text: fmtInt(rt.invocations) }),
          h("td", { class: "n", text: rt.avg_ns ? fmtNs(rt.avg_ns) : "–" }),
        );
      });
    f.routes.replaceChildren(...rows);
  }

  // --- queues ---------------------------------------------------------------------------

  const queueCards = new Map();

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
    f.spark = spark(["in", "out"]);
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
      stats,
      f.clientTable,
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

    // backlog_limit is signed as fqd prints it: -1 (any negative) means unlimited.
    const limit = q.backlog_limit;
    const unlimited = limit < 0;
    const share = unlimited ? 0 : limit === 0 ? 1 : Math.min(1, q.backlog / limit);
    f.bar.classList.toggle("unlimited", unlimited);
    f.fill.style.width = (share * 100).toFixed(1) + "%";
    f.fill.className = "fill" + (share >= 0.9 ? " high" : share >= 0.5 ? " mid" : "");
    f.bar.setAttribute("aria-valuenow", String(q.backlog));
    f.barLabel.replaceChildren(
      h("strong", { text: fmtInt(q.backlog) }),
      " / " + (unlimited ? "∞" : fmtInt(limit)),
    );
    f.barLabel.dataset.backlog = String(q.backlog);

    setText(f.dropped_to, fmtInt(q.dropped_to));
    f.dropped_to.className = q.dropped_to ? "bad" : "";
    const clients = q.clients || [];
    setText(f.clients, String(clients.length));
    f.clientTable.hidden = clients.length === 0;
    f.clientRows.replaceChildren(
      ...clients.map((c) => {
        const key = clientKey(name, c);
        return h(
          "tr",
          {},
          h("td", { class: "code", text: c.user }),
          h("td", { class: "code muted", text: `${c.remote_addr}:${c.remote_port}` }),
          h("td", { class: "muted", text: c.mode || "unpaired" }),
          h("td", { class: "n", text: c.mode ? fmtInt(num(c.msgs_in)) : "–" }),
          h("td", { class: "n", text: c.mode ? fmtInt(num(c.msgs_out)) : "–" }),
          h("td", { class: "n", text: c.mode ? fmtRate(r.get(key) || 0) : "–" }),
          h("td", { class: "n", text: c.mode ? fmtBytes(num(c.octets_out)) : "–" }),
        );
      }),
    );
  }

  function clientKey(queue, c) {
    return `c:${queue}\u0000${c.remote_addr}:${c.remote_port}`;
  }

  // --- upstreams ------------------------------------------------------------------------

  // Peers this broker pulls from ("peers" in stats.json, only present when configured).
  // A link is one connection: host, port and source together (rows may share a host).
  const peerCards = new Map();
  const PEER_STATES = { connected: "ok", reconnecting: "warn" }; // anything else is grey

  function peerKey(p) {
    return `${p.host}:${p.port}\u0000${p.source}`;
  }

  function createPeer() {
    const card = h("article", { class: "card peer" });
    const f = {};
    f.title = h("h3");
    f.state = h("span", { class: "state" });
    f.rate = rateEl("rate", "rate");
    f.source = h("div", { class: "source" });
    f.spark = spark(["in"]);
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

  function renderPeers(peers, r) {
    const panel = document.getElementById("peers-panel");
    panel.hidden = peers.length === 0;
    syncCards(
      document.getElementById("peers"),
      peerCards,
      peers.map((p) => [peerKey(p), p]),
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
          h("td", { class: "code muted", text: `${c.remote_addr}:${c.remote_port}` }),
          ...facts.map((k) => h("td", { class: "code", text: c[k] === undefined ? "–" : String(c[k]) })),
        ),
      ),
    );
    f.more.hidden = conns.length <= MAX_ROWS;
    setText(f.more, `and ${fmtInt(conns.length - MAX_ROWS)} more`);
  }

  function renderFrontends(frontends) {
    const panel = document.getElementById("frontends-panel");
    panel.hidden = frontends === null;
    if (frontends === null) return; // a broker without /frontends.json
    // The table's order is the broker's: keep it (syncCards sorts by key).
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

  // --- topics ---------------------------------------------------------------------------

  // Retained topics ("topics" in stats.json, only on a broker that keeps them). The rate
  // is this page's, from the last offset between polls, as for exchanges and queues.
  const MAX_SUBSCRIBERS = 8;

  function subscriberChips(subs) {
    const shown = subs.slice(0, MAX_SUBSCRIBERS).map((s) => {
      const chip = h("span", {
        class: "sub-chip" + (s.behind > 0 ? " behind" : ""),
        title: `${s.remote}: sent up to offset ${s.offset}, ${s.behind} behind`,
        text: `${s.remote} · ${fmtInt(s.behind)}`,
      });
      chip.dataset.behind = String(s.behind);
      return chip;
    });
    if (subs.length > MAX_SUBSCRIBERS) shown.push(`and ${fmtInt(subs.length - MAX_SUBSCRIBERS)} more`);
    return shown.length ? shown : ["none"];
  }

  function renderTopics(topics, r) {
    const panel = document.getElementById("topics-panel");
    const entries = Object.entries(topics || {}).sort((a, b) => (a[0] < b[0] ? -1 : a[0] > b[0] ? 1 : 0));
    panel.hidden = entries.length === 0;
    if (entries.length === 0) return;
    document.getElementById("topic-rows").replaceChildren(
      ...entries.map(([name, t]) => {
        const rate = r.get("t:" + name) || 0;
        const subs = t.subscribers || [];
        const row = h(
          "tr",
          {},
          h("td", { class: "name", text: name, title: name }),
          h("td", { class: "n", "data-field": "size", text: fmtBytes(t.size_bytes) }),
          h("td", { class: "n", "data-field": "first", text: String(t.first_offset) }),
          h("td", { class: "n", "data-field": "last", text: String(t.last_offset) }),
          h("td", { class: "n", "data-field": "messages", text: fmtInt(t.messages) }),
          h("td", { class: "n rate", "data-field": "rate", "data-value": String(rate), text: fmtRate(rate) + "/s" }),
          h("td", { "data-field": "subscribers" }, ...subscriberChips(subs)),
        );
        row.dataset.topic = name;
        return row;
      }),
    );
    setText(document.getElementById("topic-count"), String(entries.length));
    const subs = entries.reduce((n, [, t]) => n + (t.subscribers || []).length, 0);
    const behind = entries.reduce((m, [, t]) => Math.max(m, ...(t.subscribers || []).map((s) => s.behind)), 0);
    const summary = document.getElementById("topic-summary");
    setText(summary, `${fmtInt(subs)} subscribers` + (behind ? `, up to ${fmtInt(behind)} behind` : ", all caught up"));
    summary.className = "summary " + (behind ? "warn" : "ok");
  }

  // --- fyrehose ---------------------------------------------------------------------------

  // The fyrehose backbone ("fyrehose" in stats.json, only while its listener runs): the
  // sequence and its rate, the retained window, recovery and drops, and the subscribers.
  function fyrehoseField(panel, field, value, text) {
    const el = panel.querySelector(`[data-field="${field}"]`);
    if (value !== null) el.dataset.value = String(value);
    setText(el, text);
    return el;
  }

  function fyrehoseChips(subs) {
    const shown = subs.slice(0, MAX_SUBSCRIBERS).map((s) => {
      const journal = s.journaling ? "journal" : "no journal";
      const chip = h("span", {
        class: "sub-chip" + (s.journaling ? "" : " nojournal"),
        title: `${s.remote}: ${journal}, subscribed for ${s.expires_in.toFixed(1)} s more without a KEEPALIVE`,
        text: `${s.remote} · ${journal}`,
      });
      chip.dataset.remote = s.remote;
      chip.dataset.journaling = String(s.journaling);
      return chip;
    });
    if (subs.length > MAX_SUBSCRIBERS) shown.push(`and ${fmtInt(subs.length - MAX_SUBSCRIBERS)} more`);
    return shown.length ? shown : ["no subscribers"];
  }

  function renderFyrehose(f, r) {
    const panel = document.getElementById("fyrehose-panel");
    panel.hidden = !f;
    if (!f) return;
    const rate = r.get("f:sequence") || 0;
    fyrehoseField(panel, "sequence", f.sequence, String(f.sequence));
    fyrehoseField(panel, "rate", rate, fmtRate(rate) + " msg/s");
    fyrehoseField(panel, "retained", f.retained_messages, fmtInt(f.retained_messages));
    fyrehoseField(
      panel,
      "range",
      null,
      f.first_retained ? `${f.first_retained}–${f.sequence} · ${fmtBytes(f.retained_bytes)}` : "empty",
    );
    fyrehoseField(panel, "pushed", f.pushed, fmtInt(f.pushed));
    fyrehoseField(panel, "delivered", f.delivered, fmtInt(f.delivered) + " delivered");
    fyrehoseField(panel, "requests", f.requests, fmtInt(f.requests));
    fyrehoseField(
      panel,
      "recovery",
      null,
      `${fmtInt(f.served)} served · ${fmtInt(f.forwarded)} forwarded · ${fmtInt(f.unserved)} unserved`,
    ).classList.toggle("warn", f.unserved > 0);
    const drops = Object.entries(f.dropped || {}).filter(([, n]) => n > 0);
    const total = drops.reduce((n, [, c]) => n + c, 0);
    fyrehoseField(panel, "dropped", total, fmtInt(total)).classList.toggle("nonzero", total > 0);
    fyrehoseField(panel, "drop-reasons", null, drops.length ? drops.map(([k, n]) => `${fmtInt(n)} ${k}`).join(" · ") : "none");
    const subs = f.subscribers || [];
    panel.querySelector('[data-field="subscribers"]').replaceChildren(...fyrehoseChips(subs));
    setText(document.getElementById("fyrehose-subscriber-count"), String(subs.length));
    const summary = document.getElementById("fyrehose-summary");
    const noun = subs.length === 1 ? "subscriber" : "subscribers";
    setText(summary, `${fmtInt(subs.length)} ${noun}` + (f.unserved ? `, ${fmtInt(f.unserved)} unserved` : ""));
    summary.className = "summary " + (f.unserved ? "warn" : "ok");
  }

  // --- opencluster ------------------------------------------------------------------------

  // The key/value store ("opencluster" in stats.json, only while its listener runs). The
  // rates are the broker's own (sets_per_second, gets_per_second: over its stats interval),
  // so the panel, /stats.json and a scrape agree.
  function renderOpenCluster(kv) {
    const panel = document.getElementById("opencluster-panel");
    panel.hidden = !kv;
    if (!kv) return;
    const field = fyrehoseField; // same hooks: data-field, raw number in data-value
    field(panel, "keys", kv.keys, fmtInt(kv.keys));
    field(panel, "bytes", kv.bytes, fmtBytes(kv.bytes));
    field(panel, "sets-rate", kv.sets_per_second, fmtRate(kv.sets_per_second) + "/s");
    field(panel, "sets", kv.sets, fmtInt(kv.sets) + " sets");
    field(panel, "gets-rate", kv.gets_per_second, fmtRate(kv.gets_per_second) + "/s");
    field(panel, "gets", kv.gets, fmtInt(kv.gets) + " gets");
    const answered = kv.hits + kv.misses;
    const ratio = answered ? kv.hits / answered : null;
    field(panel, "hit-ratio", ratio === null ? "" : ratio, ratio === null ? "–" : (100 * ratio).toFixed(1) + "%");
    const plural = (n, one, many) => `${fmtInt(n)} ${n === 1 ? one : many}`;
    field(panel, "hits", null, `${plural(kv.hits, "hit", "hits")} · ${plural(kv.misses, "miss", "misses")}`);
    field(panel, "expired", kv.expired, fmtInt(kv.expired));
    const failed = kv.failed_commits;
    field(
      panel,
      "commits",
      null,
      `${fmtInt(kv.commits)} commits` + (failed ? ` · ${fmtInt(failed)} failed` : ""),
    ).classList.toggle("warn", failed > 0);
    setText(document.getElementById("opencluster-key-count"), fmtInt(kv.keys));
    const summary = document.getElementById("opencluster-summary");
    setText(summary, failed ? `${fmtInt(failed)} failed commits` : `${fmtBytes(kv.bytes)} stored`);
    summary.className = "summary " + (failed ? "warn" : "ok");
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
      for (const c of q.clients || []) {
        const taken = num(c.msgs_out);
        out += taken;
        values.set(clientKey(name, c), taken);
      }
      values.set("qo:" + name, out);
      values.set("qi:" + name, out + q.backlog + q.dropped_to);
    }
    for (const p of stats.peers || []) values.set("p:" + peerKey(p), num(p.msgs_in));
    for (const [name, t] of Object.entries(stats.topics || {})) values.set("t:" + name, t.last_offset);
    if (stats.fyrehose) values.set("f:sequence", stats.fyrehose.sequence);
    return values;
  }

  function render(stats, r) {
    const agg = stats.exchanges._aggregate || {};
    setText(document.getElementById("version"), "v" + stats.version);
    const aggRate = document.getElementById("agg-rate");
    aggRate.dataset.value = String(r.get("a:messages"));
    setText(aggRate, fmtRate(r.get("a:messages")));
    drawSpark(document.getElementById("agg-spark"), [history.get("a:messages") || []]);
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

    const exchanges = Object.entries(stats.exchanges).filter(([name]) => name !== "_aggregate");
    syncCards(document.getElementById("exchanges"), exchangeCards, exchanges, createExchange, (card, ex, name) =>
      updateExchange(card, ex, name, r),
    );
    setText(document.getElementById("exchange-count"), String(exchanges.length));
    document.getElementById("exchanges-empty").hidden = exchanges.length > 0;

    const queues = Object.entries(stats.queues);
    syncCards(document.getElementById("queues"), queueCards, queues, createQueue, (card, q, name) =>
      updateQueue(card, q, name, r),
    );
    setText(document.getElementById("queue-count"), String(queues.length));
    document.getElementById("queues-empty").hidden = queues.length > 0;
    const clients = queues.reduce((n, [, q]) => n + (q.clients || []).length, 0);
    setText(document.getElementById("agg-clients"), fmtInt(clients));
    setText(document.getElementById("agg-queues"), queues.length + (queues.length === 1 ? " queue" : " queues"));

    renderPeers(stats.peers || [], r);
    renderTopics(stats.topics, r);
    renderFyrehose(stats.fyrehose, r);
    renderOpenCluster(stats.opencluster);

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
      render(stats, rates(counters(stats), performance.now()));
      renderFrontends(frontends && Array.isArray(frontends.frontends) ? frontends.frontends : null);
      setStatus("live", "live · " + new Date().toLocaleTimeString());
    } catch (err) {
      // Keep the last picture; the next poll may find the broker back.
      prevTime = 0;
      setStatus("down", "disconnected · retrying");
      document.getElementById("status").title = String(err);
      console.error(err);
    } finally {
      setTimeout(poll, Math.max(0, INTERVAL_MS - (performance.now() - started)));
    }
  }

  addSparkPaths(document.getElementById("agg-spark"), ["in"]);
  poll();
})();
