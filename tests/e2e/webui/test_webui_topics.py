"""The web UI in headless Chromium: a retained topic shows with its offsets, its rate and
its subscribers, each with how far behind it is. Saves ``webui-topics*.png`` under the
test artifacts (test_webui.py says where).
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

from fqbroker.frontends.figg.settings import Figg
from fqbroker.protocols.figg.wire import Attach, Attached
from fqbroker.server.broker import Broker
from fqbroker.settings.broker import Settings
from tests.conftest import open_session, running
from tests.e2e.figg.test_figg import conn as figg_conn
from tests.e2e.webui.browser import Chromium, Page, require_chromium, screenshot, until
from tests.e2e.webui.test_webui import TOPICS_PANEL_VISIBLE, stop_traffic

TOPIC = "ui.topic"

# The topics table as a person reads it: one row per topic, its cells, and the chips of
# its subscribers with how far behind each is.
TOPIC_STATE = """
(() => {
  const row = [...document.querySelectorAll("[data-topic]")].find(e => e.dataset.topic === NAME);
  if (!row) return null;
  const cell = (f) => row.querySelector(`[data-field="${f}"]`);
  return {
    cells: [...row.children].map(td => td.textContent),
    rate: Number(cell("rate").dataset.value),
    last: Number(cell("last").textContent),
    chips: [...cell("subscribers").querySelectorAll(".sub-chip")].map(
      c => [c.textContent, Number(c.dataset.behind), c.classList.contains("behind")]),
    panelVisible: PANEL,
    count: document.getElementById("topic-count").textContent,
  };
})()
""".replace("NAME", json.dumps(TOPIC)).replace("PANEL", TOPICS_PANEL_VISIBLE.strip())


class Reader:
    """A subscriber as a Figg session registers it in ``Topic.subscribers``."""

    def __init__(self, remote: str, offset: int) -> None:
        self.remote, self.offset = remote, offset


async def test_web_ui_shows_topics(settings: Settings, tmp_path: Path) -> None:
    chromium = require_chromium()
    figg = settings.with_sections(Figg(listen="127.0.0.1:0"))
    async with running(figg) as broker:
        publisher = await open_session(broker.port, b"topic-writer", b"topic-writer-q")
        browser = await Chromium.launch(chromium, tmp_path / "profile", tmp_path / "chromium.log")
        stop = asyncio.Event()
        tasks: list[asyncio.Task[Any]] = []
        try:
            async with asyncio.timeout(60):
                page = await Page.open(browser, f"http://127.0.0.1:{broker.port}/")
                await page.wait_for(
                    '(() => { const e = document.getElementById("status");'
                    ' return e && e.dataset.state === "live"; })()'
                )
                # Topics configured but none yet: no panel.
                assert await page.evaluate(TOPICS_PANEL_VISIBLE) is False

                async def publish_to_topic() -> None:
                    sent = 0
                    while not stop.is_set():
                        for _ in range(20):
                            await publisher.publish(b"figg", TOPIC.encode(), b"event %d" % sent)
                            sent += 1
                        await asyncio.sleep(0.05)

                tasks = [asyncio.create_task(publish_to_topic())]
                moving = await page.wait_for(until(TOPIC_STATE, "s.rate > 0 && s.last > 0"))
                assert moving["panelVisible"] is True and moving["count"] == "1"
                assert moving["cells"][0] == TOPIC and moving["cells"][2] == "0"  # first offset
                assert moving["chips"] == []  # no subscribers: "none"
                assert moving["cells"][6] == "none"

                assert broker.topics is not None
                topic = broker.topics.get(TOPIC.encode())
                assert topic is not None
                stop.set()
                await asyncio.gather(*tasks)
                await wait_durable(broker, topic)
                end = topic.last_offset
                # A real Figg subscriber from offset 0, caught up once it has read them all,
                # and a reader far behind, registered as a Figg session registers its own.
                behind = Reader("10.1.1.1:4000", 0)
                topic.subscribers.add(behind)
                try:
                    async with figg_conn(broker) as sub:
                        await sub.send(Attach(TOPIC.encode(), 0))
                        assert await sub.next() == Attached(TOPIC.encode(), 0)
                        await sub.frames(end)
                        host, port = sub.writer.get_extra_info("sockname")[:2]
                        caught_up = f"{host}:{port} · 0"
                        shown = await page.wait_for(
                            until(
                                TOPIC_STATE,
                                f"s.last === {end} && s.chips.length === 2"
                                f" && s.chips[1][0] === {json.dumps(caught_up)}",
                            )
                        )
                        assert shown["chips"] == [
                            [f"10.1.1.1:4000 · {end:,}", end, True],
                            [caught_up, 0, False],
                        ]
                        await screenshot(page, "webui-topics")
                finally:
                    topic.subscribers.discard(behind)
                assert page.errors() == []
        finally:
            await stop_traffic(stop, tasks, browser)
            await publisher.close()


async def wait_durable(broker: Broker, topic: Any) -> None:
    """Until everything published so far is in the topic and durable (stats stop moving)."""
    before = -1
    while topic.last_offset != before:
        before = topic.last_offset
        await asyncio.sleep(0.3)
