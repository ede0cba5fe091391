// Formatting and DOM helpers shared by every part of the web UI.

const intFmt = new Intl.NumberFormat("en-US");
const compactFmt = new Intl.NumberFormat("en-US", {
  notation: "compact",
  maximumFractionDigits: 1,
});

export function fmtInt(n) {
  return n >= 1e7 ? compactFmt.format(n) : intFmt.format(n);
}

export function fmtRate(r) {
  if (r === 0) return "0";
  if (r < 10) return r.toFixed(1);
  return r >= 1e5 ? compactFmt.format(r) : intFmt.format(Math.round(r));
}

export function fmtBytes(n) {
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let i = 0;
  while (n >= 1024 && i < units.length - 1) {
    n /= 1024;
    i += 1;
  }
  return (i === 0 ? String(n) : n.toFixed(n < 10 ? 1 : 0)) + " " + units[i];
}

export function fmtNs(ns) {
  if (ns < 1e3) return ns + " ns";
  if (ns < 1e6) return (ns / 1e3).toFixed(1) + " µs";
  return (ns / 1e6).toFixed(1) + " ms";
}

export function fmtDuration(seconds) {
  const s = Math.floor(seconds);
  const d = Math.floor(s / 86400);
  const hh = Math.floor((s % 86400) / 3600);
  const mm = Math.floor((s % 3600) / 60);
  const ss = s % 60;
  if (d) return `${d}d ${hh}h ${mm}m`;
  if (hh) return `${hh}h ${mm}m ${ss}s`;
  if (mm) return `${mm}m ${ss}s`;
  return `${ss}s`;
}

export function plural(n, one, many) {
  return `${fmtInt(n)} ${n === 1 ? one : many}`;
}

// fqd prints client counters and ports as strings; everything else is a number.
export const num = (v) => (typeof v === "number" ? v : Number(v) || 0);

// Names compare as the broker sends them (code units), as fqd lists them.
export const byName = (a, b) => (a[0] < b[0] ? -1 : a[0] > b[0] ? 1 : 0);

export function h(tag, attrs, ...children) {
  const el = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs || {})) {
    if (key === "text") el.textContent = value;
    else el.setAttribute(key, value);
  }
  el.append(...children);
  return el;
}

export function setText(el, text) {
  if (el.textContent !== text) el.textContent = text;
}

export function rateEl(field, cls) {
  const el = h("span", { class: cls, "data-field": field, "data-value": "0" });
  el.append(h("span", { class: "v", text: "0" }), " ", h("span", { class: "unit", text: "msg/s" }));
  return el;
}

export function setRate(el, value, prefix) {
  el.dataset.value = String(value);
  setText(el.firstChild, (prefix || "") + fmtRate(value));
}

export function stat(label) {
  const dd = h("dd", { text: "0" });
  return [h("div", {}, h("dt", { text: label }), dd), dd];
}

// Keeps `container` showing one element per key, in the order given, reusing elements.
export function syncCards(container, cards, entries, create, update) {
  const seen = new Set();
  entries.forEach(([key, data], i) => {
    seen.add(key);
    let card = cards.get(key);
    if (!card) {
      card = create(key);
      cards.set(key, card);
    }
    update(card, data, key);
    if (container.children[i] !== card) container.insertBefore(card, container.children[i] || null);
  });
  for (const [key, card] of cards) {
    if (!seen.has(key)) {
      card.remove();
      cards.delete(key);
    }
  }
}
