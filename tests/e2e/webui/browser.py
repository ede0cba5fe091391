"""Headless Chromium for the web UI tests, driven over the DevTools protocol.

Chromium runs with ``--remote-debugging-pipe`` (JSON messages separated by NUL bytes on
file descriptors 3 and 4), so no websocket library is needed. ``Page`` waits on the
page's own polls of stats.json, not on the clock; ``screenshot`` saves light and dark
pictures under ``$FQ_TEST_ARTIFACTS`` (default ``var/test-artifacts``). Without Chromium
``require_chromium`` skips, or fails with ``CI`` set (tests/prereqs.py).
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

from tests.prereqs import missing

ROOT = Path(__file__).resolve().parents[3]
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


def require_chromium() -> str:
    chromium = find_chromium()
    if chromium is None:
        missing(
            "headless Chromium not found: install Debian's chromium package "
            "(apt-get install chromium; .ci/run does it) or set FQ_CHROMIUM"
        )
    return chromium


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


def until(expression: str, condition: str) -> str:
    """A page expression that is ``expression``'s value once ``condition`` holds on it."""
    return f"(() => {{ const s = {expression.strip()}; return s && ({condition}) ? s : null; }})()"
