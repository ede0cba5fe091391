"""The web UI read anonymously under auth = "password" with the reads open: the broker
names no client (docs/security.md, "Who reads what over HTTP"), and the page draws the
same cards with the names and addresses left out, without errors."""

from __future__ import annotations

import asyncio
from pathlib import Path

from fqbroker.protocols.fq import wire
from fqbroker.settings.broker import Settings
from fqbroker.storage.configdb.users import Users
from tests.conftest import RawConn, authenticate, root_and_bob, running
from tests.e2e.webui.test_webui import FRONTENDS_STATE, Chromium, Page, require_chromium

QUEUE = "app-ui"
DASH = "\u2013"  # what the page shows for a value it was not given

# The queue card's client table as a person reads it.
CLIENT_ROWS = """
(() => {
  const card = [...document.querySelectorAll("[data-queue]")].find(e => e.dataset.queue === NAME);
  if (!card) return null;
  const rows = [...card.querySelectorAll("table.clients tbody tr")];
  return rows.length ? rows.map(tr => [...tr.children].map(td => td.textContent)) : null;
})()
""".replace("NAME", f'"{QUEUE}"')


async def test_an_anonymous_viewer_sees_the_cards_without_names(
    settings: Settings, tmp_path: Path
) -> None:
    chromium = require_chromium()
    root_and_bob(settings)
    users = Users(settings.config_db)
    users.add("carol", "carolpw")
    users.allow("carol", "queue", "app-*")
    users.close()
    async with running(settings) as broker:
        cmd = await authenticate(broker.port, b"carol", QUEUE.encode() + b"\x00mem", b"carolpw")
        reply = await cmd.frame()
        assert isinstance(reply, wire.AuthResponse), reply
        data = await RawConn.open(broker.port)
        await data.send(wire.encode_hello(wire.Mode.DATA, reply.key))
        browser = await Chromium.launch(chromium, tmp_path / "profile", tmp_path / "chromium.log")
        try:
            async with asyncio.timeout(60):
                page = await Page.open(browser, f"http://127.0.0.1:{broker.port}/")
                (row,) = await page.wait_for(CLIENT_ROWS)
                assert row[:3] == ["", DASH, "client"]
                fronts = await page.wait_for(
                    f"(() => {{ const s = {FRONTENDS_STATE.strip()};"
                    " return s && s.length && s[0].open >= 1 ? s : null; })()"
                )
                command = fronts[0]
                assert command["name"] == "fq-command"
                assert command["rows"] == [[DASH, "", QUEUE]]
                html = await page.evaluate("document.body.innerHTML")
                assert "carol" not in html
                assert page.errors() == []
        finally:
            await browser.close()
            data.writer.close()
            cmd.writer.close()
