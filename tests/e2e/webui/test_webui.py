"""The web UI in headless Chromium: a queue appears, and its rate moves with traffic; the
front ends of the broker's table show with their connections; an upstream peer shows up
with its link state and its received rate; retained topics show with their offsets, rate
and subscribers.

Chromium is driven over the DevTools protocol through ``--remote-debugging-pipe`` (JSON
messages separated by NUL bytes on file descriptors 3 and 4), so no websocket library is
needed. The tests save screenshots, light and dark, under ``$FQ_TEST_ARTIFACTS`` (default
``var/test-artifacts``): ``webui*.png``, ``webui-peers*.png`` and ``webui-topics*.png``.
Without Chromium they skip, or fail with ``CI`` set (tests/prereqs.py); ``.ci/run``
installs Debian's package.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import os
import shutil
import sys
from pathlib import Path
from typing import Any

from fqbroker.frontends.figg.settings import Figg
from fqbroker.protocols.figg.wire import Attach, Attached
from fqbroker.server.broker import Broker
from fqbroker.settings.broker import Settings, Upstream
from tests.conftest import TIMEOUT, Session, open_session, running
from tests.e2e.figg.test_figg import conn as figg_conn
from tests.prereqs import missing

ROOT = Path(__file__).resolve().parents[3]
QUEUE = 'webui "live" ✓'
EXCHANGE = "webui"
VIEWPORT = {"width": 1440, "height": 900, "deviceScaleFactor": 1, "mobile": False}


def find_chromium() -> str | None:
    for name in (os.environ.get("FQ_CHROMIUM"), "chromium", "chromium-browser", "google-chrome"):
        if name and (path := shutil.which(name)):
            return path
    return None


def artifacts_dir() -> Path:
    path = Path(os.environ.get("FQ_TEST_ARTIFACTS") or ROOT / "var" / "test-artifacts")
    path.mkdir(parents=True, exist_ok=True)
    return path


class Chromium:
    """Headless Chromium and a minimal DevTools-protocol client over its pipe."""

    def __init__(self, proc: asyncio.subprocess.Process, to_browser: int) -> None:
        self.proc = proc
        self.to_browser = to_browser
        self.reader = asyncio.StreamReader(limit=64 << 20)  # screenshots are big messages
        self.transport: asyncio.ReadTransport | None = None
        self.pending: dict[int, asyncio.Future[dict[str, Any]]] = {}
        self.events: list[dict[str, Any]] = []
        self.event_arrived = asyncio.Event()  # set, and replaced, on every event
        self.next_id = 0
        self.pump: asyncio.Task[None] | None = None

    @classmethod
    async def launch(cls, executable: str, profile: Path, log: Path) -> Chromium:
        browser_in, our_out = os.pipe()  # we write commands, Chromium reads fd 3
        our_in, browser_out = os.pipe()  # Chromium writes replies on fd 4
        args = [
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-quic",
            "--disable-dev-shm-usage",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--hide-scrollbars",
            "--mute-audio",
            "--window-size=1440,900",
            "--remote-debugging-pipe",
            f"--user-data-dir={profile}",
            "about:blank",
        ]
        # A tiny Python trampoline moves our pipe ends to the descriptor numbers Chromium
        # expects (3 and 4), then becomes Chromium.
        trampoline = (
            "import os, sys; r, w = int(sys.argv[1]), int(sys.argv[2]); "
            "os.dup2(r, 3); os.dup2(w, 4); os.close(r); os.close(w); "
            "os.execv(sys.argv[3], sys.argv[3:])"
        )
        with log.open("wb") as stderr:
            proc = await asyncio.create_subprocess_exec(
                sys.executable,
                "-c",
                trampoline,
                str(browser_in),
                str(browser_out),
                executable,
                *args,
                pass_fds=(browser_in, browser_out),
                stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.DEVNULL,
                stderr=stderr,
            )
        os.close(browser_in)
        os.close(browser_out)
        self = cls(proc, our_out)
        loop = asyncio.get_running_loop()
        self.transport, _ = await loop.connect_read_pipe(
            lambda: asyncio.StreamReaderProtocol(self.reader), os.fdopen(our_in, "rb", 0)
        )
        self.pump = asyncio.create_task(self._read_messages())
        return self

    async def _read_messages(self) -> None:
        while True:
            try:
                raw = await self.reader.readuntil(b"\0")
            except asyncio.IncompleteReadError:
                for waiter in self.pending.values():
                    if not waiter.done():
                        waiter.set_exception(EOFError("chromium went away"))
                return
            message = json.loads(raw[:-1])
            key = message.get("id")
            future = self.pending.pop(key) if key in self.pending else None
            if future is None:
                self.events.append(message)
                self.event_arrived.set()
                self.event_arrived = asyncio.Event()
            elif "error" in message:
                future.set_exception(RuntimeError(message["error"]))
            else:
                future.set_result(message.get("result", {}))

    async def send(
        self, method: str, params: dict[str, Any] | None = None, session: str | None = None
    ) -> dict[str, Any]:
        self.next_id += 1
        message: dict[str, Any] = {"id": self.next_id, "method": method, "params": params or {}}
        if session:
            message["sessionId"] = session
        future = asyncio.get_running_loop().create_future()
        self.pending[self.next_id] = future
        os.write(self.to_browser, json.dumps(message).encode() + b"\0")
        async with asyncio.timeout(15):
            result: dict[str, Any] = await future
        return result

    async def close(self) -> None:
        with contextlib.suppress(Exception):
            async with asyncio.timeout(5):
                await self.send("Browser.close")
        try:
            async with asyncio.timeout(10):
                await self.proc.wait()
        except TimeoutError:
            self.proc.kill()
            await self.proc.wait()
        if self.pump is not None:
            self.pump.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self.pump
        if self.transport is not None:
            self.transport.close()
        os.close(self.to_browser)


class Page:
    def __init__(self, browser: Chromium, session: str) -> None:
        self.browser = browser
        self.session = session

    @classmethod
    async def open(cls, browser: Chromium, url: str) -> Page:
        target = await browser.send("Target.createTarget", {"url": "about:blank"})
        attached = await browser.send(
            "Target.attachToTarget", {"targetId": target["targetId"], "flatten": True}
        )
        page = cls(browser, attached["sessionId"])
        await page.call("Runtime.enable")
        await page.call("Network.enable")  # so that polls() can count the page's polls
        await page.call("Emulation.setDeviceMetricsOverride", VIEWPORT)
        await page.call("Page.navigate", {"url": url})
        return page

    async def call(self, method: str, params: dict[str, Any] | None = None) -> dict[str, Any]:
        return await self.browser.send(method, params, self.session)

    async def evaluate(self, expression: str) -> Any:
        reply = await self.call(
            "Runtime.evaluate", {"expression": expression, "returnByValue": True}
        )
        assert "exceptionDetails" not in reply, reply
        return reply["result"].get("value")

    async def wait_for(self, expression: str, timeout: float = 15) -> Any:
        """Evaluate after each poll the page renders until the result is truthy; returns it."""
        async with asyncio.timeout(timeout):
            while not (result := await self.evaluate(expression)):
                await self.rendered_polls(0, timeout)
        return result

    def polls(self) -> int:
        """How many times the page has asked for stats.json so far."""
        return sum(
            1
            for e in self.browser.events
            if e.get("sessionId") == self.session
            and e.get("method") == "Network.requestWillBeSent"
            and e["params"]["request"]["url"].endswith("/stats.json")
        )

    async def rendered_polls(self, n: int = 1, timeout: float = 15) -> None:
        """Wait until the poll in flight now (if any) and ``n`` polls after it have been
        rendered.

        The page asks for stats.json only once it has rendered the answer before, so
        those have been rendered when ``n + 1`` more requests have gone out. Waits on the
        browser's events, not on the clock.
        """
        target = self.polls() + n + 1
        async with asyncio.timeout(timeout):
            while self.polls() < target:
                await self.browser.event_arrived.wait()

    def errors(self) -> list[dict[str, Any]]:
        """Uncaught exceptions and console.error calls in the page so far."""
        return [
            e
            for e in self.browser.events
            if e.get("method") == "Runtime.exceptionThrown"
            or (
                e.get("method") == "Runtime.consoleAPICalled"
                and e.get("params", {}).get("type") == "error"
            )
        ]


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
    open: Number(card.querySelector('[data-field="open"]').dataset.value),
    heads: [...card.querySelectorAll("thead th")].map(th => th.textContent),
    rows: [...card.querySelectorAll("tbody tr")].map(
      tr => [...tr.children].map(td => td.textContent)),
  }));
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


def require_chromium() -> str:
    chromium = find_chromium()
    if chromium is None:
        missing(
            "headless Chromium not found: install Debian's chromium package "
            "(apt-get install chromium; .ci/run does it) or set FQ_CHROMIUM"
        )
    return chromium


async def stop_traffic(
    stop: asyncio.Event, tasks: list[asyncio.Task[Any]], browser: Chromium
) -> None:
    """End the test's traffic tasks and the browser, whatever state they are in."""
    stop.set()
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    await browser.close()


async def screenshot(page: Page, name: str) -> None:
    """Save the page as ``<name>.png`` (light) and ``<name>-dark.png`` under the artifacts."""
    for suffix, scheme in (("", "light"), ("-dark", "dark")):
        await page.call(
            "Emulation.setEmulatedMedia",
            {"features": [{"name": "prefers-color-scheme", "value": scheme}]},
        )
        shot = await page.call("Page.captureScreenshot", {"format": "png"})
        png = base64.b64decode(shot["data"])
        assert png.startswith(b"\x89PNG\r\n\x1a\n")
        (artifacts_dir() / f"{name}{suffix}.png").write_bytes(png)
    await page.call("Emulation.setEmulatedMedia", {"features": []})


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


# --- upstream peers ---------------------------------------------------------------------------

PEER_EXCHANGE = "ex"
PEER_SOURCE = "fqd-peerb//mem:backlog=-1"
NODE_B = "10.254.254.2"  # the fixture broker (A) is 10.254.254.1
NODE_C = "10.254.254.3"

PEERS_PANEL_VISIBLE = """
(() => {
  const panel = document.getElementById("peers-panel");
  return !panel.hidden && panel.getBoundingClientRect().height > 0;
})()
"""

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


def until(expression: str, condition: str) -> str:
    """A page expression that is ``expression``'s value once ``condition`` holds on it."""
    return f"(() => {{ const s = {expression.strip()}; return s && ({condition}) ? s : null; }})()"


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


# --- retained topics --------------------------------------------------------------------------

TOPIC = "ui.topic"

TOPICS_PANEL_VISIBLE = """
(() => {
  const panel = document.getElementById("topics-panel");
  return !panel.hidden && panel.getBoundingClientRect().height > 0;
})()
"""

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
