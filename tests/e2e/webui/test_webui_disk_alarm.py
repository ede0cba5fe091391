"""The web UI in headless Chromium: a banner names the file system while the disk alarm is
set, and goes once it clears. The queue directory is on a real small tmpfs
(tests/smalldisk.py) that a ballast file fills below ``disk_free_limit``. Saves
``webui-disk-alarm*.png`` under the test artifacts (test_webui.py says where).
"""

from __future__ import annotations

import asyncio
from pathlib import Path

from fqbroker.settings.broker import Settings
from tests.conftest import running
from tests.e2e.webui.browser import Chromium, Page, require_chromium, screenshot
from tests.smalldisk import small_disk

MiB = 1 << 20

BANNER = """
(() => {
  const el = document.getElementById("disk-alarm");
  if (!el || el.hidden || el.getBoundingClientRect().height === 0) return null;
  return el.textContent;
})()
"""

BANNER_GONE = """
(() => {
  const el = document.getElementById("disk-alarm");
  return !document.getElementById("node-panel").hidden && el.hidden && el.dataset.raised === "0";
})()
"""


async def test_web_ui_shows_the_disk_alarm(settings: Settings, tmp_path: Path) -> None:
    chromium = require_chromium()
    with small_disk(tmp_path / "disk", 16 * MiB) as disk:
        ballast = disk / "ballast"
        ballast.write_bytes(b"\0" * (12 * MiB))
        settings.queue_dir = disk / "queues"
        settings.disk_free_limit = "8MiB"
        async with running(settings) as broker:
            assert broker.disk_alarm.raised
            browser = await Chromium.launch(
                chromium, tmp_path / "profile", tmp_path / "chromium.log"
            )
            try:
                async with asyncio.timeout(60):
                    page = await Page.open(browser, f"http://127.0.0.1:{broker.port}/")
                    text = await page.wait_for(BANNER)
                    assert text.startswith("Disk alarm: free space below disk_free_limit")
                    assert str(disk / "queues") in text and "free, limit 8.0 MiB" in text, text
                    await screenshot(page, "webui-disk-alarm")
                    ballast.unlink()
                    # /node.json is polled every 5 s: the banner goes at the next poll.
                    await page.wait_for(BANNER_GONE, timeout=20)
                    assert not broker.disk_alarm.raised
                    assert page.errors() == []
            finally:
                await browser.close()
