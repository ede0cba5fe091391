"""What operators see of the OpenCluster key/value store: /stats.json's ``"opencluster"``
key, the ``fq_opencluster_*`` metric families and the web UI's OpenCluster panel, on a
real broker whose listener gets real frames (the wire module's encoders) over TCP on
loopback."""

from __future__ import annotations

import asyncio
from pathlib import Path

from fqbroker.frontends.kit.component import RATE_WINDOW
from fqbroker.frontends.opencluster.settings import OpenCluster
from fqbroker.protocols.opencluster import wire
from fqbroker.protocols.opencluster.wire import Frame
from fqbroker.server.broker import Broker
from fqbroker.settings.broker import Settings
from tests.conftest import TIMEOUT, running, wait_for
from tests.e2e.http.test_http import metrics, stats
from tests.e2e.webui.test_webui import Chromium, Page, require_chromium, screenshot, until

ZERO = {
    "keys": 0,
    "bytes": 0,
    "sets": 0,
    "gets": 0,
    "hits": 0,
    "misses": 0,
    "expired": 0,
    "commits": 0,
    "failed_commits": 0,
    "sets_per_second": 0.0,
    "gets_per_second": 0.0,
}


class Conn:
    """A raw OpenCluster connection: frames written with the wire encoders, replies decoded
    with the strict FrameDecoder, every read bounded."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer
        self.decoder = wire.FrameDecoder(1 << 21)
        self.userid = 0

    @classmethod
    async def open(cls, port: int) -> Conn:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        conn = cls(reader, writer)
        conn.writer.write(wire.hello(0))
        ack, servers, masks = await conn.frames(3)
        assert (ack.command, ack.repcmd) == (wire.ACK, wire.HELLO)
        assert servers.command == wire.SERVERLIST and masks.command == wire.HASHMASKS
        return conn

    async def frames(self, n: int) -> list[Frame]:
        out: list[Frame] = []
        async with asyncio.timeout(TIMEOUT):
            while len(out) < n:
                frame = self.decoder.next_frame()
                if frame is not None:
                    out.append(frame)
                    continue
                data = await self.reader.read(65536)
                assert data, "the broker closed the connection"
                self.decoder.receive_data(data)
        return out

    async def ask(self, frame: bytes) -> Frame:
        """One command, its one reply."""
        self.writer.write(frame)
        (reply,) = await self.frames(1)
        return reply

    async def set(self, name: bytes, value: int | bytes, *, expires: int = 0) -> None:
        if isinstance(value, int):
            reply = await self.ask(wire.set_int(0, name, value, expires=expires))
        else:
            reply = await self.ask(wire.set_string(0, name, value, expires=expires))
        assert reply.command == wire.ACK, reply

    async def close(self) -> None:
        self.writer.close()
        await self.writer.wait_closed()


def opencluster_settings(settings: Settings) -> Settings:
    return settings.with_sections(OpenCluster(listen="127.0.0.1:0"))


def opencluster_port(broker: Broker) -> int:
    address = broker.front_ends["opencluster"].address
    assert address is not None
    return address[1]


async def test_no_opencluster_key_nor_families_without_the_listener(broker: Broker) -> None:
    live = broker.front_ends.get("opencluster")
    assert live is None or (live.address is None and live.state is None)
    assert "opencluster" not in await stats(broker)
    assert not [name for name, _ in await metrics(broker) if name.startswith("fq_opencluster")]


async def test_frames_move_the_stats_and_the_metrics(settings: Settings) -> None:
    async with running(opencluster_settings(settings)) as broker:
        port = opencluster_port(broker)
        # Before any traffic: the key is there, all zero; its families too.
        assert (await stats(broker))["opencluster"] == ZERO
        assert (await metrics(broker))["fq_opencluster_sets_total", ()] == 0
        conn = await Conn.open(port)
        try:
            # One at a time, each acked before the next: one group commit per set.
            await conn.set(b"visits", 41)
            await conn.set(b"greeting", b"hello")
            await conn.set(b"greeting", b"hello, world")  # replaces: still one key
            await conn.set(b"lease", b"me", expires=1)

            got = await conn.ask(wire.get_int(0, b"visits"))
            assert got.command == wire.DATA_INT
            assert wire.decode_data_int(got.payload)[2] == 41
            got = await conn.ask(wire.get_string(0, b"greeting"))
            assert got.command == wire.DATA_STR
            assert wire.decode_data_str(got.payload)[2] == b"hello, world"
            got = await conn.ask(wire.get_string(0, b"nobody"))
            assert (got.command, got.repcmd) == (wire.FAIL, wire.GET_STRING)
            # The other type: the key was found (a hit), answered failinfo code 1.
            got = await conn.ask(wire.get_string(0, b"visits"))
            assert got.command == wire.FAILINFO
            assert wire.decode_failinfo(got.payload)[0] == 1

            # A malformed frame (a negative length) closes that connection only, counted
            # as bad input; this connection carries on.
            bad = await Conn.open(port)
            bad.writer.write(wire.encode_frame(wire.PING, 0, 0)[:8] + b"\xff\xff\xff\xff")
            async with asyncio.timeout(TIMEOUT):
                assert await bad.reader.read() == b""
            await bad.close()

            # The lease expires: the sweep (at least once a second) reclaims it.
            await wait_for(
                lambda: getattr(broker.front_ends["opencluster"].state, "expired", 0) == 1
            )
            got = await conn.ask(wire.get_string(0, b"lease"))
            assert got.command == wire.FAIL

            shown = (await stats(broker))["opencluster"]
            rates = {k: shown.pop(k) for k in ("sets_per_second", "gets_per_second")}
            assert shown == {
                "keys": 2,
                "bytes": len(b"visits") + 4 + len(b"greeting") + len(b"hello, world"),
                "sets": 4,
                "gets": 5,
                "hits": 3,
                "misses": 2,
                "expired": 1,
                "commits": 4,
                "failed_commits": 0,
            }
            assert all(r >= 0 for r in rates.values())

            samples = await metrics(broker)
            for name, expected in {
                "fq_opencluster_keys": 2,
                "fq_opencluster_bytes": shown["bytes"],
                "fq_opencluster_sets_total": 4,
                "fq_opencluster_gets_total": 5,
                "fq_opencluster_hits_total": 3,
                "fq_opencluster_misses_total": 2,
                "fq_opencluster_expired_total": 1,
                "fq_opencluster_commits_total": 4,
                "fq_opencluster_failed_commits_total": 0,
            }.items():
                assert samples[name, ()] == expected, name
            assert samples["fq_bad_input_total", (("frontend", "opencluster"),)] == 1
        finally:
            await conn.close()


async def test_rates_over_the_stats_interval(settings: Settings) -> None:
    async with running(opencluster_settings(settings)) as broker:
        conn = await Conn.open(opencluster_port(broker))
        try:
            # The first snapshot is the baseline: no rate yet.
            assert (await stats(broker))["opencluster"]["sets_per_second"] == 0.0
            for i in range(10):
                await conn.set(b"k%d" % i, i)
            for i in range(5):
                got = await conn.ask(wire.get_int(0, b"k%d" % i))
                assert got.command == wire.DATA_INT
            # Past the window since the baseline: the rates are the counts over the time
            # between the two snapshots, at least RATE_WINDOW, so at most count / window.
            await asyncio.sleep(RATE_WINDOW)
            shown = (await stats(broker))["opencluster"]
            assert 0 < shown["sets_per_second"] <= 10 / RATE_WINDOW
            assert 0 < shown["gets_per_second"] <= 5 / RATE_WINDOW
            # Sets and gets per interval in the same proportion: they share the interval.
            assert abs(shown["sets_per_second"] - 2 * shown["gets_per_second"]) <= 0.002
            # Read again at once: the same rates, not a new, shorter interval (on a box so
            # slow that a second passed meanwhile, a new interval without traffic: 0).
            again = (await stats(broker))["opencluster"]
            assert (again["sets_per_second"], again["gets_per_second"]) in (
                (shown["sets_per_second"], shown["gets_per_second"]),
                (0.0, 0.0),
            )
        finally:
            await conn.close()


# --- the web UI ------------------------------------------------------------------------------

OPENCLUSTER_PANEL = """
(() => {
  const panel = document.getElementById("opencluster-panel");
  if (!panel || panel.hidden || panel.getBoundingClientRect().height === 0) return null;
  const field = (f) => panel.querySelector(`[data-field="${f}"]`);
  const value = (f) => Number(field(f).dataset.value);
  return {
    keys: value("keys"),
    bytes: value("bytes"),
    sets: value("sets"),
    gets: value("gets"),
    setsRate: value("sets-rate"),
    ratio: field("hit-ratio").dataset.value,
    ratioText: field("hit-ratio").textContent,
    hits: field("hits").textContent,
    expired: value("expired"),
    commits: field("commits").textContent,
    count: document.getElementById("opencluster-key-count").textContent,
  };
})()
"""


async def test_web_ui_shows_the_opencluster_panel(settings: Settings, tmp_path: Path) -> None:
    chromium = require_chromium()
    async with running(opencluster_settings(settings)) as broker:
        conn = await Conn.open(opencluster_port(broker))
        browser = await Chromium.launch(chromium, tmp_path / "profile", tmp_path / "chromium.log")
        try:
            async with asyncio.timeout(60):
                for i in range(3):
                    await conn.set(b"setting-%d" % i, b"value %d" % i)
                await conn.set(b"counter", 7)
                await conn.set(b"lease", b"me", expires=1)
                for name in (b"setting-0", b"setting-1", b"setting-2"):
                    assert (await conn.ask(wire.get_string(0, name))).command == wire.DATA_STR
                assert (await conn.ask(wire.get_string(0, b"nobody"))).command == wire.FAIL
                page = await Page.open(browser, f"http://127.0.0.1:{broker.port}/")
                shown = await page.wait_for(
                    until(OPENCLUSTER_PANEL, "s.expired === 1 && s.keys === 4")
                )
                assert shown["sets"] == 5 and shown["gets"] == 4
                assert float(shown["ratio"]) == 0.75 and shown["ratioText"] == "75.0%"
                assert shown["hits"] == "3 hits · 1 miss"
                assert shown["commits"] == "5 commits"
                assert shown["count"] == "4"
                assert shown["bytes"] == (await stats(broker))["opencluster"]["bytes"]
                assert shown["setsRate"] == 0  # all were set before the page's first poll
                # Sets while the page watches: a later poll shows their rate.
                for i in range(10):
                    await conn.set(b"more-%d" % i, i)
                # (A poll in the middle of them may show a rate first; the one after it
                # shows the last of them, with that rate or a newer one, still above 0.)
                shown = await page.wait_for(
                    until(OPENCLUSTER_PANEL, "s.setsRate > 0 && s.sets === 15")
                )
                assert shown["keys"] == 14
                assert shown["setsRate"] <= 10 / RATE_WINDOW
                await screenshot(page, "webui-opencluster")
                assert page.errors() == []
        finally:
            await browser.close()
            await conn.close()
