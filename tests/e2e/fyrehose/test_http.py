"""What operators see of the fyrehose backbone: /stats.json's ``"fyrehose"`` key, the
``fq_fyrehose_*`` metric families and the web UI's Fyrehose panel, on a real broker whose
listener gets real datagrams (wire.encode) from real UDP sockets on loopback; and the
examples of docs/fyrehose-protocol.md, byte for byte."""

from __future__ import annotations

import asyncio
import re
import socket
from pathlib import Path
from typing import Any, cast

from fqbroker.frontends.fyrehose.settings import Fyrehose
from fqbroker.protocols.fyrehose import wire
from fqbroker.protocols.fyrehose.wire import Deliver, Flags, Forward, Keepalive, Push, Request
from fqbroker.server.broker import Broker
from fqbroker.settings.broker import Settings
from tests.conftest import TIMEOUT, open_session, running, wait_for
from tests.e2e.http.test_http import metrics, stats
from tests.e2e.webui.test_webui import Chromium, Page, require_chromium, screenshot, until

ROOT = Path(__file__).resolve().parents[3]
TOKEN = bytes(range(16))


class Udp(asyncio.DatagramProtocol):
    """A UDP socket on 127.0.0.1 that queues what it receives (a large receive buffer:
    loopback drops when it overflows)."""

    def __init__(self) -> None:
        self.received: asyncio.Queue[bytes] = asyncio.Queue()
        self.transport: asyncio.DatagramTransport | None = None

    @classmethod
    async def open(cls) -> Udp:
        sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 << 20)
        sock.bind(("127.0.0.1", 0))
        loop = asyncio.get_running_loop()
        _, protocol = await loop.create_datagram_endpoint(cls, sock=sock)
        return protocol

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # A DatagramTransport, though not always by class (the selector loop's is not).
        self.transport = cast(asyncio.DatagramTransport, transport)

    def datagram_received(self, data: bytes, addr: tuple[str | Any, int]) -> None:
        self.received.put_nowait(data)

    @property
    def port(self) -> int:
        assert self.transport is not None
        port: int = self.transport.get_extra_info("sockname")[1]
        return port

    def send(self, to: int, datagram: wire.Datagram | bytes) -> None:
        assert self.transport is not None
        raw = datagram if isinstance(datagram, bytes) else wire.encode(datagram)
        self.transport.sendto(raw, ("127.0.0.1", to))

    async def next(self) -> wire.Datagram:
        async with asyncio.timeout(TIMEOUT):
            return wire.decode(await self.received.get())

    async def nothing(self, seconds: float = 0.3) -> None:
        """Nothing arrives for ``seconds`` (a bounded wait for what must not come)."""
        try:
            async with asyncio.timeout(seconds):
                raw = await self.received.get()
        except TimeoutError:
            return
        raise AssertionError(f"unexpected datagram {wire.decode(raw)}")

    def close(self) -> None:
        assert self.transport is not None
        self.transport.close()


def fyrehose_settings(settings: Settings, **options: Any) -> Settings:
    return settings.with_sections(Fyrehose(listen="127.0.0.1:0", **options))


def fyrehose_port(broker: Broker) -> int:
    address = broker.front_ends["fyrehose"].address
    assert address is not None
    return address[1]


async def subscribe(
    udp: Udp, port: int, flags: Flags = wire.NO_FLAGS, *, source: bool = False
) -> None:
    """A final-form KEEPALIVE naming ``udp`` (or 0.0.0.0: its source), and its ACK."""
    addr, to = ("0.0.0.0", 0) if source else ("127.0.0.1", udp.port)
    udp.send(port, Keepalive(addr, to, flags, TOKEN))
    assert await udp.next() == wire.KeepaliveAck(TOKEN)


async def test_no_fyrehose_key_nor_families_without_the_listener(broker: Broker) -> None:
    assert (
        broker.front_ends.get("fyrehose") is None or broker.front_ends["fyrehose"].address is None
    )
    assert "fyrehose" not in await stats(broker)
    assert not [name for name, _ in await metrics(broker) if name.startswith("fq_fyrehose")]


async def test_datagrams_move_the_stats_and_the_metrics(settings: Settings) -> None:
    async with running(fyrehose_settings(settings, window_messages=4)) as broker:
        port = fyrehose_port(broker)
        # Before any traffic: the key is there, all zero, every drop reason listed.
        before = (await stats(broker))["fyrehose"]
        assert before["sequence"] == before["first_retained"] == before["pushed"] == 0
        assert before["subscribers"] == []
        assert set(before["dropped"]) == {
            "malformed",
            "unexpected",
            "too_large",
            "busy",
            "congested",
            "subscribers_full",
            "elsewhere",
        }
        journal, plain, publisher = await Udp.open(), await Udp.open(), await Udp.open()
        try:
            await subscribe(journal, port)  # journaling, DELIVERs to its named address
            await subscribe(plain, port, Flags.NOJOURNAL, source=True)
            payloads = [b"message %d" % i for i in range(1, 7)]
            for i, data in enumerate(payloads, 1):
                publisher.send(port, Push(data, seed=i % 2 == 0))  # both forms
                assert await journal.next() == Deliver(i, data)  # paced: one at a time
                assert await plain.next() == Deliver(i, data)
            # An fq publish to the exchange is sequenced too (sequenced, not pushed).
            fq = await open_session(broker.port, b"fq-writer")
            try:
                await fq.publish(b"fyrehose", b"fyrehose", b"from fq")
                assert await journal.next() == Deliver(7, b"from fq")
                assert await plain.next() == Deliver(7, b"from fq")
            finally:
                await fq.close()

            # The window holds 4..7: a REQUEST for 6..7 is served from it; 1..2 is
            # FORWARDed to the journaling subscriber, never to the requester.
            plain.send(port, Request("0.0.0.0", 0, 6, 7))
            assert [await plain.next() for _ in range(2)] == [
                Deliver(6, payloads[5]),
                Deliver(7, b"from fq"),
            ]
            plain.send(port, Request("127.0.0.1", plain.port, 1, 2))
            assert await journal.next() == Forward("127.0.0.1", plain.port, 1, 2)
            # The journaling subscriber asks for 1..1 itself: nobody else journals.
            journal.send(port, Request("127.0.0.1", journal.port, 1, 1))
            await journal.nothing()
            # Bad and unexpected datagrams: counted, never answered.
            publisher.send(port, b"\xff")
            publisher.send(port, b"\x02\x00\x05hi")  # LENGTH disagrees with the size
            publisher.send(port, Deliver(1, b"x"))
            await publisher.nothing()

            await wait_for(
                lambda: (
                    (b := broker.front_ends["fyrehose"].state) is not None
                    and getattr(b, "unserved", 0) == 1
                    and getattr(b, "dropped", {}).get("unexpected") == 1
                )
            )
            got = (await stats(broker))["fyrehose"]
            subscribers = got.pop("subscribers")
            assert got == {
                "sequence": 7,
                "first_retained": 4,
                "retained_messages": 4,
                "retained_bytes": sum(len(p) for p in payloads[3:]) + len(b"from fq"),
                "pushed": 6,
                "sequenced": 7,
                "delivered": 14,
                "keepalives": 2,
                "requests": 3,
                "served": 2,
                "forwarded": 1,
                "unserved": 1,
                "dropped": {
                    "malformed": 2,
                    "unexpected": 1,
                    "too_large": 0,
                    "busy": 0,
                    "congested": 0,
                    "subscribers_full": 0,
                    "elsewhere": 0,
                },
            }
            assert sorted((s["remote"], s["journaling"]) for s in subscribers) == sorted(
                [(f"127.0.0.1:{journal.port}", True), (f"127.0.0.1:{plain.port}", False)]
            )
            assert all(0 < s["expires_in"] <= 5.0 for s in subscribers)

            samples = await metrics(broker)
            for name, expected in {
                "fq_fyrehose_sequence": 7,
                "fq_fyrehose_first_retained": 4,
                "fq_fyrehose_retained_messages": 4,
                "fq_fyrehose_retained_bytes": got["retained_bytes"],
                "fq_fyrehose_subscribers": 2,
                "fq_fyrehose_pushed_total": 6,
                "fq_fyrehose_sequenced_total": 7,
                "fq_fyrehose_delivered_total": 14,
                "fq_fyrehose_keepalives_total": 2,
                "fq_fyrehose_requests_total": 3,
                "fq_fyrehose_served_total": 2,
                "fq_fyrehose_forwarded_total": 1,
                "fq_fyrehose_unserved_total": 1,
            }.items():
                assert samples[name, ()] == expected, name
            assert samples["fq_fyrehose_dropped_total", (("reason", "malformed"),)] == 2
            assert samples["fq_fyrehose_dropped_total", (("reason", "unexpected"),)] == 1
            assert samples["fq_fyrehose_dropped_total", (("reason", "congested"),)] == 0

            # A NOSUBSCRIBE KEEPALIVE ends that subscription: one subscriber left.
            plain.send(port, Keepalive("0.0.0.0", 0, Flags.NOSUBSCRIBE, TOKEN))
            assert await plain.next() == wire.KeepaliveAck(TOKEN)
            after = (await stats(broker))["fyrehose"]
            assert [s["remote"] for s in after["subscribers"]] == [f"127.0.0.1:{journal.port}"]
            assert (await metrics(broker))["fq_fyrehose_subscribers", ()] == 1
        finally:
            for udp in (journal, plain, publisher):
                udp.close()


# --- docs/fyrehose-protocol.md ---------------------------------------------------------------

# Each example of the page by its label, and what it must decode to.
EXAMPLES: dict[str, wire.Datagram] = {
    "KEEPALIVE, seed form": Keepalive("127.0.0.1", 2323, seed=True),
    "KEEPALIVE, final, NOJOURNAL": Keepalive("127.0.0.1", 2323, Flags.NOJOURNAL, TOKEN),
    "KEEPALIVE, final, NOSUBSCRIBE, source address": Keepalive(
        "0.0.0.0", 0, Flags.NOSUBSCRIBE, TOKEN
    ),
    "KEEPALIVE-ACK": wire.KeepaliveAck(TOKEN),
    "KEEPALIVE-ACK to a seed form": wire.KeepaliveAck(wire.ZERO_TOKEN),
    'PUSH "hi", seed form': Push(b"hi", seed=True),
    'PUSH "hi", final form': Push(b"hi"),
    'DELIVER seq 1 "hi"': Deliver(1, b"hi"),
    "REQUEST 5..7 for 127.0.0.1:2323": Request("127.0.0.1", 2323, 5, 7),
    "FORWARD 5..7 for 10.0.0.2:4000": Forward("10.0.0.2", 4000, 5, 7),
}


def test_the_protocol_page_examples_byte_for_byte() -> None:
    text = (ROOT / "docs" / "fyrehose-protocol.md").read_text()
    block = text.split("## Examples", 1)[1].split("```", 2)[1]
    # A label may wrap onto a second line; the hex follows the last colon of the entry.
    entries = re.findall(r"^(\S.*?(?:\n  .*?)?)\((\d+)\):\s+([0-9a-f ]+)$", block, re.M)
    assert sorted(" ".join(label.split()) for label, _, _ in entries) == sorted(EXAMPLES)
    for label, size, hexed in entries:
        raw = bytes.fromhex(hexed)
        assert len(raw) == int(size), label
        expected = EXAMPLES[" ".join(label.split())]
        assert wire.decode(raw) == expected, label
        assert wire.encode(expected) == raw, label


# --- the web UI ------------------------------------------------------------------------------

FYREHOSE_PANEL = """
(() => {
  const panel = document.getElementById("fyrehose-panel");
  if (!panel || panel.hidden || panel.getBoundingClientRect().height === 0) return null;
  const field = (f) => panel.querySelector(`[data-field="${f}"]`);
  const value = (f) => Number(field(f).dataset.value);
  return {
    sequence: value("sequence"),
    retained: value("retained"),
    range: field("range").textContent,
    pushed: value("pushed"),
    requests: value("requests"),
    recovery: field("recovery").textContent,
    dropped: value("dropped"),
    reasons: field("drop-reasons").textContent,
    chips: [...panel.querySelectorAll(".sub-chip")].map(
      c => [c.dataset.remote, c.dataset.journaling === "true"]),
    count: document.getElementById("fyrehose-subscriber-count").textContent,
  };
})()
"""


async def test_web_ui_shows_the_fyrehose_panel(settings: Settings, tmp_path: Path) -> None:
    chromium = require_chromium()
    async with running(fyrehose_settings(settings)) as broker:
        port = fyrehose_port(broker)
        subscriber, publisher = await Udp.open(), await Udp.open()
        browser = await Chromium.launch(chromium, tmp_path / "profile", tmp_path / "chromium.log")
        keepalive: asyncio.Task[None] | None = None
        try:
            async with asyncio.timeout(60):
                await subscribe(subscriber, port)

                async def keep_subscribed() -> None:
                    # Once a second, as a client does: the chip must not expire meanwhile.
                    while True:
                        await asyncio.sleep(1.0)
                        subscriber.send(port, Keepalive("127.0.0.1", subscriber.port))

                keepalive = asyncio.create_task(keep_subscribed())
                for i in range(1, 4):
                    publisher.send(port, Push(b"tick %d" % i))
                    while not isinstance(got := await subscriber.next(), Deliver):
                        pass  # the KEEPALIVE-ACKs of keep_subscribed
                    assert got.seq == i
                subscriber.send(port, Request("127.0.0.1", subscriber.port, 2, 3))
                publisher.send(port, b"\xee")  # an unknown type: malformed
                page = await Page.open(browser, f"http://127.0.0.1:{broker.port}/")
                shown = await page.wait_for(
                    until(FYREHOSE_PANEL, "s.sequence === 3 && s.requests === 1 && s.dropped === 1")
                )
                assert shown["retained"] == 3 and shown["range"].startswith("1\u20133")
                assert shown["pushed"] == 3
                assert shown["recovery"] == "2 served · 0 forwarded · 0 unserved"
                assert shown["reasons"] == "1 malformed"
                assert shown["chips"] == [[f"127.0.0.1:{subscriber.port}", True]]
                assert shown["count"] == "1"
                await screenshot(page, "webui-fyrehose")
                assert page.errors() == []
        finally:
            if keepalive is not None:
                keepalive.cancel()
                await asyncio.gather(keepalive, return_exceptions=True)
            await browser.close()
            subscriber.close()
            publisher.close()
