// Sparklines with a scale and values on hover. One sample a second, the last minute,
// newest on the right; every series of a chart shares one scale, whose top is labelled
// (the bottom is 0). Hovering shows a marker and, for that second, each series' value.
//
// Hooks: a chart is div.chart with data-max (the scale's top); while hovered, its
// .chart-tip is shown and names the second and the values ("12 s ago · in 340 msg/s").

import { fmtRate, h } from "./util.js";

export const HISTORY = 60; // samples: one minute at one per second
const SVG_NS = "http://www.w3.org/2000/svg";
const W = 240;
const H = 40;
const STEP = W / (HISTORY - 1);

function svgEl(tag, cls) {
  const el = document.createElementNS(SVG_NS, tag);
  if (cls) el.setAttribute("class", cls);
  return el;
}

// A "nice" top for the scale: 1, 2 or 5 times a power of ten, at least the largest value.
function niceMax(v) {
  if (v <= 1) return 1;
  const p = 10 ** Math.floor(Math.log10(v));
  for (const m of [1, 2, 5, 10]) if (v <= m * p) return m * p;
  return 10 * p;
}

// series: the class of each series ("in", "out"); labels: what the tip calls them.
export function spark(series, labels, unit = "msg/s") {
  const svg = svgEl("svg", "spark");
  svg.setAttribute("viewBox", `0 0 ${W} ${H}`);
  svg.setAttribute("preserveAspectRatio", "none");
  svg.setAttribute("aria-hidden", "true");
  svg.append(svgEl("line", "grid"));
  for (const cls of series) {
    svg.append(svgEl("path", `area ${cls}`), svgEl("path", `line ${cls}`));
  }
  const marker = svgEl("line", "marker");
  svg.append(marker);
  const top = h("span", { class: "scale scale-max", text: "1" });
  const tip = h("div", { class: "chart-tip", role: "tooltip" });
  tip.hidden = true;
  const chart = h("div", { class: "chart" }, svg, top, h("span", { class: "scale scale-time", text: "1 min" }), tip);
  chart.dataset.max = "1";
  chart.chart = { svg, marker, top, tip, unit, labels: labels || series, values: [], max: 1 };
  chart.addEventListener("pointermove", (e) => hover(chart, e));
  chart.addEventListener("pointerleave", () => {
    tip.hidden = true;
    marker.setAttribute("visibility", "hidden");
    chart.chart.hovered = null;
  });
  return chart;
}

// Draws each series (newest value last) right-aligned, on the shared scale.
export function drawSpark(chart, seriesList) {
  const c = chart.chart;
  let peak = 0;
  for (const s of seriesList) for (const v of s) if (v > peak) peak = v;
  const max = niceMax(peak);
  c.values = seriesList;
  c.max = max;
  chart.dataset.max = String(max);
  const label = fmtRate(max) + " " + c.unit;
  if (c.top.textContent !== label) c.top.textContent = label;
  const grid = c.svg.querySelector(".grid");
  grid.setAttribute("x1", "0");
  grid.setAttribute("x2", String(W));
  grid.setAttribute("y1", String(y(max / 2, max)));
  grid.setAttribute("y2", String(y(max / 2, max)));
  const paths = c.svg.querySelectorAll("path");
  seriesList.forEach((values, i) => {
    const area = paths[2 * i];
    const line = paths[2 * i + 1];
    if (values.length === 0) {
      area.setAttribute("d", "");
      line.setAttribute("d", "");
      return;
    }
    const x0 = W - (values.length - 1) * STEP;
    const pts = values.map((v, j) => `${(x0 + j * STEP).toFixed(1)},${y(v, max).toFixed(1)}`);
    line.setAttribute("d", "M" + pts.join("L"));
    area.setAttribute("d", `M${x0.toFixed(1)},${H}L${pts.join("L")}L${W},${H}Z`);
  });
  if (c.hovered) showTip(chart, c.hovered);
}

function y(v, max) {
  return H - 2 - (v / max) * (H - 6);
}

function hover(chart, e) {
  const rect = chart.chart.svg.getBoundingClientRect();
  if (!rect.width) return;
  // Seconds ago, from the pointer's distance to the right edge.
  const ago = Math.round(((rect.right - e.clientX) / rect.width) * (HISTORY - 1));
  chart.chart.hovered = { ago: Math.max(0, Math.min(HISTORY - 1, ago)), x: e.clientX - rect.left };
  showTip(chart, chart.chart.hovered);
}

function showTip(chart, { ago }) {
  const c = chart.chart;
  const parts = [];
  c.values.forEach((values, i) => {
    const j = values.length - 1 - ago;
    if (j >= 0) parts.push(`${c.labels[i]} ${fmtRate(values[j])}`);
  });
  const when = ago === 0 ? "now" : `${ago} s ago`;
  c.tip.textContent = parts.length ? `${when} · ${parts.join(" · ")} ${c.unit}` : `${when} · no data`;
  c.tip.dataset.ago = String(ago);
  c.tip.hidden = false;
  const x = W - ago * STEP;
  c.marker.setAttribute("x1", String(x));
  c.marker.setAttribute("x2", String(x));
  c.marker.setAttribute("y1", "0");
  c.marker.setAttribute("y2", String(H));
  c.marker.setAttribute("visibility", "visible");
  // The tip sits beside the marker, on the side with room.
  const left = (x / W) * 100;
  c.tip.style.left = left > 50 ? "" : `calc(${left}% + 8px)`;
  c.tip.style.right = left > 50 ? `calc(${100 - left}% + 8px)` : "";
}
