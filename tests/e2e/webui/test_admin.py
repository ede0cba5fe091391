"""The web UI as an operator uses it, in headless Chromium against a real broker: the node
overview with real values, charts with a scale and values on hover, an exchange left
without a binding marked as such, 1,000 queues filtered, sorted and paged, and the admin
actions: shown to an admin (purge, peek, delete, remove a binding, publish), hidden from
everyone else.

Chromium is driven as tests/e2e/webui/test_webui.py drives it (its harness is reused). Each test
saves a screenshot under its tmp dir (and, as the other UI tests, under the artifacts
directory); without Chromium they skip, or fail with ``CI`` set.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import dataclasses
import json
from pathlib import Path
from typing import Any

from fqbroker.clients.http.admin import AdminClient
from fqbroker.protocols.fq import wire
from fqbroker.settings.broker import Settings
from fqbroker.storage.configdb.users import Users
from fqbroker.version import __version__
from tests.conftest import NODE_ID, Session, open_session, running, wait_for
from tests.e2e.http.test_auth import bearer
from tests.e2e.http.test_http import get
from tests.e2e.webui.test_webui import Chromium, Page, artifacts_dir, require_chromium

ADMIN_TOKEN = "webui-admin-secret"


async def save_screenshot(page: Page, tmp_path: Path, name: str) -> Path:
    shot = await page.call("Page.captureScreenshot", {"format": "png"})
    png = base64.b64decode(shot["data"])
    assert png.startswith(b"\x89PNG\r\n\x1a\n")
    path = tmp_path / f"{name}.png"
    path.write_bytes(png)
    (artifacts_dir() / f"{name}.png").write_bytes(png)
    return path


async def unbind(session: Session, exchange: bytes, route_id: int) -> None:
    await session.cmd.send(wire.encode(wire.UnbindRequest(route_id, exchange)))
    reply = await session.cmd.reply()
    assert isinstance(reply, wire.UnbindResponse), reply


NODE_STATE = """
(() => {
  const panel = document.getElementById("node-panel");
  if (!panel || panel.hidden) return null;
  const f = (name) => panel.querySelector(`[data-field="${name}"]`);
  return {
    nodeId: f("node-id").textContent,
    version: f("version").dataset.value,
    fqVersion: f("fq-version").textContent,
    uptime: Number(f("uptime").dataset.value),
    uptimeText: f("uptime").textContent,
    rss: Number(f("rss").dataset.value),
    rssText: f("rss").textContent,
    disk: Number(f("disk").dataset.value),
    diskText: f("disk").textContent,
    listeners: [...panel.querySelectorAll(".listener[data-address]")].map(e => e.dataset.address),
    counts: f("counts").textContent,
  };
})()
"""


async def hover(page: Page, selector: str) -> dict[str, Any]:
    """Move the mouse over an element, 1 px from its right edge (a chart's latest second)."""
    box = await page.evaluate(
        f"(() => {{ const r = document.querySelector({json.dumps(selector)})"
        ".getBoundingClientRect(); return {x: r.x, y: r.y, w: r.width, h: r.height}; })()"
    )
    x, y = box["x"] + box["w"] - 1, box["y"] + box["h"] / 2
    await page.call("Input.dispatchMouseEvent", {"type": "mouseMoved", "x": x, "y": y})
    return dict(box)


async def test_node_overview_charts_and_unbound_exchanges(
    settings: Settings, tmp_path: Path
) -> None:
    chromium = require_chromium()
    async with running(settings) as broker:
        disk = await open_session(broker.port, b"ops", b"jobs\x00disk:permanent,backlog=-1")
        route_id = await disk.bind(b"jobs", b"prefix:")
        gone = await disk.bind(b"orphan", b"prefix:")
        publisher = await open_session(broker.port, b"ops-writer")
        for i in range(50):
            await publisher.publish(b"jobs", b"r", b"job %d " % i + b"x" * 200)
        await unbind(disk, b"orphan", gone)
        for _ in range(5):
            await publisher.publish(b"orphan", b"r", b"lost")
        await wait_for(lambda: broker.router.exchanges[b"orphan"].no_route == 5)
        assert route_id
        browser = await Chromium.launch(chromium, tmp_path / "profile", tmp_path / "chromium.log")
        stop = asyncio.Event()
        try:
            async with asyncio.timeout(60):
                page = await Page.open(browser, f"http://127.0.0.1:{broker.port}/")
                node = await page.wait_for(NODE_STATE)
                assert node["nodeId"] == NODE_ID
                assert node["version"] == __version__
                assert node["fqVersion"].startswith("fq ")
                assert node["uptime"] >= 0 and node["uptimeText"].endswith("s")
                assert node["rss"] > 10 << 20 and "MiB" in node["rssText"]
                assert node["disk"] > 50 * 200, node  # the disk queue's segment
                assert f"127.0.0.1:{broker.port}" in node["listeners"]
                # The disk queue and the publisher's own; the binding left on "jobs".
                assert node["counts"] == "2 queues · 2 exchanges · 1 binding"

                # The exchange whose only binding went: marked, its lost messages said.
                orphan = await page.wait_for(
                    """(() => { const c = document.querySelector('[data-exchange="orphan"]');
                      return c && { bound: c.dataset.bound,
                        unbound: c.classList.contains("unbound"),
                        note: c.querySelector(".note").textContent,
                        badge: !c.querySelector(".badge.unbound").hidden }; })()"""
                )
                assert orphan["bound"] == "false" and orphan["unbound"] and orphan["badge"]
                assert "5 messages reached no queue" in orphan["note"]
                jobs = await page.evaluate(
                    "document.querySelector('[data-exchange=\"jobs\"]').dataset.bound"
                )
                assert jobs == "true"
                summary = await page.evaluate(
                    "document.getElementById('exchange-summary').textContent"
                )
                assert summary == "1 without a binding"

                # Traffic, so the chart has a scale above 1 and values to show on hover.
                async def traffic() -> None:
                    n = 0
                    while not stop.is_set():
                        for _ in range(50):
                            await publisher.publish(b"jobs", b"r", b"tick %d" % n)
                            n += 1
                        await asyncio.sleep(0.05)

                task = asyncio.create_task(traffic())
                try:
                    await page.wait_for(
                        "Number(document.getElementById('agg-spark').dataset.max) > 1"
                    )
                    await hover(page, "#agg-spark")
                    tip = await page.wait_for(
                        """(() => { const t = document.querySelector('#agg-spark .chart-tip');
                          return !t.hidden && t.textContent.includes('msg/s') ? {
                            text: t.textContent,
                            scale: document.querySelector('#agg-spark .scale-max').textContent,
                          } : null; })()"""
                    )
                    assert tip["text"].startswith("now · published "), tip
                    rate = tip["text"].removeprefix("now · published ").split()[0]
                    assert float(rate.replace(",", "")) > 0, tip
                    assert tip["scale"].endswith("msg/s") and tip["scale"] != "1 msg/s"
                    shot = await save_screenshot(page, tmp_path, "webui-node")
                    assert shot.stat().st_size > 10_000
                finally:
                    stop.set()
                    await task
                assert page.errors() == []
        finally:
            await browser.close()
            await disk.close()
            await publisher.close()


# --- 1,000 queues ---------------------------------------------------------------------------

LIST_STATE = """
(() => {
  const tools = document.querySelector('.list-tools[data-list="queues"]');
  if (!tools || tools.hidden) return null;
  const range = tools.querySelector('[data-role="range"]');
  return {
    total: Number(range.dataset.total),
    matched: Number(range.dataset.matched),
    page: Number(range.dataset.page),
    pages: Number(range.dataset.pages),
    text: range.textContent,
    cards: [...document.querySelectorAll("#queues [data-queue]")].map(c => c.dataset.queue),
    prev: tools.querySelector('[data-role="prev"]').disabled,
    next: tools.querySelector('[data-role="next"]').disabled,
  };
})()
"""


def list_state_when(condition: str) -> str:
    return f"(() => {{ const s = {LIST_STATE.strip()}; return s && ({condition}) ? s : null; }})()"


async def click(page: Page, selector: str) -> None:
    found = await page.evaluate(
        f"(() => {{ const e = document.querySelector({json.dumps(selector)});"
        " if (!e) return false; e.click(); return true; })()"
    )
    assert found, selector


async def type_into(page: Page, selector: str, text: str) -> None:
    """Focus a field, clear it and type as a keyboard would (input events)."""
    await page.evaluate(
        f"(() => {{ const e = document.querySelector({json.dumps(selector)});"
        " e.focus(); e.select(); })()"
    )
    await page.call("Input.insertText", {"text": text})


async def test_a_thousand_queues_are_filtered_sorted_and_paged(
    settings: Settings, tmp_path: Path
) -> None:
    chromium = require_chromium()
    async with running(settings) as broker:
        client = AdminClient(f"http://127.0.0.1:{broker.port}")

        def create_all() -> None:
            for i in range(1000):
                client.post("queues/create", {"name": f"load-{i:04d}", "type": "mem"})
                # One exchange bound to them all: its card must stay readable too.
                client.post(
                    "bindings/add",
                    {"exchange": "fan", "program": 'prefix:"none."', "queue": f"load-{i:04d}"},
                )

        await asyncio.to_thread(create_all)
        assert sum(1 for name in broker.queues if name.startswith(b"load-")) == 1000
        # Seven messages waiting in one of them, to sort by.
        await asyncio.to_thread(
            client.post,
            "bindings/add",
            {"exchange": "load", "program": "prefix:", "queue": "load-0500"},
        )
        for i in range(7):
            await asyncio.to_thread(
                client.post, "publish", {"exchange": "load", "route": "r", "payload": f"m{i}"}
            )
        assert broker.queues[b"load-0500"].backlog == 7
        browser = await Chromium.launch(chromium, tmp_path / "profile", tmp_path / "chromium.log")
        try:
            async with asyncio.timeout(90):
                page = await Page.open(browser, f"http://127.0.0.1:{broker.port}/")
                first = await page.wait_for(list_state_when("s.total === 1000"))
                # One page is built, not a thousand cards.
                assert first["cards"] == [f"load-{i:04d}" for i in range(25)]
                assert first["text"] == "1\u201325 of 1,000" and first["pages"] == 40
                assert first["prev"] and not first["next"]
                fan = await page.wait_for(
                    """(() => { const c = document.querySelector('[data-exchange="fan"]');
                      return c && { rows: c.querySelectorAll("tbody tr").length,
                        more: c.querySelector("button.more").textContent }; })()"""
                )
                assert fan == {"rows": 50, "more": "and 950 more bindings"}
                # Each poll renders one page, so the page keeps its one-second pace.
                started = page.polls()
                await asyncio.sleep(3.2)
                assert page.polls() - started >= 3

                await type_into(page, '[data-list="queues"] [data-role="filter"]', "load-09")
                filtered = await page.wait_for(list_state_when("s.matched === 100"))
                assert filtered["text"] == "1\u201325 of 100 (of 1,000)"
                assert filtered["cards"][0] == "load-0900"
                for _ in range(3):
                    await click(page, '[data-list="queues"] [data-role="next"]')
                last = await page.wait_for(list_state_when("s.page === 4"))
                assert last["cards"] == [f"load-{i:04d}" for i in range(975, 1000)]
                assert last["text"] == "76\u2013100 of 100 (of 1,000)" and last["next"]
                await save_screenshot(page, tmp_path, "webui-1000-queues")

                await type_into(page, '[data-list="queues"] [data-role="filter"]', "")
                await page.evaluate(
                    """(() => { const s = document.querySelector(
                        '[data-list="queues"] [data-role="sort"]');
                      s.value = "backlog"; s.dispatchEvent(new Event("change")); })()"""
                )
                by_backlog = await page.wait_for(
                    list_state_when("s.matched === 1000 && s.cards[0] === 'load-0500'")
                )
                assert by_backlog["page"] == 1
                order = await page.evaluate(
                    'document.querySelector(\'[data-list="queues"] [data-role="order"]\')'
                    ".dataset.order"
                )
                assert order == "desc"
                await page.rendered_polls(1)
                assert page.errors() == []
        finally:
            await browser.close()


# --- admin actions ----------------------------------------------------------------------------

ADMIN_VIEW = """
(() => {
  const card = document.querySelector('[data-queue="work"]');
  if (!card) return null;
  const shown = (e) => !!e && e.getClientRects().length > 0;
  return {
    admin: document.body.dataset.admin,
    purge: shown(card.querySelector('[data-action="purge"]')),
    peek: shown(card.querySelector('[data-action="peek"]')),
    del: shown(card.querySelector('[data-action="delete"]')),
    unbind: shown(document.querySelector('[data-exchange="work-ex"] [data-action="unbind"]')),
    publish: shown(document.querySelector('[data-action="publish"]')),
    signin: shown(document.querySelector('[data-action="signin"]')),
    backlog: Number(card.querySelector(".bar-label").dataset.backlog),
  };
})()
"""


def admin_view_when(condition: str) -> str:
    return f"(() => {{ const s = {ADMIN_VIEW.strip()}; return s && ({condition}) ? s : null; }})()"


NOTICE = """(() => { const n = document.getElementById("admin-notice");
  return n.hidden ? null : {state: n.dataset.state, text: n.textContent}; })()"""


def notice_when(condition: str) -> str:
    return f"(() => {{ const s = {NOTICE}; return s && ({condition}) ? s : null; }})()"


async def confirm(page: Page, *, option: bool = False) -> None:
    await page.wait_for("document.getElementById('confirm-dialog').open")
    if option:
        await click(page, "#confirm-dialog input[name=option]")
    await click(page, '#confirm-dialog [data-role="ok"]')


async def test_an_admin_purges_peeks_publishes_unbinds_and_deletes_through_the_ui(
    settings: Settings, tmp_path: Path
) -> None:
    chromium = require_chromium()
    settings = dataclasses.replace(settings, admin_token=ADMIN_TOKEN)
    async with running(settings) as broker:
        # "work": 30 messages waiting, its consumer not reading (no data channel).
        worker = await open_session(broker.port, b"worker", b"work\x00mem:backlog=-1")
        await worker.data.close()
        await wait_for(lambda: broker.clients[worker.key].data is None)
        await worker.bind(b"work-ex", b"prefix:")
        publisher = await open_session(broker.port, b"pub")
        for i in range(30):
            await publisher.publish(b"work-ex", b"jobs.%d" % i, b"job %d" % i)
        await wait_for(lambda: broker.queues[b"work"].backlog == 30)
        # A transient queue with a client, to delete.
        scratch = await open_session(broker.port, b"tmp", b"scratch\x00mem:")
        browser = await Chromium.launch(chromium, tmp_path / "profile", tmp_path / "chromium.log")
        try:
            async with asyncio.timeout(90):
                page = await Page.open(browser, f"http://127.0.0.1:{broker.port}/")
                # Without credentials: no admin action shown, a sign-in offered, and the
                # API itself refuses (the UI hides; the broker decides).
                view = await page.wait_for(admin_view_when("s.signin && s.backlog === 30"))
                assert view["admin"] == "false"
                assert not any(view[k] for k in ("purge", "peek", "del", "unbind", "publish"))
                reply = await page.call(
                    "Runtime.evaluate",
                    {
                        "expression": "fetch('admin/status').then(r => r.status)",
                        "awaitPromise": True,
                        "returnByValue": True,
                    },
                )
                assert reply["result"]["value"] == 403

                # A wrong token: refused, still nothing shown.
                await click(page, '[data-action="signin"]')
                await type_into(page, "#signin-dialog input[name=token]", "wrong")
                await click(page, '#signin-dialog [data-role="ok"]')
                error = await page.wait_for(
                    "document.querySelector('#signin-dialog .error').textContent"
                )
                assert error.startswith("Refused"), error
                assert (await page.evaluate(ADMIN_VIEW))["admin"] == "false"
                # The admin token: the actions appear.
                await type_into(page, "#signin-dialog input[name=token]", ADMIN_TOKEN)
                await click(page, '#signin-dialog [data-role="ok"]')
                # Delete too, once /admin/queues said "work" is transient.
                view = await page.wait_for(admin_view_when("s.admin === 'true' && s.del"))
                assert view["purge"] and view["peek"] and view["unbind"] and view["publish"]
                assert not view["signin"]
                await page.wait_for("!document.getElementById('signin-dialog').open")

                # Peek: the next 20 of 30, in order, and nothing consumed.
                await click(page, '[data-queue="work"] [data-action="peek"]')
                rows = await page.wait_for(
                    """(() => { const d = document.getElementById("peek-dialog");
                      const rows = [...d.querySelectorAll("tbody tr")];
                      return d.open && rows.length ? rows.map(
                        r => [...r.children].map(td => td.textContent)) : null; })()"""
                )
                assert len(rows) == 20
                assert rows[0][1:4] == ["work-ex", "jobs.0", "pub"] and rows[0][5] == "job 0"
                assert rows[19][2] == "jobs.19"
                await save_screenshot(page, tmp_path, "webui-admin-peek")
                await click(page, '#peek-dialog button[value="close"]')
                assert broker.queues[b"work"].backlog == 30

                # Publish a test message through the dialog: one more in "work".
                await click(page, '[data-action="publish"]')
                await type_into(page, "#publish-dialog input[name=exchange]", "work-ex")
                await type_into(page, "#publish-dialog input[name=route]", "ui.test")
                await click(page, '#publish-dialog [data-role="ok"]')
                notice = await page.wait_for(notice_when("s.text.startsWith('published')"))
                assert notice == {"state": "ok", "text": "published to work-ex (ui.test)"}
                await wait_for(lambda: broker.queues[b"work"].backlog == 31)

                # Purge, confirmed: the backlog goes to 0, in the broker and on the page.
                await click(page, '[data-queue="work"] [data-action="purge"]')
                await confirm(page)
                notice = await page.wait_for(notice_when("s.text.startsWith('purged')"))
                assert notice == {"state": "ok", "text": "purged 31 messages from work"}
                assert broker.queues[b"work"].backlog == 0
                await page.wait_for(admin_view_when("s.backlog === 0"))
                await save_screenshot(page, tmp_path, "webui-admin-purged")

                # Remove the binding: the exchange stays, marked as having none.
                await click(page, '[data-exchange="work-ex"] [data-action="unbind"]')
                await confirm(page)
                await page.wait_for(
                    "document.querySelector('[data-exchange=\"work-ex\"]')"
                    ".dataset.bound === 'false'"
                )
                assert not broker.router.exchanges[b"work-ex"].bindings

                # Delete the transient queue that has a client: refused without force...
                await click(page, '[data-queue="scratch"] [data-action="delete"]')
                await confirm(page)
                notice = await page.wait_for(notice_when("s.state === 'error'"))
                assert "has 1 client" in notice["text"], notice
                assert b"scratch" in broker.queues
                # ...and done with it.
                await click(page, '[data-queue="scratch"] [data-action="delete"]')
                await confirm(page, option=True)
                await page.wait_for("!document.querySelector('[data-queue=\"scratch\"]')")
                assert b"scratch" not in broker.queues

                # Signing out hides the actions again.
                await click(page, '[data-action="signout"]')
                view = await page.wait_for(admin_view_when("s.admin === 'false'"))
                assert not any(view[k] for k in ("purge", "peek", "del", "unbind", "publish"))
                assert view["signin"]
                assert page.errors() == []
        finally:
            await browser.close()
            for s in (worker, publisher, scratch):
                with contextlib.suppress(Exception):
                    await s.close()


async def test_admin_actions_stay_hidden_for_a_user_who_is_not_an_admin(
    settings: Settings, tmp_path: Path
) -> None:
    chromium = require_chromium()
    settings = dataclasses.replace(settings, auth="password")
    users = Users(settings.config_db)
    users.add("viewer", "viewerpw")  # may log in, not an admin
    users.close()
    async with running(settings) as broker:
        browser = await Chromium.launch(chromium, tmp_path / "profile", tmp_path / "chromium.log")
        try:
            async with asyncio.timeout(60):
                page = await Page.open(browser, f"http://127.0.0.1:{broker.port}/")
                await page.wait_for(
                    "(() => { const b = document.querySelector('[data-action=\"signin\"]');"
                    " return b && !b.hidden; })()"
                )
                await click(page, '[data-action="signin"]')
                await type_into(page, "#signin-dialog input[name=user]", "viewer")
                await type_into(page, "#signin-dialog input[name=password]", "viewerpw")
                # Enter in the field submits, as a login form does.
                for kind in ("keyDown", "keyUp"):
                    await page.call(
                        "Input.dispatchKeyEvent",
                        {"type": kind, "key": "Enter", "code": "Enter", "text": "\r",
                         "windowsVirtualKeyCode": 13},
                    )  # fmt: skip
                error = await page.wait_for(
                    "document.querySelector('#signin-dialog .error').textContent"
                )
                assert error == "Refused: not an admin."
                hidden = await page.evaluate(
                    "[...document.querySelectorAll('.admin-only')]"
                    ".every(e => e.getClientRects().length === 0)"
                )
                assert hidden and await page.evaluate("document.body.dataset.admin") == "false"
                await save_screenshot(page, tmp_path, "webui-admin-refused")
                assert page.errors() == []
        finally:
            await browser.close()


# --- /node.json without a browser -----------------------------------------------------------


async def test_node_json_reports_the_node_and_is_guarded_like_stats_json(
    settings: Settings,
) -> None:
    settings = dataclasses.replace(
        settings, http_auth_reads=True, read_token="reader", admin_token=ADMIN_TOKEN
    )
    async with running(settings) as broker:
        session = await open_session(broker.port, b"u", b"dq\x00disk:permanent")
        try:
            await session.bind(b"x", b"prefix:")
            await session.publish(b"x", b"r", b"y" * 5000)
            await wait_for(lambda: broker.router.aggregate.routed == 1)
            refused, _ = await get(broker.port, "/node.json")
            assert refused.status_code == 401
            response, body = await get(broker.port, "/node.json", [bearer("reader")])
            assert response.status_code == 200
            node = json.loads(body)
        finally:
            await session.close()
    assert node["version"] == __version__ and node["node_id"] == NODE_ID
    assert node["uptime_seconds"] >= 0 and node["rss_bytes"] > 0
    assert node["queue_dir"] == str(settings.queue_dir)
    assert node["queue_dir_bytes"] >= 5000 and node["queue_dir_files"] >= 1
    assert node["disk_free_bytes"] > 0
    assert node["listeners"] == [
        {
            "name": "main",
            "address": f"127.0.0.1:{broker.port}",
            "front_ends": ["fq-command", "fq-data", "http"],
            "transport": "main",
        }
    ]
    assert [f["name"] for f in node["front_ends"]][:3] == ["fq-command", "fq-data", "http"]
    assert (node["queues"], node["exchanges"], node["bindings"], node["clients"]) == (1, 1, 1, 1)
    assert (node["admin_access"], node["reads_protected"]) == ("token", True)
    assert node["peers"] == []
