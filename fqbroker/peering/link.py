"""Peering's links: pull exchanges from upstream brokers into ours (fqd_peer.c,
docs/fq-protocol.md §5; docs/peering.md).

:class:`~fqbroker.peering.rows.Peering`, which every broker runs, imports this
module only once a row wants a link. Each distinct (host, port, source, password) of the
wanted rows is one :class:`PeerLink`, an fq client in peer mode carrying one bind per row;
it publishes what it receives through the same door as every front end, after the loop
check of docs/fq-protocol.md §5.2 and, with ``peer_dedupe``, the duplicate check.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import random
from dataclasses import dataclass
from enum import StrEnum
from typing import TYPE_CHECKING

from fqbroker.core.message import ZERO_MSGID, Message, accept_from_peer, runs_of
from fqbroker.errors import FqError
from fqbroker.protocols.fq import wire
from fqbroker.settings.broker import Upstream

if TYPE_CHECKING:
    from fqbroker.clients.fq.client import Client
    from fqbroker.core.publisher import Publisher

__all__ = ["PeerAddress", "PeerLink", "PeerState", "RecentIds", "split_rows"]

log = logging.getLogger(__name__)

BATCH = 1024  # messages taken from a link's inbox per routing pass
BACKOFF_START = 0.05
BACKOFF_MAX = 2.0
HEARTBEAT_MS = 1000  # a silent upstream is declared dead after three of these


@dataclass(frozen=True, slots=True)
class PeerAddress:
    """What makes one peer connection (docs/fq-protocol.md §5.1)."""

    host: str
    port: int
    source: str
    password: str
    tls: bool = False
    cafile: str = ""

    def __str__(self) -> str:
        return f"{self.host}:{self.port}"


@dataclass(frozen=True, slots=True)
class PeerBinding:
    exchange: bytes
    program: bytes
    permanent: bool

    @property
    def flags(self) -> int:
        # fqd: FQ_BIND_PEER, or 0x0111 with the permanent bits (docs/fq-protocol.md §5.2).
        return wire.BindFlags.PEER | (wire.BindFlags.PERM if self.permanent else 0)


def split_rows(rows: list[Upstream]) -> dict[PeerAddress, set[PeerBinding]]:
    wanted: dict[PeerAddress, set[PeerBinding]] = {}
    for row in rows:
        address = PeerAddress(row.host, row.port, row.source, row.password, row.tls, row.cafile)
        binding = PeerBinding(row.exchange, row.program, row.permanent_binding)
        wanted.setdefault(address, set()).add(binding)
    return wanted


class PeerState(StrEnum):
    CONNECTING = "connecting"
    CONNECTED = "connected"
    RECONNECTING = "reconnecting"
    CLOSED = "closed"


class RecentIds:
    """The last ``size`` message keys seen, to drop the copies a full mesh delivers twice."""

    def __init__(self, size: int) -> None:
        self.size = size
        self._keys: collections.OrderedDict[bytes, None] = collections.OrderedDict()

    def seen(self, msg: Message) -> bool:
        """Whether ``msg`` came before; remembers it if not."""
        if msg.msgid == ZERO_MSGID:
            return False
        # The origin is the last hop: the publisher's address as its broker stamped it.
        key = b"%b\0%b\0%b" % (msg.msgid, msg.hops[-4:], msg.sender)
        keys = self._keys
        if key in keys:
            keys.move_to_end(key)
            return True
        keys[key] = None
        if len(keys) > self.size:
            keys.popitem(last=False)
        return False


class PeerLink:
    """One connection to an upstream broker and the exchanges pulled through it."""

    def __init__(
        self, node_id: bytes, publisher: Publisher, address: PeerAddress, dedupe: RecentIds | None
    ) -> None:
        self.node_id = node_id
        self.address = address
        self.wanted: set[PeerBinding] = set()
        self.bound: dict[PeerBinding, int] = {}  # binding -> route id it got upstream
        # Refused upstream (a bad program, or a bind the link's user may not make): not
        # asked again until the row changes or the link reconnects.
        self.refused: set[PeerBinding] = set()
        # What it publishes into our router goes through its publisher, which counts it.
        self.publisher = publisher
        self.stats = self.publisher.stats
        self.looped = 0
        self.duplicates = 0
        self._dedupe = dedupe
        self._client: Client | None = None
        self._closed = False
        self._changed = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run())

    def want(self, bindings: set[PeerBinding]) -> None:
        if bindings != self.wanted:
            self.wanted = set(bindings)
            self.refused &= self.wanted
            self._changed.set()

    @property
    def state(self) -> PeerState:
        client = self._client
        if self._closed:
            return PeerState.CLOSED
        if client is None:
            return PeerState.CONNECTING
        return PeerState.CONNECTED if client.connected else PeerState.RECONNECTING

    @property
    def reconnects(self) -> int:
        return 0 if self._client is None else self._client.connections - 1

    async def close(self, *, unbind: bool) -> None:
        """Disconnect; with ``unbind`` (the row was removed) undo our bindings first.

        A broker that merely stops keeps its permanent bindings upstream, so what is
        published meanwhile waits there for it.
        """
        self._closed = True
        if unbind:
            self.wanted = set()
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        client = self._client
        if client is not None:
            if unbind and client.connected:
                with contextlib.suppress(ConnectionError, FqError, TimeoutError):
                    async with asyncio.timeout(2):
                        await self._reconcile(client)
            await client.close()

    # --- the link's life ------------------------------------------------------------------

    async def _run(self) -> None:
        client = self._client = await self._connect()
        watcher = asyncio.get_running_loop().create_task(self._watch(client))
        try:
            await self._forward(client)
        finally:
            watcher.cancel()

    async def _connect(self) -> Client:
        """Connect, retrying with backoff; from then on the client reconnects by itself."""
        from fqbroker.clients.fq.client import Client

        delay = BACKOFF_START
        while True:
            client = Client(
                self.address.host,
                self.address.port,
                self.address.source,
                self.address.password,
                heartbeat_ms=HEARTBEAT_MS,
                peer_id=self.node_id,
                connect_timeout=5.0,
                tls=self.address.tls,
                cafile=self.address.cafile or None,
            )
            try:
                await client.connect()
                return client
            except (OSError, FqError, TimeoutError) as exc:
                await client.close()
                log.info("peer %s: cannot connect: %r", self.address, exc)
            await asyncio.sleep(delay * random.uniform(0.8, 1.2))
            delay = min(delay * 2, BACKOFF_MAX)

    async def _watch(self, client: Client) -> None:
        """Keep the upstream's bindings as wanted, after every change and reconnect."""
        from fqbroker.clients.fq.client import ClientError

        while True:
            connection = client.connections
            if client.connected:
                try:
                    await self._reconcile(client)
                except (ConnectionError, ClientError) as exc:
                    log.info("peer %s: bind/unbind interrupted: %r", self.address, exc)
            self._changed.clear()
            changed = asyncio.ensure_future(self._changed.wait())
            reconnected = asyncio.ensure_future(client.wait_connected(connection))
            try:
                await asyncio.wait([changed, reconnected], return_when=asyncio.FIRST_COMPLETED)
            finally:
                changed.cancel()
                reconnected.cancel()
            if reconnected.done() and not reconnected.cancelled():
                reconnected.exception()  # retrieved: ClientClosed only comes with close()
                log.info("peer %s: connected", self.address)
                # A bind the upstream refused is asked again on each new connection: the
                # upstream's operator may have granted the link's user the right since
                # (its permissions apply to new connections, docs/security.md).
                self.refused.clear()

    async def _reconcile(self, client: Client) -> None:
        for binding in list(self.bound):
            if binding not in self.wanted:
                await client.unbind(binding.exchange, self.bound.pop(binding))
                log.info("peer %s: unbound %r", self.address, binding.exchange)
        for binding in self.wanted - self.bound.keys() - self.refused:
            route_id = await client.bind(binding.exchange, binding.program, binding.flags)
            if route_id == wire.BIND_ILLEGAL:
                self.refused.add(binding)
                log.warning(
                    "peer %s: bind of %r %r refused",
                    self.address,
                    binding.exchange,
                    binding.program,
                )
            else:
                self.bound[binding] = route_id
                log.info("peer %s: bound %r %r", self.address, binding.exchange, binding.program)

    async def _forward(self, client: Client) -> None:
        publisher = self.publisher
        while True:
            batch = await client.receive_many(BATCH)
            publisher.received(len(batch), sum(msg.peer_octets for msg in batch))
            await publisher.publish_all(runs_of([msg for msg in batch if self._admit(msg)]))

    def _admit(self, msg: Message) -> bool:
        """Whether a received message goes on into our exchange (docs/fq-protocol.md §5.2),
        counting why not."""
        if not accept_from_peer(msg, self.node_id):
            self.looped += 1
            log.debug("peer %s: received looped message %r", self.address, msg)
            return False
        if self._dedupe is not None and self._dedupe.seen(msg):
            self.duplicates += 1
            return False
        return True
