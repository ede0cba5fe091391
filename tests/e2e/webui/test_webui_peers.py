"""The web UI in headless Chromium: an upstream peer shows up with its link state, its
bindings and its received rate, and a lost upstream turns from connected to reconnecting.
Saves ``webui-peers*.png`` under the test artifacts (test_webui.py says where).
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

from fqbroker.server.broker import Broker
from fqbroker.settings.broker import Settings, Upstream
from tests.conftest import TIMEOUT, Session, open_session
from tests.e2e.webui.browser import Chromium, Page, require_chromium, screenshot, until
from tests.e2e.webui.test_webui import PEERS_PANEL_VISIBLE, drain, publish_steadily, stop_traffic

PEER_EXCHANGE = "ex"
PEER_SOURCE = "fqd-peerb//mem:backlog=-1"
NODE_B = "10.254.254.2"  # the fixture broker (A) is 10.254.254.1
NODE_C = "10.254.254.3"

# Reads an upstream card as a person would: by its address, then its badge and rate.
PEER_STATE = """
(() => {
  const card = [...document.querySelectorAll("[data-peer]")].find(e => e.dataset.peer === ADDRESS);
  if (!card) return null;
  const rate = card.querySelector('[data-field="rate"]');
  const badge = card.querySelector(".state");
  return {
    title: card.querySelector("h3").textContent,
    source: card.dataset.source,
    state: card.dataset.state,
    badge: badge.textContent,
    badgeColor: getComputedStyle(badge).color,
    rate: Number(rate.dataset.value),
    text: rate.textContent,
    bindings: [...card.querySelectorAll("tbody tr")].map(
      tr => [...tr.children].map(td => td.textContent)),
    panelVisible: PANEL,
    count: document.getElementById("peer-count").textContent,
  };
})()
""".replace("PANEL", PEERS_PANEL_VISIBLE.strip())


def peer_state(port: int) -> str:
    return PEER_STATE.replace("ADDRESS", json.dumps(f"127.0.0.1:{port}"))


def peer_settings(tmp_path: Path, name: str, node_id: str, upstreams: list[int]) -> Settings:
    state = tmp_path / name
    state.mkdir()
    return Settings(
        port=0,
        node_id=node_id,
        config_db=state / "fqd.sqlite",
        queue_dir=state / "queues",
        upstream=[
            Upstream(
                host="127.0.0.1",
                port=port,
                source=PEER_SOURCE,
                password="none",
                exchange=PEER_EXCHANGE.encode(),
                program=b"prefix:",
                permanent_binding=False,
            )
            for port in upstreams
        ],
    )


async def test_web_ui_shows_upstream_peers(broker: Broker, tmp_path: Path) -> None:
    """B pulls ``ex`` from A (the fixture) and from C. Traffic published on A moves B's
    received rate for A; stopping C turns its card from connected to reconnecting."""
    chromium = require_chromium()
    upstream_a = broker
    upstream_c = Broker(peer_settings(tmp_path, "c", NODE_C, []))
    await upstream_c.start()
    downstream = Broker(peer_settings(tmp_path, "b", NODE_B, [upstream_a.port, upstream_c.port]))
    await downstream.start()
    c_running = True
    sessions: list[Session] = []
    browser = await Chromium.launch(chromium, tmp_path / "profile", tmp_path / "chromium.log")
    stop = asyncio.Event()
    tasks: list[asyncio.Task[Any]] = []
    try:
        # On B, a reader of what the peering brings in, so its exchange and queue show too.
        consumer = await open_session(downstream.port, b"peer-reader", b"from-a\x00mem:public")
        sessions.append(consumer)
        await consumer.bind(PEER_EXCHANGE.encode(), b"prefix:")
        publisher = await open_session(upstream_a.port, b"publisher", b"publisher-q")
        sessions.append(publisher)
        async with asyncio.timeout(60):
            page = await Page.open(browser, f"http://127.0.0.1:{downstream.port}/")
            a_state, c_state = peer_state(upstream_a.port), peer_state(upstream_c.port)
            # Both links up, their bindings accepted upstream (a route id, not "pending").
            bound = "s.state === 'connected' && s.bindings.length && s.bindings[0][2] !== 'pending'"
            for expression in (a_state, c_state):
                await page.wait_for(until(expression, bound), timeout=TIMEOUT)
            before = await page.evaluate(a_state)
            assert before["panelVisible"] is True
            assert before["count"] == "2"
            assert before["title"] == f"127.0.0.1:{upstream_a.port}"
            assert before["source"] == PEER_SOURCE
            assert before["badge"] == "connected"
            assert before["bindings"] == [[PEER_EXCHANGE, "prefix:", "1"]]
            # A later poll, with the link there before it and still no traffic: rate zero.
            await page.rendered_polls(1)
            before = await page.evaluate(a_state)
            assert before["rate"] == 0 and before["text"] == "0 msg/s"

            tasks = [
                asyncio.create_task(publish_steadily(publisher, stop, PEER_EXCHANGE)),
                asyncio.create_task(drain(consumer)),
            ]
            after = await page.wait_for(until(a_state, "s.rate > 0"))
            assert after["text"] != before["text"]
            assert after["state"] == "connected"
            assert (await page.evaluate(c_state))["rate"] == 0  # nothing published on C

            # C goes away: B keeps retrying it, and its card says so in another colour.
            await upstream_c.stop()
            c_running = False
            lost = await page.wait_for(until(c_state, "s.state === 'reconnecting'"))
            assert lost["badge"] == "reconnecting"
            assert lost["badgeColor"] != after["badgeColor"]
            assert (await page.evaluate(a_state))["state"] == "connected"

            await page.rendered_polls(3)  # a few more points on the sparklines for the picture
            await screenshot(page, "webui-peers")
            assert page.errors() == []
    finally:
        await stop_traffic(stop, tasks, browser)
        for session in sessions:
            await session.close()
        async with asyncio.timeout(TIMEOUT):
            await downstream.stop()
            if c_running:
                await upstream_c.stop()
