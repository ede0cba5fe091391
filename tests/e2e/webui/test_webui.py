"""The web UI in headless Chromium: a queue appears, and its rate moves with traffic; the
front ends of the broker's table show with their connections; the panels of listeners that
are off, of upstream peers and of retained topics stay hidden while there are none.

Upstream peers are in test_webui_peers.py, retained topics in test_webui_topics.py, the
browser plumbing in browser.py (re-exported here for the other tests that drive Chromium).
The tests save screenshots, light and dark, under ``$FQ_TEST_ARTIFACTS`` (default
``var/test-artifacts``): ``webui*.png``. Without Chromium they skip, or fail with ``CI``
set (tests/prereqs.py); ``.ci/run`` installs Debian's package.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

from fqbroker.server.broker import Broker
from fqbroker.version import FQ_COMPAT_VERSION, __version__
from tests.conftest import Session, open_session
from tests.e2e.webui.browser import Chromium as Chromium
from tests.e2e.webui.browser import Page as Page
from tests.e2e.webui.browser import artifacts_dir as artifacts_dir
from tests.e2e.webui.browser import require_chromium as require_chromium
from tests.e2e.webui.browser import screenshot as screenshot
from tests.e2e.webui.browser import until as until

QUEUE = 'webui "live" ✓'
EXCHANGE = "webui"


# Reads the queue card the way a person would: by its name, then its displayed rates.
QUEUE_STATE = """
(() => {
  const name = NAME;
  const card = [...document.querySelectorAll("[data-queue]")].find(e => e.dataset.queue === name);
  if (!card) return null;
  const field = (f) => card.querySelector(`[data-field="${f}"]`);
  return {
    title: card.querySelector("h3").textContent,
    rateIn: Number(field("rate-in").dataset.value),
    textIn: field("rate-in").textContent,
    rateOut: Number(field("rate-out").dataset.value),
    textOut: field("rate-out").textContent,
    status: document.getElementById("status").dataset.state,
  };
})()
""".replace("NAME", json.dumps(QUEUE))


# Every front-end card as a person reads it: name, how it is reached, open connections,
# and its connections table.
FRONTENDS_STATE = """
(() => {
  if (document.getElementById("frontends-panel").hidden) return null;
  return [...document.querySelectorAll("[data-frontend]")].map(card => ({
    name: card.dataset.frontend,
    transport: card.dataset.transport,
    address: card.querySelector(".address").textContent,
    summary: card.querySelector(".summary").textContent,
    open: Number(card.querySelector('[data-field="open"]').dataset.value),
    heads: [...card.querySelectorAll("thead th")].map(th => th.textContent),
    rows: [...card.querySelectorAll("tbody tr")].map(
      tr => [...tr.children].map(td => td.textContent)),
  }));
})()
"""

# The header's version, once /node.json has come (the node panel shows then).
HEADER_VERSION = """
(() => {
  if (document.getElementById("node-panel").hidden) return null;
  const el = document.getElementById("version");
  return { text: el.textContent, title: el.title };
})()
"""

# The panels of upstream peers (test_webui_peers.py) and of retained topics
# (test_webui_topics.py), hidden while there are none.
PEERS_PANEL_VISIBLE = """
(() => {
  const panel = document.getElementById("peers-panel");
  return !panel.hidden && panel.getBoundingClientRect().height > 0;
})()
"""

TOPICS_PANEL_VISIBLE = """
(() => {
  const panel = document.getElementById("topics-panel");
  return !panel.hidden && panel.getBoundingClientRect().height > 0;
})()
"""


async def publish_steadily(
    publisher: Session, stop: asyncio.Event, exchange: str = EXCHANGE
) -> int:
    sent = 0
    while not stop.is_set():
        for _ in range(20):
            await publisher.publish(exchange.encode(), b"tick", b"payload %d" % sent)
            sent += 1
        await asyncio.sleep(0.05)
    return sent


async def drain(consumer: Session) -> None:
    while True:
        await consumer.receive(1)


async def stop_traffic(
    stop: asyncio.Event, tasks: list[asyncio.Task[Any]], browser: Chromium
) -> None:
    """End the test's traffic tasks and the browser, whatever state they are in."""
    stop.set()
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    await browser.close()


async def test_web_ui_shows_a_new_queue_and_its_live_rate(broker: Broker, tmp_path: Path) -> None:
    chromium = require_chromium()
    consumer = await open_session(broker.port, b"ui-reader", QUEUE.encode() + b"\x00mem:public")
    await consumer.bind(EXCHANGE.encode(), b"prefix:")
    publisher = await open_session(broker.port, b"ui-writer", b"ui-writer-q")
    browser = await Chromium.launch(chromium, tmp_path / "profile", tmp_path / "chromium.log")
    stop = asyncio.Event()
    tasks: list[asyncio.Task[Any]] = []
    try:
        async with asyncio.timeout(60):
            page = await Page.open(browser, f"http://127.0.0.1:{broker.port}/")
            before = await page.wait_for(QUEUE_STATE)
            assert before["title"] == QUEUE
            # A later poll, with the queue there before it and still no traffic: rate zero.
            await page.rendered_polls(1)
            before = await page.evaluate(QUEUE_STATE)
            assert before["status"] == "live"
            # No upstreams configured: no "peers" in stats.json, and no Upstreams panel.
            assert await page.evaluate(PEERS_PANEL_VISIBLE) is False
            assert await page.evaluate(TOPICS_PANEL_VISIBLE) is False  # nor topics
            assert before["rateIn"] == 0 and before["textIn"] == "in 0 msg/s"

            # The front ends of the table, in its order, each with its connections.
            fronts = await page.wait_for(
                f"(() => {{ const s = {FRONTENDS_STATE.strip()};"
                " return s && s.length && s[0].open >= 2 ? s : null; })()"
            )
            names = [f["name"] for f in fronts]
            # Plain names: what people call the protocols, nothing of where they came from.
            summaries = {f["name"]: f["summary"] for f in fronts}
            assert summaries["figg"].startswith("Figg: "), summaries
            assert summaries["opencluster"].startswith("OpenCluster: "), summaries
            assert summaries["fyrehose"].startswith("fyrehose: "), summaries
            assert not [s for s in summaries.values() if "seed" in s], summaries
            # The header names fqbroker's release, not the fq protocol's version.
            header = await page.wait_for(HEADER_VERSION)
            assert header == {
                "text": f"fqbroker {__version__}",
                "title": f"fq protocol {FQ_COMPAT_VERSION}",
            }
            assert names == [
                "fq-command",
                "fq-data",
                "http",
                "lumberjack",
                "figg",
                "fyrehose",
                "opencluster",
            ]
            off = fronts.pop()  # opencluster: a TCP port of its own, not configured
            assert (off["transport"], off["open"], off["rows"]) == ("tcp", 0, [])
            off = fronts.pop()  # a UDP port of its own, not configured
            assert (off["transport"], off["open"], off["rows"]) == ("udp", 0, [])
            for _ in range(2):
                off = fronts.pop()  # a port of its own, not configured
                assert (off["transport"], off["open"], off["rows"]) == ("tcp", 0, [])
            assert {f["transport"] for f in fronts} == {"main"}
            assert {f["address"] for f in fronts} == {f"127.0.0.1:{broker.port}"}
            command, data, _ = fronts
            assert command["heads"] == ["address", "user", "queue"]
            users = sorted(row[1] for row in command["rows"])
            assert users == ["ui-reader", "ui-writer"]
            assert sorted(row[2] for row in command["rows"]) == sorted([QUEUE, "ui-writer-q"])
            assert all(row[0].startswith("127.0.0.1:") for row in command["rows"])
            assert data["open"] == 2 and sorted(row[2] for row in data["rows"]) == [
                "ui-reader",
                "ui-writer",
            ]

            tasks = [
                asyncio.create_task(publish_steadily(publisher, stop)),
                asyncio.create_task(drain(consumer)),
            ]
            after = await page.wait_for(
                f"(() => {{ const s = {QUEUE_STATE.strip()};"
                " return s && s.rateIn > 0 && s.rateOut > 0 ? s : null; })()"
            )
            assert after["textIn"] != before["textIn"]
            assert after["textOut"] != before["textOut"]
            await page.rendered_polls(3)  # a few more points on the sparklines for the picture
            await screenshot(page, "webui")
            assert page.errors() == []
    finally:
        await stop_traffic(stop, tasks, browser)
        await consumer.close()
        await publisher.close()


# The panels of front ends on ports of their own that are off unless configured.
OPTIONAL_PANELS = ("fyrehose-panel", "opencluster-panel")


async def test_web_ui_hides_the_panels_of_listeners_that_are_off(
    broker: Broker, tmp_path: Path
) -> None:
    # Their stats keys are absent without the listener (tests/e2e/fyrehose/test_http.py and
    # tests/e2e/opencluster/test_http.py show the panels with it); so are their panels.
    chromium = require_chromium()
    browser = await Chromium.launch(chromium, tmp_path / "profile", tmp_path / "chromium.log")
    try:
        async with asyncio.timeout(60):
            page = await Page.open(browser, f"http://127.0.0.1:{broker.port}/")
            await page.wait_for(
                '(() => { const e = document.getElementById("status");'
                ' return e && e.dataset.state === "live"; })()'
            )
            await page.rendered_polls(1)
            for panel in OPTIONAL_PANELS:
                shown = await page.evaluate(
                    f'(() => {{ const p = document.getElementById("{panel}");'
                    " return !!p && !p.hidden && p.getBoundingClientRect().height > 0; })()"
                )
                assert shown is False, panel
            assert page.errors() == []
    finally:
        await browser.close()
