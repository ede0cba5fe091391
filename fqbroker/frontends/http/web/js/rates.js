// Counter deltas into per-second rates, and the last minute of each rate for the charts.

import { HISTORY } from "./charts.js";

// Counters of the previous poll by key, and the rate history of each key.
let prevValues = new Map();
let prevTime = 0;
export const history = new Map();

export function rates(values, now) {
  const dt = prevTime ? (now - prevTime) / 1000 : 0;
  const out = new Map();
  for (const [key, value] of values) {
    const before = prevValues.get(key);
    // A counter seen for the first time, or one that went down (a client left, the
    // broker restarted, a queue was purged), has no meaningful rate this second.
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

// After a failed poll: the next one has no interval to divide by.
export function resetRates() {
  prevTime = 0;
}
