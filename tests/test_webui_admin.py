"""The web UI as an operator uses it, in headless Chromium against a real broker: the node
overview with real values, charts with a scale and values on hover, an exchange left
without a binding marked as such, 1,000 queues filtered, sorted and paged, and the admin
actions: shown to an admin (purge, peek, delete, remove a binding, publish), hidden from
everyone else.

Chromium is driven as tests/test_webui.py drives it (its harness is reused). Each test
saves a screenshot under its tmp dir (and, as the other UI tests, under the artifacts
directory); without Chromium they skip, or fail with ``CI`` set.
"""

from __future__ import annotations

import asyncio
import base64
import json
from pathlib import Path
from typing import Any

from fqbroker.config import Settings
from fqbroker.frontends.fq import wire
from fqbroker.version import __version__

from .conftest import NODE_ID, Session, open_session, running, wait_for
from .test_webui import Chromium, Page, artifacts_dir, require_chromium

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
