// The panels of what front ends count of their own (retained topics, the fyrehose
// backbone, the OpenCluster key/value store, or any front end added later). Each
// /frontends.json entry of a front end that declares counters carries its "panel", and
// this draws any of them alike from that JSON, so a new front end needs no edit here.
// fqbroker/frontends/kit/panel.py describes the JSON:
//
//   panel  {id, title, hidden, count: {id, text}, summary: {text, state},
//           tiles: [tile], chips: chips, table: table}
//   tile   {label, warn, value: cell, sub: cell}
//   cell   {field, text, value, rate, suffix, class, title, chips}
//   text   "words" or ["words", {n: 3, f: "int"}, ...]
//   chips  {field, items: [{text, title, class, data}], empty}
//   table  {head: [{text, n}], key, rows: [{key, cells: [cell]}]}
//
// Hooks: a panel is <section id="<id>-panel" data-panel="<id>">, hidden while its front
// end has nothing to show; every cell with a field has data-field=<field> and, with a
// value, data-value=<raw number>; a cell with "rate" shows the per-second rate of that
// counter between polls (data-value: the rate); table rows have data-<key>=<row key>.

import { fmtBytes, fmtInt, fmtRate, h, setText } from "./util.js";

const MAX_CHIPS = 8; // chips shown before "and N more"
const panels = new Map(); // panel id -> its section and the elements updated each poll

const FORMATS = {
  int: fmtInt,
  bytes: fmtBytes,
  rate: fmtRate,
  percent: (v) => (100 * v).toFixed(1) + "%",
  plain: (v) => String(v),
  fixed1: (v) => v.toFixed(1),
};

export function text(t) {
  if (t === undefined || t === null) return "";
  if (typeof t === "string") return t;
  return t.map((part) => (typeof part === "string" ? part : (FORMATS[part.f] || String)(part.n))).join("");
}

function rateKey(panel, row, field) {
  return `o:${panel}\u0000${row}\u0000${field}`;
}

function eachRateCell(p, visit) {
  for (const t of p.tiles || []) {
    for (const c of [t.value, t.sub]) if (c && c.rate !== undefined) visit("", c);
  }
  for (const row of p.table ? p.table.rows : []) {
    for (const c of row.cells) if (c.rate !== undefined) visit(row.key, c);
  }
}

// Adds the counters whose rates the panels show to `values`, beside stats.json's, so one
// rates() call turns them all into rates.
export function panelCounters(frontends, values) {
  for (const fe of frontends || []) {
    const p = fe.panel;
    if (p && !p.hidden) eachRateCell(p, (row, c) => values.set(rateKey(p.id, row, c.field), c.rate));
  }
}

// Fills `el` with a cell: its text (or rate), its data-value and its classes.
function fill(el, cell, base, r, key) {
  let value = cell.value;
  let shown = text(cell.text);
  if (cell.rate !== undefined) {
    value = r.get(key) || 0;
    shown = fmtRate(value) + (cell.suffix || "");
  }
  if (value !== undefined) el.dataset.value = String(value);
  if (cell.field) el.dataset.field = cell.field;
  if (cell.title) el.title = cell.title;
  const className = [base, cell.class].filter(Boolean).join(" ");
  if (el.className !== className) el.className = className;
  if (cell.chips) el.replaceChildren(...chipsOf(cell.chips));
  else setText(el, shown);
}

function chipsOf(c) {
  const items = c.items || [];
  const shown = items.slice(0, MAX_CHIPS).map((item) => {
    const chip = h("span", {
      class: ["sub-chip", item.class].filter(Boolean).join(" "),
      title: text(item.title),
      text: text(item.text),
    });
    for (const [k, v] of Object.entries(item.data || {})) chip.dataset[k] = v;
    return chip;
  });
  if (items.length > MAX_CHIPS) shown.push(`and ${fmtInt(items.length - MAX_CHIPS)} more`);
  return shown.length ? shown : [c.empty || ""];
}

// What the section's elements are: a panel is built again only when this changes.
function layout(p) {
  return JSON.stringify([
    p.title,
    p.count ? p.count.id || "" : null,
    (p.tiles || []).map((t) => [t.label, !!t.warn, t.value.field, t.sub ? t.sub.field : null]),
    p.chips ? p.chips.field : null,
    p.table ? [p.table.key, p.table.head] : null,
  ]);
}

function placeholder(id) {
  const section = h("section", { class: "own-panel", id: id + "-panel" });
  section.dataset.panel = id;
  return section;
}

function build(p) {
  const section = placeholder(p.id);
  section.setAttribute("aria-labelledby", p.id + "-title");
  const f = { section, layout: layout(p), tiles: [] };
  f.count = h("span", { class: "count" });
  if (p.count && p.count.id) f.count.id = p.count.id;
  f.summary = h("span", { class: "summary", id: p.id + "-summary" });
  const title = h("h2", { id: p.id + "-title" }, p.title + " ", f.count, " ", f.summary);
  f.count.hidden = !p.count;
  section.append(title);
  if (p.tiles) {
    const tiles = h("div", { class: "own-tiles" });
    for (const t of p.tiles) {
      const value = h("div", { class: "value" });
      const sub = t.sub ? h("div", { class: "sub" }) : null;
      const label = h("div", { class: "label", text: t.label });
      tiles.append(h("div", { class: "tile" + (t.warn ? " warn" : "") }, label, value, ...(sub ? [sub] : [])));
      f.tiles.push([value, sub]);
    }
    section.append(tiles);
  }
  if (p.chips) {
    f.chips = h("div", { class: "own-chips", "data-field": p.chips.field });
    section.append(f.chips);
  }
  if (p.table) {
    f.rows = h("tbody");
    const head = h("tr", {}, ...p.table.head.map((c) => h("th", { class: c.n ? "n" : "", text: c.text })));
    const table = h("table", { class: "own-table" }, h("thead", {}, head), f.rows);
    section.append(h("div", { class: "card own-table-card" }, table));
  }
  return f;
}

function update(f, p, r) {
  if (p.count) setText(f.count, text(p.count.text));
  if (p.summary) {
    setText(f.summary, text(p.summary.text));
    f.summary.className = "summary " + (p.summary.state || "");
  }
  (p.tiles || []).forEach((t, i) => {
    const [value, sub] = f.tiles[i];
    fill(value, t.value, "value", r, rateKey(p.id, "", t.value.field));
    if (sub) fill(sub, t.sub, "sub", r, rateKey(p.id, "", t.sub.field));
  });
  if (p.chips) f.chips.replaceChildren(...chipsOf(p.chips));
  if (p.table) {
    const key = p.table.key;
    f.rows.replaceChildren(
      ...p.table.rows.map((row) => {
        const tr = h(
          "tr",
          {},
          ...row.cells.map((c) => {
            const td = h("td");
            fill(td, c, "", r, rateKey(p.id, row.key, c.field));
            return td;
          }),
        );
        tr.dataset[key] = row.key;
        return tr;
      }),
    );
  }
}

// Draws every front end's panel, in the broker's table order, in #own-panels.
export function renderPanels(frontends, r) {
  if (frontends === null) return; // no /frontends.json this poll: keep the last picture
  const container = document.getElementById("own-panels");
  const seen = new Set();
  let at = 0;
  for (const fe of frontends) {
    const p = fe.panel;
    if (!p) continue;
    seen.add(p.id);
    let f = panels.get(p.id);
    const wanted = p.hidden ? null : layout(p); // null: nothing to show, any layout will do
    if (f && wanted !== null && f.layout !== wanted) {
      f.section.remove();
      f = undefined;
    }
    if (!f) {
      f = wanted === null ? { section: placeholder(p.id), layout: null } : build(p);
      panels.set(p.id, f);
    }
    f.section.hidden = !!p.hidden;
    if (!p.hidden) update(f, p, r);
    if (container.children[at] !== f.section) {
      container.insertBefore(f.section, container.children[at] || null);
    }
    at += 1;
  }
  for (const [id, f] of panels) {
    if (!seen.has(id)) {
      f.section.remove();
      panels.delete(id);
    }
  }
}
