"""The fyrehose listener end to end: a real broker with the listener on loopback, raw UDP
datagrams made and read with the project's codec (fqbroker.protocols.fyrehose.wire) as
the clients, fq clients on the other side of the bridge, and real fqd processes where a
restart matters.

What docs/fyrehose.md promises is checked from the sockets' side: every KEEPALIVE is
answered; DELIVER carries a sequence from 1, continuous, to the address a KEEPALIVE
names; a subscriber stops receiving 5 s after its last KEEPALIVE; REQUEST is answered
from the window up to request_limit, and what the window no longer holds is FORWARDed
to a journaling subscriber; bad datagrams are counted and never answered; the sequence
goes on across restarts, clean or not.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import signal
import socket
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from fqbroker.clients.fq.client import Client
from fqbroker.frontends.fyrehose.backbone import Backbone
from fqbroker.frontends.fyrehose.endpoint import FyrehoseEndpoint
from fqbroker.frontends.fyrehose.sequence import LEASE, SequenceFile, SequenceFileError
from fqbroker.frontends.fyrehose.settings import Fyrehose
from fqbroker.protocols.fyrehose import wire
from fqbroker.protocols.fyrehose.wire import (
    Deliver,
    Flags,
    Forward,
    Keepalive,
    KeepaliveAck,
    Push,
    Request,
)
from fqbroker.server.broker import Broker
from fqbroker.settings.broker import Settings
from tests.conftest import TIMEOUT, on, running, wait_for
from tests.procs import Proc

EXCHANGE = b"fyrehose"
TOKEN = bytes(range(16))
Address = tuple[str, int]


pytestmark = pytest.mark.on("fyrehose")


@pytest.fixture
def fh(broker_on: Broker) -> Broker:
    return broker_on


def backbone_of(broker: Broker) -> Backbone:
    state = broker.front_ends["fyrehose"].state
    assert isinstance(state, Backbone)
    return state


def fyrehose_address(broker: Broker) -> Address:
    address = broker.front_ends["fyrehose"].address
    assert address is not None
    return address


class _Inbox(asyncio.DatagramProtocol):
    def __init__(self) -> None:
        self.queue: asyncio.Queue[tuple[bytes, Address]] = asyncio.Queue()

    def datagram_received(self, data: bytes, addr: Address) -> None:
        self.queue.put_nowait((data, (addr[0], addr[1])))


class Udp:
    """A raw UDP socket on 127.0.0.1: datagrams out to the broker, datagrams in."""

    def __init__(self, transport: asyncio.DatagramTransport, inbox: _Inbox, to: Address) -> None:
        self.transport, self.inbox, self.to = transport, inbox, to
        self.address: Address = transport.get_extra_info("sockname")[:2]

    @classmethod
    async def open(cls, to: Address) -> Udp:
        sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        # Loopback drops what overflows a receive buffer: tests that count must not lose.
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 << 20)
        sock.bind(("127.0.0.1", 0))
        loop = asyncio.get_running_loop()
        transport, inbox = await loop.create_datagram_endpoint(_Inbox, sock=sock)
        return cls(transport, inbox, to)

    def send(self, d: wire.Datagram | bytes, to: Address | None = None) -> None:
        self.transport.sendto(d if isinstance(d, bytes) else wire.encode(d), to or self.to)

    def keepalive(self, flags: Flags = wire.NO_FLAGS, token: bytes = TOKEN) -> None:
        self.send(Keepalive(self.address[0], self.address[1], flags, token))

    async def raw(self, timeout: float = TIMEOUT) -> tuple[bytes, Address]:
        async with asyncio.timeout(timeout):
            return await self.inbox.queue.get()

    async def next(self, timeout: float = TIMEOUT) -> wire.Datagram:
        data, _ = await self.raw(timeout)
        return wire.decode(data)

    async def nothing(self, seconds: float = 0.3) -> None:
        with contextlib.suppress(TimeoutError):
            data, _ = await self.raw(seconds)
            raise AssertionError(f"unexpected datagram {data!r}")

    async def subscribe(self, flags: Flags = wire.NO_FLAGS) -> None:
        self.keepalive(flags)
        assert await self.next() == KeepaliveAck(TOKEN)

    async def delivers(self, n: int) -> list[tuple[int, bytes]]:
        out = []
        for _ in range(n):
            d = await self.next()
            assert isinstance(d, Deliver), d
            out.append((d.seq, d.data))
        return out

    def close(self) -> None:
        self.transport.close()


@contextlib.asynccontextmanager
async def udp(to: Address) -> AsyncIterator[Udp]:
    sock = await Udp.open(to)
    try:
        yield sock
    finally:
        sock.close()


async def push(broker_or_to: Broker | Address, payloads: list[bytes], seed: bool = False) -> None:
    """PUSH each payload from a socket of its own, paced so loopback loses none."""
    to = broker_or_to if isinstance(broker_or_to, tuple) else fyrehose_address(broker_or_to)
    async with udp(to) as pusher:
        for data in payloads:
            pusher.send(Push(data, seed=seed))
            await asyncio.sleep(0.001)


# --- KEEPALIVE and DELIVER ----------------------------------------------------------------


async def test_every_keepalive_is_acked_with_its_token_or_zeros(fh: Broker) -> None:
    async with udp(fyrehose_address(fh)) as c:
        # The seed form (docs/fyrehose-protocol.md, "Examples").
        c.send(wire.decode(bytes.fromhex("107f0000010913")))
        assert await c.next() == KeepaliveAck(wire.ZERO_TOKEN)
        c.keepalive(Flags.NOSUBSCRIBE, TOKEN)
        data, source = await c.raw()
        assert data == bytes.fromhex("20000102030405060708090a0b0c0d0e0f")
        assert source == fyrehose_address(fh)
    assert backbone_of(fh).keepalives == 2


async def test_deliver_goes_from_seq_1_to_the_named_address_or_the_source(fh: Broker) -> None:
    to = fyrehose_address(fh)
    async with udp(to) as asker, udp(to) as named, udp(to) as own:
        # asker subscribes `named`; the ACK comes back to asker, DELIVERs go to named.
        asker.send(Keepalive(named.address[0], named.address[1], token=TOKEN))
        assert await asker.next() == KeepaliveAck(TOKEN)
        own.send(Keepalive("0.0.0.0", 0, token=TOKEN))  # 0.0.0.0: the datagram's source
        assert await own.next() == KeepaliveAck(TOKEN)
        await push(fh, [b"one", b"two"])
        await push(fh, [b"three"], seed=True)
        want = [(1, b"one"), (2, b"two"), (3, b"three")]
        assert await named.delivers(3) == want
        assert await own.delivers(3) == want
        await asker.nothing(0.1)
    bb = backbone_of(fh)
    assert (bb.sequence, bb.pushed, bb.sequenced, bb.delivered) == (3, 3, 3, 6)


async def test_nosubscribe_gets_no_deliver_and_ends_a_subscription(fh: Broker) -> None:
    to = fyrehose_address(fh)
    async with udp(to) as sub, udp(to) as never, udp(to) as leaves:
        await sub.subscribe()
        await never.subscribe(Flags.NOSUBSCRIBE)
        await leaves.subscribe()
        await leaves.subscribe(Flags.NOSUBSCRIBE)
        await push(fh, [b"x"])
        assert await sub.delivers(1) == [(1, b"x")]
        await never.nothing()
        await leaves.nothing(0.05)
        assert [s.port for s in backbone_of(fh).subscribers()] == [sub.address[1]]


async def test_a_subscriber_gone_silent_stops_receiving_after_5_s(fh: Broker) -> None:
    """The one test that waits out the 5 s: `alive` goes on sending KEEPALIVE every
    second, `silent` sent one only."""
    to = fyrehose_address(fh)
    async with udp(to) as alive, udp(to) as silent:
        await alive.subscribe()
        await silent.subscribe()
        (shown,) = [s for s in backbone_of(fh).subscribers() if s.port == silent.address[1]]
        assert 4.0 < shown.expires_in <= 5.0 and shown.journaling
        await push(fh, [b"both"])
        assert await silent.delivers(1) == [(1, b"both")]
        assert await alive.delivers(1) == [(1, b"both")]
        for _ in range(6):
            await asyncio.sleep(1.0)
            await alive.subscribe()
        await push(fh, [b"alive only"])
        assert await alive.delivers(1) == [(2, b"alive only")]
        await silent.nothing()
        assert [s.port for s in backbone_of(fh).subscribers()] == [alive.address[1]]


# --- REQUEST and FORWARD ------------------------------------------------------------------


async def test_request_is_served_from_the_window(fh: Broker) -> None:
    async with udp(fyrehose_address(fh)) as r:
        await push(fh, [b"m%d" % i for i in range(1, 11)])
        await wait_for(lambda: backbone_of(fh).sequence == 10)
        r.send(Request("0.0.0.0", 0, 3, 5))
        assert await r.delivers(3) == [(3, b"m3"), (4, b"m4"), (5, b"m5")]
        r.send(Request("0.0.0.0", 0, 9, 70))  # a probe past the end: what there is
        assert await r.delivers(2) == [(9, b"m9"), (10, b"m10")]
        r.send(Request("0.0.0.0", 0, 11, 20))  # all of it ahead of the sequence
        await r.nothing()
    bb = backbone_of(fh)
    assert (bb.requests, bb.served, bb.forwarded, bb.unserved) == (3, 5, 0, 0)


async def test_an_evicted_range_is_forwarded_to_a_journaling_subscriber(
    settings: Settings,
) -> None:
    async with running(on(settings, "fyrehose", window_messages=4)) as broker:
        to = fyrehose_address(broker)
        async with udp(to) as journal, udp(to) as nojournal, udp(to) as requester:
            await journal.subscribe()
            await nojournal.subscribe(Flags.NOJOURNAL)
            await requester.subscribe()  # journaling, but never asked for its own REQUEST
            await push(broker, [b"m%d" % i for i in range(1, 11)])
            for sock in (journal, nojournal, requester):
                assert len(await sock.delivers(10)) == 10
            bb = backbone_of(broker)
            assert (bb.first_retained, bb.retained_messages) == (7, 4)
            requester.send(Request("0.0.0.0", 0, 2, 8))
            assert await requester.delivers(2) == [(7, b"m7"), (8, b"m8")]
            here = requester.address
            assert await journal.next() == Forward(here[0], here[1], 2, 6)
            await nojournal.nothing(0.1)
            await journal.subscribe(Flags.NOSUBSCRIBE)
            requester.send(Request("0.0.0.0", 0, 1, 3))  # nobody left to ask
            await requester.nothing()
            await journal.nothing(0.05)
            assert (bb.served, bb.forwarded, bb.unserved) == (2, 1, 3)


async def test_a_request_buys_at_most_request_limit_messages(settings: Settings) -> None:
    settings = on(settings, "fyrehose", request_limit=5)
    async with running(settings) as broker, udp(fyrehose_address(broker)) as r:
        await push(broker, [b"%d" % i for i in range(1, 21)])
        await wait_for(lambda: backbone_of(broker).sequence == 20)
        r.send(Request("0.0.0.0", 0, 1, 20))
        assert [s for s, _ in await r.delivers(5)] == [1, 2, 3, 4, 5]
        await r.nothing()


async def test_the_window_keeps_at_most_window_bytes_of_data() -> None:
    bb = Backbone(window_messages=100, window_bytes=25)
    for i in range(10):
        bb.sequence_message(b"%09d\n" % i)  # 10 bytes each
    assert (bb.first_retained, bb.retained_messages, bb.retained_bytes) == (9, 2, 20)
    bb.sequence_message(b"y" * 26)  # more than the whole window: kept by nobody
    assert (bb.sequence, bb.first_retained, bb.retained_bytes) == (11, 0, 0)
    assert bb.sequence_message(b"z" * (wire.MAX_DATA + 1)) is None
    assert bb.sequence == 11 and bb.dropped["too_large"] == 1


async def test_the_journaling_subscriber_is_picked_at_random() -> None:
    bb = Backbone(window_messages=1, rng=random.Random(7))
    for port in range(1000, 1004):
        bb.keepalive(Keepalive("127.0.0.2", port), ("127.0.0.2", port), 0.0)
    for _ in range(3):
        bb.sequence_message(b"x")
    picked = set()
    for _ in range(40):
        out = bb.request(Request("127.0.0.9", 9, 1, 2), ("127.0.0.9", 9), 1.0)
        ((datagram, journal),) = out
        assert wire.decode(datagram) == Forward("127.0.0.9", 9, 1, 2)
        picked.add(journal[1])
    assert picked == {1000, 1001, 1002, 1003}


async def test_past_max_subscribers_a_keepalive_is_acked_not_subscribed() -> None:
    bb = Backbone(max_subscribers=2)
    for port in (1, 2, 3):
        out = bb.keepalive(Keepalive("0.0.0.0", 0), ("127.0.0.1", port), 0.0)
        assert out == [(wire.encode(KeepaliveAck(wire.ZERO_TOKEN)), ("127.0.0.1", port))]
    assert [s.port for s in bb.subscribers(1.0)] == [1, 2]
    assert bb.dropped["subscribers_full"] == 1
    # Once one expired, there is room again.
    bb.keepalive(Keepalive("0.0.0.0", 0), ("127.0.0.1", 1), 4.0)
    bb.keepalive(Keepalive("0.0.0.0", 0), ("127.0.0.1", 3), 6.0)
    assert sorted(s.port for s in bb.subscribers(6.0)) == [1, 3]


# --- bad datagrams ------------------------------------------------------------------------


async def test_malformed_datagrams_are_counted_and_never_answered(fh: Broker) -> None:
    bad = [
        b"\x99",  # unknown type
        b"\x10\x7f\x00\x00\x01\x09",  # a truncated KEEPALIVE
        b"\x02\x00\x05hi",  # a PUSH shorter than its LENGTH
        wire.encode(Request("127.0.0.1", 1, 1, 2)) + b"!",  # trailing bytes
        b"\x04" + bytes(18),  # a REQUEST from sequence 0
    ]
    async with udp(fyrehose_address(fh)) as c:
        for data in bad:
            c.send(data)
        c.send(Deliver(1, b"a client's datagram"))
        c.send(KeepaliveAck(TOKEN))
        await c.nothing()
        bb = backbone_of(fh)
        await wait_for(lambda: bb.dropped["malformed"] + bb.dropped["unexpected"] == 7)
        assert (bb.dropped["malformed"], bb.dropped["unexpected"]) == (5, 2)
        await c.subscribe()  # and everyone is served as before
    assert fh.front_ends["fyrehose"].counters.datagrams == 8


async def test_delivers_are_dropped_and_counted_while_the_socket_is_congested(
    fh: Broker,
) -> None:
    """Loopback never fills a UDP send buffer, so the transport's own callback is called
    here as it would be; what a subscriber then sees is checked on real sockets."""
    (endpoint,) = [
        t.get_protocol()
        for t in fh.listeners._endpoints  # the listener's one endpoint
    ]
    assert isinstance(endpoint, FyrehoseEndpoint)
    bb = backbone_of(fh)
    async with udp(fyrehose_address(fh)) as sub:
        await sub.subscribe()
        endpoint.pause_writing()
        await push(fh, [b"lost", b"also lost"])
        await wait_for(lambda: bb.sequence == 2)
        await sub.nothing(0.1)
        assert bb.dropped["congested"] == 2 and bb.delivered == 0
        sub.send(Request("0.0.0.0", 0, 1, 2))  # requests are dropped too while congested
        await sub.nothing(0.1)
        endpoint.resume_writing()
        sub.send(Request("0.0.0.0", 0, 1, 2))  # and recovered from the window after
        assert await sub.delivers(2) == [(1, b"lost"), (2, b"also lost")]
        await push(fh, [b"live"])
        assert await sub.delivers(1) == [(3, b"live")]
    assert bb.dropped["congested"] == 4


# --- the bridge ---------------------------------------------------------------------------


async def test_fq_consumers_receive_pushes_and_fq_publishes_reach_subscribers(
    fh: Broker,
) -> None:
    async with Client(port=fh.port, source="c/fyreq/mem:private", reconnect=False) as fq:
        await fq.bind(EXCHANGE, b'prefix:""')
        async with udp(fyrehose_address(fh)) as sub:
            await sub.subscribe()
            await push(fh, [b"from udp"])
            async with asyncio.timeout(TIMEOUT):
                msg = await fq.receive()
            assert (msg.exchange, msg.route, msg.payload) == (EXCHANGE, b"fyrehose", b"from udp")
            assert msg.sender.startswith(b"fyrehose/127.0.0.1:")
            fq.publish(EXCHANGE, b"any route", b"from fq")
            await fq.flush()
            assert await sub.delivers(2) == [(1, b"from udp"), (2, b"from fq")]
            async with asyncio.timeout(TIMEOUT):
                assert (await fq.receive()).payload == b"from fq"  # its own, once: no loop
            fq.publish(EXCHANGE, b"big", b"b" * (wire.MAX_DATA + 1))
            fq.publish(EXCHANGE, b"after", b"fits")
            await fq.flush()
            assert await sub.delivers(1) == [(3, b"fits")]
        assert backbone_of(fh).dropped["too_large"] == 1


async def test_pushes_are_dropped_busy_while_a_block_queue_is_full(settings: Settings) -> None:
    async with running(on(settings, "fyrehose")) as broker:
        source = "c/fyrebq/mem:permanent,block,backlog=4,public"
        async with Client(port=broker.port, source=source, reconnect=False) as fq:
            await fq.bind(EXCHANGE, b'prefix:""')
        bb = backbone_of(broker)
        await push(broker, [b"p%d" % i for i in range(10)])
        await wait_for(lambda: bb.pushed + bb.dropped["busy"] == 10)
        assert bb.dropped["busy"] > 0 and bb.pushed < 10
        async with Client(port=broker.port, source=source, reconnect=False) as fq:
            async with asyncio.timeout(TIMEOUT):
                got = [(await fq.receive()).payload for _ in range(bb.pushed)]
            assert got == [b"p%d" % i for i in range(bb.pushed)]
            # Room again: PUSHes are published again (the wait for room ends soon after).
            before, busy = bb.pushed, bb.dropped["busy"]
            async with asyncio.timeout(TIMEOUT):
                while bb.pushed == before:
                    await push(broker, [b"again"])
                    await asyncio.sleep(0.02)
            assert (await fq.receive()).payload == b"again"
            assert bb.dropped["busy"] - busy < 5


# --- the sequence across restarts ---------------------------------------------------------


async def test_the_sequence_file_is_a_lease_and_an_exact_number(tmp_path: Path) -> None:
    file = SequenceFile.under(tmp_path / "queues")
    assert file.read() == 1
    assert file.lease(1) == 1 + LEASE
    assert file.read() == 1 + LEASE and file.path.read_text() == f"{1 + LEASE}\n"
    assert not file.path.with_name("sequence.tmp").exists()
    file.write(42)
    assert file.read() == 42
    file.path.write_text("forty-two\n")
    with pytest.raises(SequenceFileError, match="does not hold a sequence number"):
        file.read()
    for number in (0, wire.MAX_SEQUENCE):
        file.path.write_text(f"{number}\n")
        with pytest.raises(SequenceFileError, match=f"holds {number}, not a number from 1"):
            file.read()


async def test_the_sequence_goes_on_after_an_in_process_restart(settings: Settings) -> None:
    on(settings, "fyrehose")
    for first in (1, 3):
        async with running(settings) as broker, udp(fyrehose_address(broker)) as sub:
            await sub.subscribe()
            await push(broker, [b"a", b"b"])
            assert [s for s, _ in await sub.delivers(2)] == [first, first + 1]
    assert SequenceFile.under(settings.queue_dir).read() == 5


async def test_a_start_that_fails_skips_no_number(settings: Settings) -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as taken:
        taken.bind(("127.0.0.1", 0))
        settings.set_section(Fyrehose(listen=f"127.0.0.1:{taken.getsockname()[1]}"))
        broker = Broker(settings)
        with pytest.raises(OSError):
            await broker.start()
        await broker.stop()
    assert SequenceFile.under(settings.queue_dir).read() == 1
    async with running(on(settings, "fyrehose")) as broker, udp(fyrehose_address(broker)) as sub:
        await sub.subscribe()
        await push(broker, [b"first"])
        assert await sub.delivers(1) == [(1, b"first")]


async def start_fqd(state: Path) -> tuple[Proc, Address]:
    fqd, _ = await Proc.start_fqd(state, "--fyrehose", "127.0.0.1:0")
    line = await fqd.wait_stderr("fyrehose listening on port: ")
    return fqd, ("127.0.0.1", int(line.rsplit(" ", 1)[1]))


async def seqs_after_push(to: Address, payloads: list[bytes]) -> list[int]:
    async with udp(to) as sub:
        sub.keepalive()
        assert await sub.next() == KeepaliveAck(TOKEN)
        await push(to, payloads)
        return [s for s, _ in await sub.delivers(len(payloads))]


async def test_fqd_continues_the_sequence_after_a_clean_stop_and_a_kill(
    tmp_path: Path, procs: list[Proc]
) -> None:
    fqd, to = await start_fqd(tmp_path)
    procs.append(fqd)
    assert await seqs_after_push(to, [b"a", b"b", b"c"]) == [1, 2, 3]
    fqd.proc.send_signal(signal.SIGTERM)
    async with asyncio.timeout(TIMEOUT):
        assert await fqd.proc.wait() == 0
    fqd, to = await start_fqd(tmp_path)  # clean: exactly where it stopped
    procs.append(fqd)
    assert await seqs_after_push(to, [b"d"]) == [4]
    fqd.proc.send_signal(signal.SIGKILL)
    async with asyncio.timeout(TIMEOUT):
        await fqd.proc.wait()
    fqd, to = await start_fqd(tmp_path)  # killed: right after the last number it gave
    procs.append(fqd)
    assert await seqs_after_push(to, [b"e"]) == [5]


async def test_fqd_refuses_to_start_on_a_corrupt_sequence_file(
    tmp_path: Path, procs: list[Proc]
) -> None:
    path = tmp_path / "queues" / "fyrehose" / "sequence"
    path.parent.mkdir(parents=True)
    path.write_bytes(b"\x00\x00garbage")
    fqd = await Proc.start(
        "-m", "fqbroker", "-p", "0", "-n", "10.254.254.1", "-c", str(tmp_path / "fqd.sqlite"),
        "-q", str(tmp_path / "queues"), "--fyrehose", "127.0.0.1:0",
    )  # fmt: skip
    procs.append(fqd)
    async with asyncio.timeout(TIMEOUT):
        status, _, err = await fqd.finish()
    assert status == 2
    assert "Traceback" not in err
    (line,) = [x for x in err.splitlines() if x.startswith("fqd: ")]
    assert "fyrehose sequence file" in line and str(path) in line
    assert path.read_bytes() == b"\x00\x00garbage"  # left for the operator to look at


# --- settings -----------------------------------------------------------------------------


def test_the_fyrehose_table_and_flag(tmp_path: Path) -> None:
    toml = tmp_path / "fqd.toml"
    toml.write_text('[fqd]\nport = 0\n[fyrehose]\nlisten = "127.0.0.1:0"\nwindow_messages = 8\n')
    s = Settings.from_toml(toml)
    fyrehose = s.section(Fyrehose)
    assert fyrehose.window_messages == 8 and fyrehose.address("x") == ("127.0.0.1", 0)
    assert Settings().section(Fyrehose).address("127.0.0.1") is None
    assert Fyrehose(listen="9").address("127.0.0.5") == ("127.0.0.5", 9)
    for table, error in (
        ({"window": 1}, "unknown fyrehose setting"),
        ({"request_limit": 0}, "request_limit must be a positive integer"),
        ({"exchange": ""}, "exchange must be a string of 1 to 127 bytes"),
        ({"listen": "[::1]:5"}, "IPv4 only"),
        ({"listen": "host:port"}, "is not HOST:PORT"),
    ):
        with pytest.raises(ValueError, match=error):
            Fyrehose.from_table(table)
    from fqbroker.cli.fqd import settings_from_args

    flagged = settings_from_args(["--fyrehose", "0.0.0.0:0"])
    assert flagged.section(Fyrehose).listen == "0.0.0.0:0"
    opened = Settings().with_sections(Fyrehose(listen="0.0.0.0:7"))
    assert opened.open_to_anyone() == ["0.0.0.0"]


async def test_the_listener_asks_for_large_socket_buffers(fh: Broker) -> None:
    # A burst of PUSHes past the kernel's default receive buffer is lost before it is
    # sequenced, where nobody can ask for it again; the listener asks for more (the kernel
    # grants up to net.core.rmem_max, and Linux reports twice what it granted).
    limit = int(Path("/proc/sys/net/core/rmem_max").read_text())
    if limit < 1 << 20:
        pytest.skip(f"net.core.rmem_max is {limit}: no larger buffer to be had")
    (endpoint,) = [
        e
        for e in fh.listeners._endpoints
        if e.get_extra_info("sockname")[1] == fyrehose_address(fh)[1]
    ]
    sock = endpoint.get_extra_info("socket")
    assert sock.getsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF) >= 2 * min(limit, 8 << 20) - 1
