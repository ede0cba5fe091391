"""The fyrehose listener's asyncio shell: one UDP endpoint and the router target behind it.

The backbone's state and rules are :mod:`.backbone`'s; this module moves datagrams. A PUSH
becomes one fq message on ``[fyrehose] exchange`` (sender ``fyrehose/ip:port``), published
through the listener's :class:`~fqbroker.core.publisher.Publisher`; :class:`FyrehoseSink`,
bound with ``prefix:""`` on that exchange straight on the router (never persisted), numbers
every message published there and sends its DELIVERs. Malformed datagrams are dropped and
counted, never logged. docs/fyrehose.md says what is dropped under congestion and why.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol, cast

from fqbroker.core.frames import ID_SIZE, encode_peer
from fqbroker.core.router import Sink
from fqbroker.errors import FyrehoseProtocolError
from fqbroker.frontends.fyrehose.backbone import Address, Backbone, Out
from fqbroker.frontends.fyrehose.sequence import LAST, LEASE, SequenceFile
from fqbroker.frontends.fyrehose.settings import Fyrehose
from fqbroker.protocols.fyrehose import wire

if TYPE_CHECKING:
    from fqbroker.core.message import MsgIdCounter, Run
    from fqbroker.core.publisher import Publisher
    from fqbroker.core.router import ClientStats, Router
    from fqbroker.frontends.kit.component import LiveFrontEnd
    from fqbroker.settings.broker import Settings

__all__ = ["SINK_PROGRAM", "FyrehoseEndpoint", "FyrehoseHost", "FyrehoseSink", "payload_of"]

log = logging.getLogger(__name__)

SINK_PROGRAM = b'prefix:""'  # the sink's binding: every route of the exchange
SOCKET_BUFFER = 8 << 20  # asked of the kernel for the listener's socket, both ways
RETRY_LEASE = 1024  # numbers given before a lease that could not be written is tried again


class FyrehoseHost(Protocol):
    """What the fyrehose listener needs of the broker that runs it."""

    node_id: bytes
    settings: Settings
    router: Router
    msgids: MsgIdCounter

    def make_publisher(self, stats: ClientStats | None = None) -> Publisher: ...


def payload_of(frame: bytes) -> bytes:
    """The payload of a whole peer frame (what :func:`~fqbroker.core.frames.peer_fields`
    finds last, without making the other five)."""
    at = 1 + frame[0]  # past the exchange
    at += 1 + frame[at] + ID_SIZE  # the route and the message id
    at += 1 + frame[at]  # the sender
    at += 1 + 4 * frame[at]  # the hops
    return frame[at + 4 :]


def sender_for(address: Address) -> bytes:
    """``b"fyrehose/ip:port"``: who PUSHed a message, as fq consumers see it."""
    return f"fyrehose/{address[0]}:{address[1]}".encode()


class FyrehoseSink(Sink):
    """The router target that sequences every message on the exchange and sends it to
    the live subscribers. Never full, never blocks: UDP cannot wait for anyone."""

    name = b"(fyrehose)"  # not a queue: what stats and the web UI show for its binding

    def __init__(self, endpoint: FyrehoseEndpoint) -> None:
        self.endpoint = endpoint

    def offer(self, frames: list[bytes], size: int = -1) -> int:
        endpoint = self.endpoint
        backbone = endpoint.backbone
        targets = backbone.targets(endpoint.now())  # one clock read per batch
        sequence = backbone.sequence_message
        sendto = endpoint.sendto
        congested = endpoint.congested
        taken = 0
        for frame in frames:
            datagram = sequence(payload_of(frame))
            if datagram is None:
                continue  # over MAX_DATA: counted too_large
            taken += 1
            if congested:
                continue
            for target in targets:
                sendto(datagram, target)
        if targets:
            if congested:
                backbone.dropped["congested"] += taken * len(targets)
            else:
                backbone.delivered += taken * len(targets)
        return taken


class FyrehoseEndpoint(asyncio.DatagramProtocol):
    """The listener's UDP endpoint: decode, publish, answer, deliver.

    A PUSH is published with our node id as its hop; KEEPALIVE and REQUEST go to the
    backbone, whose answers are sent here; DELIVER, FORWARD and KEEPALIVE-ACK are clients'
    datagrams, counted ``unexpected``. While the send buffer is full, DELIVERs are dropped
    (``congested``); while a block-policy queue on the exchange is full, PUSHes are
    (``busy``): the client sends again when its PUSH does not come back.
    """

    def __init__(
        self, host: FyrehoseHost, live: LiveFrontEnd, backbone: Backbone, file: SequenceFile
    ) -> None:
        self.host = host
        self.live = live
        self.backbone = backbone
        self.file = file
        settings = host.settings.section(Fyrehose)
        self.exchange = settings.exchange.encode()
        self.route = settings.route.encode()
        self.publisher = host.make_publisher()
        self.sink = FyrehoseSink(self)
        self.transport: asyncio.DatagramTransport | None = None
        self.now: Callable[[], float] = asyncio.get_running_loop().time
        self.congested = False  # the send buffer is full: DELIVERs are dropped
        self._waiting: asyncio.Task[None] | None = None  # the publisher waits for room
        self._lifetime: asyncio.Task[None] | None = None
        self._runs: list[Run] = []  # this loop turn's PUSHes
        self._octets = 0
        self.closed = False

    # --- protocol -------------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # Not always a DatagramTransport subclass (the selector loop's is not), but one.
        self.transport = cast(asyncio.DatagramTransport, transport)
        sock = transport.get_extra_info("socket")
        if sock is not None:
            # UDP has no flow control: a burst of PUSHes past the kernel's default receive
            # buffer (~208 KiB) is lost before it is sequenced, where nobody can request it
            # back (bench/RESULTS.md, the fyrehose backbone). The kernel caps what we ask at
            # net.core.rmem_max / wmem_max.
            for option in (socket.SO_RCVBUF, socket.SO_SNDBUF):
                with contextlib.suppress(OSError):
                    sock.setsockopt(socket.SOL_SOCKET, option, SOCKET_BUFFER)
        self.live.state = self.backbone
        self.host.router.bind(self.exchange, SINK_PROGRAM, self.sink)
        self._lifetime = asyncio.get_running_loop().create_task(self._until_stopped())
        self.live.track(self._lifetime)

    async def _until_stopped(self) -> None:
        # The broker cancels its front ends' tasks when it stops, before it closes the
        # queues and returns; connection_lost comes only some loop turns after the
        # endpoint is closed. Closing here makes the final sequence write happen before
        # stop() returns (tests and fqd read the file right after).
        try:
            await asyncio.Event().wait()
        finally:
            self.close()

    def datagram_received(self, data: bytes, addr: Address) -> None:
        self.live.counters.datagrams += 1  # type: ignore[operator]  # set for Datagrams
        backbone = self.backbone
        try:
            d = wire.decode(data)
        except FyrehoseProtocolError:
            backbone.dropped["malformed"] += 1
            return
        source = (addr[0], addr[1])
        if isinstance(d, wire.Push):
            self._push(d.data, source)
        elif isinstance(d, wire.Keepalive):
            self._send(backbone.keepalive(d, source, self.now()))
        elif isinstance(d, wire.Request):
            self._send(backbone.request(d, source, self.now()))
        else:
            backbone.dropped["unexpected"] += 1

    def error_received(self, exc: Exception) -> None:
        # An ICMP error for something we sent (a subscriber gone, port unreachable): UDP
        # is fire and forget, and the subscriber expires on its own.
        pass

    def pause_writing(self) -> None:
        self.congested = True

    def resume_writing(self) -> None:
        self.congested = False

    def connection_lost(self, exc: Exception | None) -> None:
        self.close()

    def close(self) -> None:
        """Unbind, stop publishing and write the exact next sequence (a clean stop)."""
        if self.closed:
            return
        self.closed = True
        self.host.router.unbind_queue(self.sink)
        for task in (self._waiting, self._lifetime):
            if task is not None and task is not asyncio.current_task():
                task.cancel()
        self._waiting = self._lifetime = None
        self.publisher.close()
        try:
            self.file.write(self.backbone.sequence + 1)
        except OSError as exc:
            # The lease on disk stands: the next start skips to it, reusing nothing.
            log.error("fyrehose: cannot write %s at stop: %s", self.file.path, exc)
        self.backbone.mark = bytearray(LAST.size)  # nothing is numbered after a stop
        self.file.close_mark()

    # --- out ------------------------------------------------------------------------------

    def sendto(self, datagram: bytes, address: Address) -> None:
        transport = self.transport
        if transport is None:
            return
        try:  # noqa: SIM105  (per datagram: a try costs nothing, a context manager does)
            transport.sendto(datagram, address)
        except OSError:
            pass  # an address no datagram can go to (a KEEPALIVE may name any)

    def _send(self, out: list[Out]) -> None:
        sendto = self.sendto
        for datagram, address in out:
            if self.congested and datagram[0] == wire.DELIVER:
                self.backbone.dropped["congested"] += 1
                continue
            sendto(datagram, address)

    # --- in -------------------------------------------------------------------------------

    def _push(self, data: bytes, source: Address) -> None:
        backbone = self.backbone
        if self._waiting is not None or self.closed:
            backbone.dropped["busy"] += 1
            return
        host = self.host
        frame = encode_peer(
            self.exchange, self.route, host.msgids.next(), sender_for(source), host.node_id, data
        )
        backbone.pushed += 1
        # The PUSHes of one loop turn are published as one run: the publisher's cost per
        # call (flushing, counting) is paid once for a burst, as a stream read's is.
        runs = self._runs
        if not runs:
            asyncio.get_running_loop().call_soon(self._publish)
        head = len(frame) - len(data)  # a run's frames share their head's size
        if runs and runs[-1][3] == head:
            runs[-1][2].append(frame)
        else:
            runs.append((self.exchange, self.route, [frame], head))
        self._octets += len(frame)

    def _publish(self) -> None:
        runs, octets = self._runs, self._octets
        self._runs, self._octets = [], 0
        if not runs or self.closed:
            return
        if not self.publisher.publish(runs, octets):
            self._waiting = asyncio.get_running_loop().create_task(self._finish())
            self.live.track(self._waiting)

    async def _finish(self) -> None:
        await self.publisher.finish()
        self._waiting = None


def renewer(file: SequenceFile) -> Callable[[int], int]:
    """The backbone's ``renew``: a new lease from ``seq`` on. A lease that cannot be
    written is logged and tried again a little later; the numbers go on meanwhile (the
    subscribers' stream matters more than a crash during a full disk)."""

    def renew(seq: int) -> int:
        try:
            return file.lease(seq)
        except OSError as exc:
            log.error("fyrehose: cannot write the sequence lease to %s: %s", file.path, exc)
            return seq + min(RETRY_LEASE, LEASE)

    return renew
