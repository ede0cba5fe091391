"""The broker's ports: the shared main port and the ports front ends have of their own.

This is fqd_listener.c made a table: :class:`Listeners` opens what each
:class:`~fqbroker.frontends.kit.component.FrontEnd` of the table asks for, counts every
connection against the limits (docs/limits.md) the same way whatever front end it is
for, and closes everything at stop. Its theory of operation is :class:`Listeners`'
docstring.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import ssl
from collections.abc import Callable, Iterable, Iterator
from typing import Any, cast

from fqbroker.frontends.kit.component import (
    Datagrams,
    FrontEnd,
    LiveFrontEnd,
    OwnPort,
    Sniffed,
    preambles,
)
from fqbroker.frontends.kit.connections import peer_address
from fqbroker.frontends.kit.limits import Limits
from fqbroker.frontends.kit.tls import first_bytes, looks_like_tls, main_port_context
from fqbroker.server.deadlines import Deadlines
from fqbroker.settings.broker import Settings
from fqbroker.settings.section import refuse_shared

__all__ = ["LINGER_SECONDS", "STOP_SECONDS", "Listeners"]

log = logging.getLogger(__name__)

STOP_SECONDS = 5.0  # how long stop() waits for connections to flush and close
# How long a refused connection may still say what it is, and its answer linger.
LINGER_SECONDS = 1.0


class Listeners:
    """Every port of one broker, and every connection on them.

    ``host`` is what front ends are opened with (the broker); the listeners themselves
    only need the settings and the limits.

    On the main port a connection says what it is in its first 4 bytes
    (docs/fq-protocol.md §1.2): a :class:`_Sniffer` waits for them (at most
    ``idle_sniff_timeout``), then hands the transport to the front end whose preambles hold
    them, or closes it. On a port of its own the front end gets the connection as soon as the
    limits let it in. Either way the front end's protocol replaces ours on the transport: no
    task per connection, and nothing of ours in the path of its reads. Each front end's own
    :class:`~fqbroker.frontends.kit.component.ConnectionLimits` are applied here too: its
    connection count when it takes one, its TLS handshake deadline on its port, and its login
    and idle deadlines (:mod:`fqbroker.server.deadlines`). Before anything binds, two front
    ends claiming one address are refused (:func:`fqbroker.settings.section.refuse_shared`).

    With ``tls_cert`` set, each main-port connection is looked at before anything is read
    (:meth:`take_over`): one opening with a TLS ClientHello is served over TLS and sniffed
    inside, so fq's channels and HTTPS share the port with plain clients
    (:mod:`fqbroker.frontends.kit.tls`); ``tls_required`` closes the plain ones.
    """

    def __init__(
        self, host: object, settings: Settings, limits: Limits, front_ends: Iterable[FrontEnd[Any]]
    ) -> None:
        self.host = host
        self.settings = settings
        self.limits = limits
        front_ends = tuple(front_ends)
        claims = preambles(front_ends)  # checks the table first
        self.specs = front_ends
        self.front_ends = {spec.name: LiveFrontEnd(spec) for spec in front_ends}
        self._claims = {first4: self.front_ends[spec.name] for first4, spec in claims.items()}
        # Connections no front end owns yet (sniffing, or refused), with their address.
        self.unclaimed: dict[asyncio.Transport, str] = {}
        self.port = 0
        self._main: asyncio.Server | None = None
        self._servers: list[asyncio.Server] = []
        self._endpoints: list[asyncio.BaseTransport] = []
        self._all_closed: asyncio.Event | None = None
        self.tls: ssl.SSLContext | None = None  # the main port's, when tls_cert is set
        # Connections between their first transport and the one they are served on.
        self._handshakes: set[asyncio.Task[None]] = set()
        self._pending = 0
        self.deadlines = Deadlines(limits)

    # --- lifecycle ------------------------------------------------------------------------

    def check(self) -> None:
        """ValueError, before anything binds, for two front ends claiming one address or
        limits a front end cannot keep; each front end's limits for these settings."""
        refuse_shared(self.settings.claims(self.specs))
        for live in self.front_ends.values():
            live.limits = live.spec.limits(self.settings)
            if live.limits.login_seconds is not None and live.spec.auth.logged_in is None:
                raise ValueError(f"{live.name}: a login deadline needs its auth's logged_in")

    async def start(self) -> None:
        self.check()
        try:
            if self._claims:
                self.tls = main_port_context(self.settings)
                self._main = await self._listen(
                    self.settings.bind, self.settings.port, lambda: _Sniffer(self)
                )
                self.port = self._main.sockets[0].getsockname()[1]
                for live in self.front_ends.values():
                    if isinstance(live.spec.reach, Sniffed):
                        live.address = (self.settings.bind, self.port)
            for live in self.front_ends.values():
                await self._start_own_port(live)
        except BaseException:
            self.close_ports()  # a port taken: none of the others stays open
            await self._close_states()
            raise

    async def _start_own_port(self, live: LiveFrontEnd) -> None:
        reach = live.spec.reach
        if isinstance(reach, Sniffed):
            return
        address = reach.address(self.settings)
        if address is None:
            live.tls = False  # not configured: off, and listed as a plain port
            return
        if live.spec.state is not None:
            # Before the port opens: the first connection finds it ready.
            live.state = live.spec.state(self.host, self.settings)
        loop = asyncio.get_running_loop()
        if isinstance(reach, Datagrams):
            endpoint, _ = await loop.create_datagram_endpoint(
                lambda: reach.open(self.host, live), local_addr=address
            )
            self._endpoints.append(endpoint)
            live.address = cast(tuple[str, int], endpoint.get_extra_info("sockname")[:2])
            return
        context = reach.tls(self.settings) if reach.tls is not None else None
        live.tls = context is not None  # a front end may serve TLS only when configured so
        server = await self._listen(
            address[0],
            address[1],
            lambda: _Accept(self, live),
            ssl_context=context,
            handshake=live.limits.handshake_seconds,
        )
        self._servers.append(server)
        live.address = cast(tuple[str, int], server.sockets[0].getsockname()[:2])
        log.info("%s listening on %s:%d", live.name, *live.address)

    async def _listen(
        self,
        host: str,
        port: int,
        factory: Callable[[], asyncio.BaseProtocol],
        ssl_context: ssl.SSLContext | None = None,
        handshake: float | None = None,
    ) -> asyncio.Server:
        loop = asyncio.get_running_loop()
        server = await loop.create_server(
            factory,
            host=host,
            port=port,
            reuse_address=True,
            backlog=128,
            ssl=ssl_context,
            # A TLS client that never finishes its handshake holds a descriptor the
            # limits do not see yet: no longer than the front end allows (by default as
            # long as a silent connection on the main port).
            ssl_handshake_timeout=handshake if ssl_context else None,
        )
        for sock in server.sockets:
            # Accepted sockets inherit these (Linux): no per-connection call, and none of
            # the socket objects uvloop would build and keep for it.
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
        return server

    def close_ports(self) -> None:
        """Stop accepting: close every listening socket and UDP endpoint."""
        for server in self.servers():
            server.close()
        for endpoint in self._endpoints:
            endpoint.close()

    async def stop(self) -> None:
        """Close every port and connection; each front end ends its own first."""
        self.close_ports()
        for live in self.front_ends.values():
            if live.spec.stop is not None:
                live.spec.stop(self.host)
        tasks = [task for live in self.front_ends.values() for task in live.tasks]
        tasks += self._handshakes
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.wait(tasks, timeout=STOP_SECONDS)
        await self._close_connections()
        self.deadlines.close()
        await self._close_states()
        for server in self.servers():
            await server.wait_closed()

    async def _close_states(self) -> None:
        """Close what the front ends' ``state`` made, once no connection uses it."""
        for live in self.front_ends.values():
            if live.spec.state is None or live.state is None:
                continue
            state, live.state = live.state, None  # closed once, whatever stops it
            close = getattr(state, "close", None)
            if close is not None:
                await close()

    async def _close_connections(self) -> None:
        """Close every connection and wait for the sessions to end, before queues close.

        A session still running when the catalog closes could publish into closed queues.
        """
        if not self._any_open():
            return
        self._all_closed = asyncio.Event()
        for transport in list(self._transports()):
            transport.close()
        try:
            async with asyncio.timeout(STOP_SECONDS):
                await self._all_closed.wait()
        except TimeoutError:
            for transport in list(self._transports()):
                transport.abort()  # a client that does not read what is still queued

    async def serve_forever(self) -> None:
        assert self._main is not None
        await self._main.serve_forever()

    def servers(self) -> Iterator[asyncio.Server]:
        if self._main is not None:
            yield self._main
        yield from self._servers

    # --- connections ----------------------------------------------------------------------

    def opened(self, transport: asyncio.Transport, owner: LiveFrontEnd | None) -> str | None:
        """Count a new connection, for ``owner`` or not yet claimed; the limit it is
        over (docs/limits.md), or None."""
        address = peer_address(transport)[0] if self.limits.max_per_address > 0 else ""
        reason = self.limits.connection_opened(address)
        if owner is not None and not reason:
            reason = self.full(owner)
        if owner is None or reason:
            self.unclaimed[transport] = address
        else:
            owner.connections[transport] = address
            owner.counters.accepted += 1
            owner.counters.open += 1
        return reason

    def full(self, owner: LiveFrontEnd) -> str | None:
        """Why ``owner`` may not take one more connection (it holds as many as its limits
        allow: "frontend_connections"), or None."""
        most = owner.limits.connections
        if most is not None and owner.counters.open >= most:
            return "frontend_connections"
        return None

    def claim(self, transport: asyncio.Transport, owner: LiveFrontEnd) -> None:
        """The front end ``owner`` takes over a connection that was not yet claimed."""
        owner.connections[transport] = self.unclaimed.pop(transport)
        owner.counters.accepted += 1
        owner.counters.open += 1

    def closed(self, transport: asyncio.Transport) -> None:
        self.deadlines.forget(transport)
        address = self.unclaimed.pop(transport, None)
        if address is None:
            for live in self.front_ends.values():
                address = live.connections.pop(transport, None)
                if address is not None:
                    live.counters.open -= 1
                    break
        if address is not None:
            self.limits.connection_closed(address)
        if self._all_closed is not None and not self._any_open():
            self._all_closed.set()

    def owns(self, transport: object) -> bool:
        return transport in self.unclaimed or any(
            transport in live.connections for live in self.front_ends.values()
        )

    def listens_on(self, sock: socket.socket) -> bool:
        with contextlib.suppress(OSError):
            fileno = sock.fileno()
            return any(s.fileno() == fileno for srv in self.servers() for s in srv.sockets)
        return False

    def _any_open(self) -> bool:
        return (
            bool(self.unclaimed)
            or self._pending > 0
            or any(live.connections for live in self.front_ends.values())
        )

    def _transports(self) -> Iterator[asyncio.Transport]:
        yield from self.unclaimed
        for live in self.front_ends.values():
            yield from live.connections

    # --- handing over ---------------------------------------------------------------------

    def hand_over(
        self, transport: asyncio.Transport, first4: bytes, rest: bytes
    ) -> asyncio.TimerHandle | None:
        """Give a main-port connection to the front end its first 4 bytes name; when that
        one holds all the connections it may, refuse it instead (the refusal's timer)."""
        owner = self._claims.get(first4)
        if owner is None:
            self.limits.bad("preamble", "closing connection with unknown preamble %s", first4.hex())
            transport.close()
            return None
        if reason := self.full(owner):
            return self.refuse(transport, owner, reason)
        self.claim(transport, owner)
        reach = cast(Sniffed[Any], owner.spec.reach)
        protocol = reach.open(self.host, owner, transport, first4)
        transport.set_protocol(protocol)
        self.deadlines.watch(owner, transport, protocol)
        if isinstance(protocol, asyncio.BufferedProtocol):
            # uvloop keeps reading the way it started (data_received) until reading
            # starts again; asyncio's transports switch at set_protocol already.
            transport.pause_reading()
            transport.resume_reading()
        if rest:
            cast(asyncio.Protocol, protocol).data_received(rest)
        return None

    def refuse(
        self, transport: asyncio.Transport, owner: LiveFrontEnd | None, reason: str
    ) -> asyncio.TimerHandle:
        """Turn away a connection over a limit: the front end's answer (HTTP's 503) or a
        close (docs/fq-protocol.md §1.9's way with unknown input). An answer lingers a
        moment so that a reset cannot destroy it."""
        address, port = peer_address(transport)
        answer = b""
        if owner is not None:
            owner.counters.refused += 1
            if owner.spec.refusal is not None:
                answer = owner.spec.refusal(self.host)
        if answer:
            transport.write(answer)
            with contextlib.suppress(OSError):
                transport.write_eof()
        else:
            transport.close()
        self.limits.refuse(reason, "refusing connection from %s:%d: over %s", address, port, reason)
        return asyncio.get_running_loop().call_later(LINGER_SECONDS, transport.close)

    def claimant(self, first4: bytes) -> LiveFrontEnd | None:
        return self._claims.get(first4)

    # --- TLS on the main port -------------------------------------------------------------

    def take_over(self, transport: asyncio.Transport) -> None:
        """With TLS configured: serve a new main-port connection on a transport of our
        making (:mod:`fqbroker.frontends.kit.tls`), TLS or not as its first byte says. The one
        the server made is dropped before it reads anything; the connection stays
        counted, as pending, until its new transport is (or it is gone)."""
        address = self.unclaimed.pop(transport)
        sock = socket.socket(fileno=os.dup(transport.get_extra_info("socket").fileno()))
        sock.setblocking(False)
        transport.abort()
        self._pending += 1
        task = asyncio.get_running_loop().create_task(self._serve(sock, address))
        self._handshakes.add(task)
        task.add_done_callback(self._handshakes.discard)

    async def _serve(self, sock: socket.socket, address: str) -> None:
        settings = self.settings
        sniffer = _Sniffer(self, address)
        try:
            host, port = sock.getpeername()[:2]
            peer = f"{host}:{port}"
        except OSError:
            peer = "a client that left"
        try:
            try:
                async with asyncio.timeout(settings.idle_sniff_timeout):
                    first = await first_bytes(sock)
            except TimeoutError:
                first = b""
            tls = looks_like_tls(first)
            if not first or (settings.tls_required and not tls):
                if first:
                    self.limits.bad("tls", "closing plain connection from %s: TLS required", peer)
                sock.close()
                self._dropped(address)
                return
            loop = asyncio.get_running_loop()
            await loop.connect_accepted_socket(
                lambda: sniffer,
                sock,
                ssl=self.tls if tls else None,
                ssl_handshake_timeout=settings.idle_sniff_timeout if tls else None,
            )
        except OSError as exc:  # ssl.SSLError, TimeoutError and resets are OSErrors
            # A client that does not trust our certificate, speaks no TLS after all, or
            # goes away: one line, no traceback, and the others are served as before.
            why = getattr(exc, "reason", None) or str(exc) or type(exc).__name__
            self.limits.bad("tls", "TLS handshake with %s failed: %s", peer, why)
            self._gone(sock, sniffer, address)
        except asyncio.CancelledError:
            self._gone(sock, sniffer, address)
            raise

    def _gone(self, sock: socket.socket, sniffer: _Sniffer, address: str) -> None:
        sock.close()
        if sniffer.transport is None:  # never attached: still pending
            self._dropped(address)

    def attach(self, transport: asyncio.Transport, address: str) -> None:
        """A pending connection's new transport: counted as it was."""
        self._pending -= 1
        self.unclaimed[transport] = address

    def _dropped(self, address: str) -> None:
        self._pending -= 1
        self.limits.connection_closed(address)
        if self._all_closed is not None and not self._any_open():
            self._all_closed.set()


class _Sniffer(asyncio.Protocol):
    """A new connection on the main port until its first 4 bytes say what it is
    (docs/fq-protocol.md §1.2).

    ``address``: the connection was counted on a transport of its own before (with TLS
    configured, :meth:`Listeners.take_over`), under this source address.
    """

    __slots__ = ("address", "buffer", "listeners", "refused", "timer", "transport")

    def __init__(self, listeners: Listeners, address: str | None = None) -> None:
        self.listeners = listeners
        self.address = address
        self.buffer: bytes | None = b""
        self.refused: str | None = None  # the limit this connection is over
        self.timer: asyncio.TimerHandle | None = None
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports are not asyncio.Transport subclasses, only alike.
        transport = cast(asyncio.Transport, transport)
        listeners = self.listeners
        if self.address is not None:
            listeners.attach(transport, self.address)
        else:
            self.refused = listeners.opened(transport, None)
            if listeners.tls is not None and not self.refused:
                listeners.take_over(transport)
                return
        self.transport = transport
        # One over a limit gets a moment to say what it is, for the right answer.
        wait = LINGER_SECONDS if self.refused else listeners.settings.idle_sniff_timeout
        self.timer = asyncio.get_running_loop().call_later(wait, transport.close)

    def data_received(self, data: bytes) -> None:
        if self.buffer is None:
            return  # refused: what follows is read and thrown away until the close
        self.buffer += data
        if len(self.buffer) < 4:
            return
        assert self.timer is not None and self.transport is not None
        self.timer.cancel()
        first4, rest = self.buffer[:4], self.buffer[4:]
        if self.refused:
            self.buffer = None
            owner = self.listeners.claimant(first4)
            self.timer = self.listeners.refuse(self.transport, owner, self.refused)
            return
        self.timer = self.listeners.hand_over(self.transport, first4, rest)
        if self.timer is not None:
            self.buffer = None  # refused: what follows is thrown away

    def eof_received(self) -> bool:
        return False  # closed before saying what it is

    def connection_lost(self, exc: Exception | None) -> None:
        if self.timer is not None:
            self.timer.cancel()
        if self.transport is not None:
            self.listeners.closed(self.transport)


class _Accept(asyncio.Protocol):
    """A new connection on a front end's own port: counted, then handed over at once.

    It stays the protocol only of a connection over a limit, until that one is closed.
    """

    __slots__ = ("listeners", "owner", "timer", "transport")

    def __init__(self, listeners: Listeners, owner: LiveFrontEnd) -> None:
        self.listeners = listeners
        self.owner = owner
        self.timer: asyncio.TimerHandle | None = None
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        transport = cast(asyncio.Transport, transport)
        listeners, owner = self.listeners, self.owner
        refused = listeners.opened(transport, owner)
        if refused:
            self.transport = transport
            self.timer = listeners.refuse(transport, owner, refused)
            return
        reach = cast(OwnPort[Any], owner.spec.reach)
        protocol = reach.open(listeners.host, owner, transport, b"")
        transport.set_protocol(protocol)
        listeners.deadlines.watch(owner, transport, protocol)

    def data_received(self, data: bytes) -> None:
        pass  # refused: read and thrown away until the close

    def eof_received(self) -> bool:
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        if self.timer is not None:
            self.timer.cancel()
        if self.transport is not None:
            self.listeners.closed(self.transport)
