"""The OpenCluster listener's asyncio shell: one client's connection (docs/opencluster.md).

The rules are :class:`~.machine.Machine`'s; this module moves bytes. Each read goes
through the machine in one pass and what it answers is written with one
``transport.write``. Replies behind a set wait for its group commit: the session is one
of the batch's ``waiters`` and writes what the machine then answers. It owns no task.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Protocol

from fqbroker.frontends.kit.connections import WRITE, HeldReading, peer_address
from fqbroker.frontends.opencluster.machine import Limits, Machine

if TYPE_CHECKING:
    from fqbroker.frontends.kit.component import LiveFrontEnd
    from fqbroker.frontends.kit.limits import Limits as BrokerLimits
    from fqbroker.settings.broker import Settings
    from fqbroker.storage.configdb.users import Users
    from fqbroker.storage.diskalarm import DiskAlarm
    from fqbroker.storage.kv.store import Batch, KVStore

__all__ = ["OpenClusterHost", "OpenClusterSession"]

# Why reading is paused; reading resumes when none is left.
_INFLIGHT = 1  # max_inflight commands wait for their replies
_WRITE = WRITE  # the client does not read what we write
_BAD = 4  # bad input: closing once the commands before it are answered


class OpenClusterHost(Protocol):
    """What an OpenCluster session needs of the broker that accepted it."""

    settings: Settings
    limits: BrokerLimits
    users: Users | None
    disk_alarm: DiskAlarm  # its store's sets fail while raised

    def closed(self, transport: asyncio.Transport) -> None: ...


class OpenClusterSession(HeldReading, asyncio.Protocol):
    """One OpenCluster client's connection.

    Reading pauses while ``max_inflight`` commands are read and not answered (flow control,
    not an error), and while the client does not read what we write. A malformed frame is
    logged in one line (counted as bad input, ``opencluster``) and closes this connection
    only, once the commands before it are answered (their sets were applied). Goodbye
    closes once its ack is written; so does EOF, once the replies owed are.
    """

    __slots__ = (
        "_eof",
        "_holds",
        "_last",
        "_loop",
        "_waiting",
        "broker",
        "closing",
        "live",
        "machine",
        "transport",
    )

    def __init__(
        self,
        host: OpenClusterHost,
        live: LiveFrontEnd,
        transport: asyncio.Transport,
        store: KVStore,
        limits: Limits,
        may_get: bool = True,
        may_set: bool = True,
    ) -> None:
        # Named so because the loop's exception handler asks a protocol for its broker.
        self.broker = host
        self.live = live
        self.transport = transport
        self.machine = Machine(store, limits, may_get, may_set)
        self._waiting: Batch | None = None  # the batch we are a waiter of
        self._holds = 0
        self._eof = False
        self.closing = False
        # Kept: get_running_loop() is a getpid() each call, once a read.
        self._loop = asyncio.get_running_loop()
        self._last = self._loop.time()

    def last_input(self) -> float | None:
        """When input last came (loop time), for the listeners' idle limit; None while
        reading is held back (the client waits for our replies, not we for its input)."""
        return None if self._holds else self._last

    # --- protocol -------------------------------------------------------------------------

    def data_received(self, data: bytes) -> None:
        if self.closing:
            return
        self.live.counters.bytes_in += len(data)  # type: ignore[operator]  # counts_bytes
        self._last = self._loop.time()
        self._after(self.machine.receive(data))

    def eof_received(self) -> bool:
        # The replies owed are written before the close (_after); a TLS transport closes
        # at EOF whatever we answer.
        self._eof = True
        if not self.machine.queue:
            return False
        return self.transport.get_extra_info("ssl_object") is None

    def connection_lost(self, exc: Exception | None) -> None:
        self.closing = True
        self.broker.closed(self.transport)

    def close(self) -> None:
        self.closing = True
        self.transport.close()  # what was written still goes out first

    # --- the machine's answers ------------------------------------------------------------

    def _after(self, out: bytes) -> None:
        """Write what the machine answered, then act on its state."""
        machine = self.machine
        if out:
            self.live.counters.bytes_out += len(out)  # type: ignore[operator]
            self.transport.write(out)
        if machine.error is not None and not self._holds & _BAD:
            self.broker.limits.bad(
                "opencluster", "closing OpenCluster connection from %s: %s",
                "{}:{}".format(*peer_address(self.transport)), machine.error,
            )  # fmt: skip
            self._hold(_BAD)  # nothing more is read; the commands before it are answered
        if machine.finished or (not machine.queue and (self._eof or machine.error is not None)):
            self.close()
            return
        batch = machine.waiting
        if batch is not None and batch is not self._waiting:
            self._waiting = batch
            if batch.done:
                self._loop.call_soon(self._committed)
            else:
                batch.waiters.append(self._committed)
        if machine.full:
            self._hold(_INFLIGHT)
        elif self._holds & _INFLIGHT:
            self._release(_INFLIGHT)

    def _committed(self) -> None:
        self._waiting = None
        if not self.closing:
            self._after(self.machine.committed())
