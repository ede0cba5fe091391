// Admin actions over the broker's /admin/ API: purge a queue, delete a transient queue,
// remove a binding, publish a test message, peek at a queue's next messages (read, not
// consumed). Shown only to an admin: when the broker guards nothing (no admin_token, no
// users), or once someone signed in with the admin token or an admin user and the API
// said yes. A 401 or 403 from any call hides them again.
//
// Hooks: <body data-admin="true|false">; elements of class admin-only are displayed only
// while it is true. Buttons carry data-action ("peek", "purge", "delete", "unbind",
// "publish", "signin", "signout"); dialogs are #confirm-dialog (button[data-role=ok]),
// #peek-dialog (rows tr[data-msgid]), #publish-dialog and #signin-dialog; the outcome of
// the last action is #admin-notice (data-state ok|error).

import { fmtBytes, h, setText } from "./util.js";

const STORE_KEY = "fq-admin-authorization";
let auth = sessionStorage.getItem(STORE_KEY) || ""; // an Authorization header value
let admin = false;
let access = null; // node.json's admin_access: "open", "token" or "users"
let readsProtected = false;
let permanent = new Map(); // queue name -> permanent, from /admin/queues
let probing = null;
let refresh = () => {};

export function isAdmin() {
  return admin;
}

// What to call after an action, so its effect shows without waiting for the next poll.
export function onChange(fn) {
  refresh = fn;
}

function setAdmin(on) {
  admin = on;
  document.body.dataset.admin = String(on);
  const open = access === "open";
  document.getElementById("admin-state").hidden = !on;
  document.getElementById("admin-state").title = open
    ? "admin actions on: this broker guards no admin path (no admin_token, no users)"
    : "signed in as an admin";
  document.querySelector('[data-action="signin"]').hidden = on || access === null || open;
  document.querySelector('[data-action="signout"]').hidden = !on || !auth;
}

async function api(path, body) {
  // With credentials of our own, the browser's are left out: a 401 to those then raises
  // no login prompt of the browser's (the fetch standard prompts only when it sent its own).
  // Same-origin only, and changes as JSON: what the broker takes from a browser
  // (docs/security.md, "Cross-site requests and the admin API").
  const init = {
    method: body === undefined ? "GET" : "POST",
    mode: "same-origin",
    cache: "no-store",
    headers: {},
    credentials: auth ? "omit" : "same-origin",
  };
  if (auth) init.headers.Authorization = auth;
  if (body !== undefined) {
    init.headers["Content-Type"] = "application/json";
    init.body = JSON.stringify(body);
  }
  let response;
  try {
    response = await fetch("admin/" + path, init);
  } catch (err) {
    return { ok: false, status: 0, data: { error: String(err) } };
  }
  let data = {};
  try {
    data = await response.json();
  } catch {
    data = { error: `HTTP ${response.status}` };
  }
  if (response.status === 401 || response.status === 403) setAdmin(false);
  return { ok: response.ok && data.status !== "error", status: response.status, data };
}

async function probe() {
  if (probing) return probing;
  probing = (async () => {
    const r = await api("status");
    if (!r.ok && auth && (r.status === 401 || r.status === 403)) {
      // Credentials that no longer work (a token changed, a user removed): forgotten, not
      // tried again at every poll (each failure would be logged, and answered later).
      auth = "";
      sessionStorage.removeItem(STORE_KEY);
    }
    setAdmin(r.ok);
    if (r.ok) await loadQueues();
    return r;
  })();
  try {
    return await probing;
  } finally {
    probing = null;
  }
}

async function loadQueues() {
  const r = await api("queues");
  if (r.ok && Array.isArray(r.data.queues)) {
    permanent = new Map(r.data.queues.map((q) => [q.name, !!q.permanent]));
  }
}

// Called with each /node.json: whether to ask the API who we are.
export function nodeSeen(node) {
  const changed = access !== node.admin_access;
  access = node.admin_access;
  readsProtected = node.reads_protected;
  // Without credentials of our own, only ask where asking cannot raise a browser login
  // prompt: nothing guarded, or the reads are guarded already (the browser has a login).
  if (admin) loadQueues();
  else if (changed || auth) {
    if (access === "open" || auth || readsProtected) probe();
  }
  setAdmin(admin);
}

function notice(ok, text) {
  const el = document.getElementById("admin-notice");
  el.dataset.state = ok ? "ok" : "error";
  el.hidden = false;
  setText(el, text);
  clearTimeout(notice.timer);
  notice.timer = setTimeout(() => (el.hidden = true), 8000);
}

function failure(r) {
  return (r.data && r.data.error) || `HTTP ${r.status}`;
}

// --- dialogs -------------------------------------------------------------------------------

function confirmDialog(title, text, option) {
  const dialog = document.getElementById("confirm-dialog");
  setText(dialog.querySelector("h3"), title);
  setText(dialog.querySelector("p"), text);
  const label = dialog.querySelector("label.option");
  const box = label.querySelector("input");
  label.hidden = !option;
  box.checked = false;
  if (option) setText(label.querySelector("span"), option);
  return new Promise((resolve) => {
    dialog.onclose = () => resolve(dialog.returnValue === "ok" ? { option: box.checked } : null);
    dialog.returnValue = "";
    dialog.showModal();
  });
}

function decodePayload(b64) {
  const bytes = Uint8Array.from(atob(b64), (c) => c.charCodeAt(0));
  try {
    return { text: new TextDecoder("utf-8", { fatal: true }).decode(bytes), binary: false };
  } catch {
    const hex = [...bytes.slice(0, 64)].map((b) => b.toString(16).padStart(2, "0")).join(" ");
    return { text: hex + (bytes.length > 64 ? " …" : ""), binary: true };
  }
}

async function peek(queue) {
  const r = await api(`queues/peek?name=${encodeURIComponent(queue)}&count=20`);
  if (!r.ok) return notice(false, `peek ${queue}: ${failure(r)}`);
  const dialog = document.getElementById("peek-dialog");
  const messages = r.data.messages || [];
  setText(dialog.querySelector("h3"), `Next messages of ${queue}`);
  setText(
    dialog.querySelector("p"),
    messages.length ? `${messages.length} shown, none consumed.` : "The queue is empty.",
  );
  dialog.querySelector("tbody").replaceChildren(
    ...messages.map((m, i) => {
      const payload = decodePayload(m.payload_base64 || "");
      const row = h(
        "tr",
        {},
        h("td", { class: "n muted", text: String(i + 1) }),
        h("td", { class: "code", text: m.exchange }),
        h("td", { class: "code", text: m.route }),
        h("td", { class: "code muted", text: m.sender }),
        h("td", { class: "n", text: fmtBytes(m.size) }),
        h("td", { class: "code payload" + (payload.binary ? " muted" : ""), text: payload.text }),
      );
      row.dataset.msgid = String(m.msgid);
      return row;
    }),
  );
  dialog.showModal();
}

async function purge(queue) {
  const ok = await confirmDialog("Purge queue", `Drop every message waiting in ${queue}? Its clients stay.`);
  if (!ok) return;
  const r = await api("queues/purge", { name: queue });
  notice(r.ok, r.ok ? `purged ${r.data.purged} messages from ${queue}` : `purge ${queue}: ${failure(r)}`);
  refresh();
}

async function remove(queue) {
  const ok = await confirmDialog(
    "Delete queue",
    `Delete the transient queue ${queue} and its bindings?`,
    "also when clients are attached (they are disconnected)",
  );
  if (!ok) return;
  const body = { name: queue };
  if (ok.option) body.force = true;
  const r = await api("queues/delete", body);
  notice(r.ok, r.ok ? `deleted ${queue}` : `delete ${queue}: ${failure(r)}`);
  refresh();
}

async function unbind(exchange, route) {
  const ok = await confirmDialog(
    "Remove binding",
    `Remove binding ${route.route_id} (${route.program || "prefix:"}) of ${exchange} into ${route.queue}?`,
  );
  if (!ok) return;
  const r = await api("bindings/remove", { exchange, program: route.program, queue: route.queue });
  notice(r.ok, r.ok ? `removed binding ${route.route_id} of ${exchange}` : `remove binding: ${failure(r)}`);
  refresh();
}

// --- the pieces other parts place -----------------------------------------------------------

function button(action, text, title, handler) {
  const b = h("button", { type: "button", class: "action", "data-action": action, title, text });
  b.addEventListener("click", handler);
  return b;
}

export function queueActions(name) {
  return h(
    "div",
    { class: "actions admin-only" },
    button("peek", "peek", "show the next messages without consuming them", () => peek(name)),
    button("purge", "purge", "drop every waiting message", () => purge(name)),
    button("delete", "delete", "delete this transient queue", () => remove(name)),
  );
}

// Delete is for transient queues only: permanent ones are shown without it.
export function updateQueueActions(actions, name) {
  actions.querySelector('[data-action="delete"]').hidden = permanent.get(name) !== false;
}

export function routeAction(exchange, route) {
  return h(
    "td",
    { class: "n admin-only" },
    button("unbind", "remove", "remove this binding", () => unbind(exchange, route)),
  );
}

// --- the header's controls ----------------------------------------------------------------

function utf8Base64(text) {
  return btoa(String.fromCharCode(...new TextEncoder().encode(text)));
}

function setupSignIn() {
  const dialog = document.getElementById("signin-dialog");
  const form = dialog.querySelector("form");
  document.querySelector('[data-action="signin"]').addEventListener("click", () => {
    setText(dialog.querySelector(".error"), "");
    dialog.showModal();
  });
  form.addEventListener("submit", async (e) => {
    e.preventDefault();
    const token = form.elements.token.value.trim();
    const user = form.elements.user.value;
    if (!token && !user) {
      setText(dialog.querySelector(".error"), "Give the admin token, or a user and password.");
      return;
    }
    auth = token ? "Bearer " + token : "Basic " + utf8Base64(`${user}:${form.elements.password.value}`);
    const r = await probe();
    if (r.ok) {
      sessionStorage.setItem(STORE_KEY, auth);
      form.reset();
      dialog.close();
      notice(true, "signed in: admin actions on");
    } else {
      auth = "";
      setAdmin(false);
      const why = r.status === 403 ? "not an admin" : r.status === 401 ? "wrong credentials" : failure(r);
      setText(dialog.querySelector(".error"), `Refused: ${why}.`);
    }
  });
  document.querySelector('[data-action="signout"]').addEventListener("click", () => {
    auth = "";
    sessionStorage.removeItem(STORE_KEY);
    setAdmin(false);
    if (access === "open") probe();
  });
}

function setupPublish() {
  const dialog = document.getElementById("publish-dialog");
  const form = dialog.querySelector("form");
  document.querySelector('[data-action="publish"]').addEventListener("click", () => dialog.showModal());
  form.addEventListener("submit", async (e) => {
    e.preventDefault();
    const body = {
      exchange: form.elements.exchange.value,
      route: form.elements.route.value,
      payload: form.elements.payload.value,
    };
    const r = await api("publish", body);
    if (r.ok) dialog.close();
    notice(r.ok, r.ok ? `published to ${body.exchange} (${body.route})` : `publish: ${failure(r)}`);
    refresh();
  });
}

export function setupAdmin() {
  // Cancel buttons that are not submit buttons, so Enter in a field submits the form.
  for (const b of document.querySelectorAll('dialog [data-role="cancel"]')) {
    b.addEventListener("click", () => b.closest("dialog").close());
  }
  setupSignIn();
  setupPublish();
  setAdmin(false);
}
