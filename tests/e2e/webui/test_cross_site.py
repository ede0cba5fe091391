"""Another web site's page against the broker, in headless Chromium: what an admin's browser
would do for an attacker (docs/security.md, "Cross-site requests and the admin API").

The attacker's pages are served by a second tiny HTTP server on another loopback port: a
different origin, as evil.example would be. Its forms post ``enctype="text/plain"`` bodies
shaped as JSON, submitted by the page's own script, as such attacks do. The broker's state
is read afterwards: nothing changed. And a page framing the broker's UI gets an empty frame.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import html
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar

from fqbroker.server.broker import Broker
from fqbroker.settings.broker import Settings
from tests.conftest import root_and_bob, running
from tests.e2e.http.test_auth import basic
from tests.e2e.http.test_http import get
from tests.e2e.webui.test_webui import Chromium, Page, require_chromium

T = TypeVar("T")


@contextlib.asynccontextmanager
async def attacker_site(pages: dict[str, str]) -> AsyncIterator[str]:
    """Serve ``pages`` (path: HTML) on a loopback port of their own; yields the origin."""

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(ConnectionError, asyncio.IncompleteReadError):
            head = await reader.readuntil(b"\r\n\r\n")
            path = head.split(b" ", 2)[1].decode()
            page = pages.get(path)
            status = b"200 OK" if page is not None else b"404 Not Found"
            body = (page or "").encode()
            writer.write(
                b"HTTP/1.1 " + status + b"\r\ncontent-type: text/html; charset=utf-8\r\n"
                b"content-length: %d\r\nconnection: close\r\n\r\n" % len(body) + body
            )
            await writer.drain()
        writer.close()

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.close()
        await server.wait_closed()


def forged_json_form(action: str, fields: dict[str, Any]) -> str:
    """A page that posts ``fields`` as JSON in a text/plain form at once.

    A text/plain form sends ``name=value``: the name opens the JSON object and a padding
    key, the value closes it, so the body parses as the object with one key more.
    """
    opening = json.dumps(fields)[:-1] + ', "pad": "'
    return (
        "<!doctype html><title>cute cats</title>"
        f'<form method="POST" enctype="text/plain" action="{html.escape(action)}">'
        f'<input type="hidden" name="{html.escape(opening)}" value="&quot;}}"></form>'
        "<script>document.forms[0].submit()</script>"
    )


async def answer_to(page: Page, url: str, timeout: float = 20) -> int:
    """The HTTP status the page's browser got for ``url`` (waits for it)."""

    def found() -> int | None:
        for event in page.browser.events:
            if event.get("sessionId") != page.session:
                continue
            if event.get("method") == "Network.responseReceived":
                response = event["params"]["response"]
                if response["url"] == url:
                    return int(response["status"])
        return None

    async with asyncio.timeout(timeout):
        while (status := found()) is None:
            await page.browser.event_arrived.wait()
    return status


async def in_chromium(tmp_path: Path, visit: Callable[[Page], Awaitable[T]]) -> T:
    """What ``visit`` finds with a fresh page of a fresh headless Chromium."""
    chromium = require_chromium()
    browser = await Chromium.launch(chromium, tmp_path / "profile", tmp_path / "chromium.log")
    try:
        async with asyncio.timeout(60):
            return await visit(await Page.open(browser, "about:blank"))
    finally:
        await browser.close()


async def test_a_forged_form_creates_no_queue_on_an_open_broker(
    broker: Broker, tmp_path: Path
) -> None:
    """A default broker (auth = "none", loopback): any page its user opens could make a
    permanent disk queue with one form."""
    target = f"http://127.0.0.1:{broker.port}/admin/queues/create"
    fields = {"name": "evil", "type": "disk", "permanent": True}
    async with attacker_site({"/cats.html": forged_json_form(target, fields)}) as site:

        async def visit(page: Page) -> int:
            await page.call("Page.navigate", {"url": f"{site}/cats.html"})
            return await answer_to(page, target)

        status = await in_chromium(tmp_path, visit)
    assert b"evil" not in broker.queues
    assert status == 403
    assert broker.limits.refused["http_cross_site"] == 1


async def test_a_forged_form_resets_no_password_with_the_admin_s_login(
    settings: Settings, tmp_path: Path
) -> None:
    """An admin logged in through the browser's Basic prompt: the browser sends the login
    with every request to the broker, a forged form's too (set here as the browser's
    extra headers, which go with every request, as a remembered Basic login does)."""
    root_and_bob(settings)
    async with running(settings) as broker:
        port = broker.port
        target = f"http://127.0.0.1:{port}/admin/users/add"
        fields = {"name": "root", "password": "pwned"}
        async with attacker_site({"/cats.html": forged_json_form(target, fields)}) as site:

            async def visit(page: Page) -> int:
                login = base64.b64encode(b"root:rootpw").decode()
                await page.call(
                    "Network.setExtraHTTPHeaders", {"headers": {"Authorization": f"Basic {login}"}}
                )
                await page.call("Page.navigate", {"url": f"{site}/cats.html"})
                return await answer_to(page, target)

            status = await in_chromium(tmp_path, visit)
        response, _ = await get(port, "/admin/status", [basic("root", "rootpw")])
        assert response.status_code == 200  # the password is the one it was
        response, _ = await get(port, "/admin/status", [basic("root", "pwned")])
        assert response.status_code == 401
        assert status == 403


async def test_another_site_cannot_frame_the_web_ui(broker: Broker, tmp_path: Path) -> None:
    """Clickjacking: the UI in a transparent frame under a decoy's buttons. The browser
    fetches the frame and shows nothing of it."""
    ui = f"http://127.0.0.1:{broker.port}/"
    page_html = f'<!doctype html><iframe src="{ui}" width="800" height="600"></iframe>'
    async with attacker_site({"/frame.html": page_html}) as site:

        async def visit(page: Page) -> tuple[int, list[Any], int]:
            await page.call("Page.navigate", {"url": f"{site}/frame.html"})
            status = await answer_to(page, ui)
            # The broker's UI would ask for stats.json within its first second; a blocked
            # frame runs no script. Wait on the frame's load, then look.
            async with asyncio.timeout(15):
                while not await page.evaluate(
                    "document.querySelector('iframe') !== null && "
                    "performance.getEntriesByType('resource').length > 0"
                ):
                    await page.browser.event_arrived.wait()
            tree = await page.call("Page.getFrameTree")
            children = tree["frameTree"].get("childFrames", [])
            polls = sum(
                1
                for e in page.browser.events
                if e.get("method") == "Network.requestWillBeSent"
                and e["params"]["request"]["url"].endswith("/stats.json")
            )
            return status, children, polls

        status, children, polls = await in_chromium(tmp_path, visit)
    assert all(not c["frame"]["url"].startswith(ui) for c in children), children
    assert polls == 0  # the UI's script never ran in the frame
    assert status == 200  # fetched, then refused a place in the page


async def test_the_web_ui_breaks_none_of_its_own_policy(broker: Broker, tmp_path: Path) -> None:
    """The policy sent with the UI (no inline script or style, images from the broker or
    data: URLs) is one the UI keeps: no violation while it loads, polls and draws."""
    ui = f"http://127.0.0.1:{broker.port}/"

    async def visit(page: Page) -> list[str]:
        await page.call("Page.enable")
        await page.call(
            "Page.addScriptToEvaluateOnNewDocument",
            {
                "source": "window.violations = []; document.addEventListener("
                "'securitypolicyviolation', e => window.violations.push("
                "e.violatedDirective + ' ' + e.blockedURI));"
            },
        )
        await page.call("Page.navigate", {"url": ui})
        await page.rendered_polls(2)
        assert await page.evaluate("document.body.dataset.admin") == "true"  # admin.js ran
        violations: list[str] = await page.evaluate("window.violations")
        return violations

    assert await in_chromium(tmp_path, visit) == []
