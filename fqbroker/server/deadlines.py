"""The deadlines a front end declares for its connections: to log in, and without input.

A front end's :class:`~fqbroker.frontends.kit.component.ConnectionLimits` may give
``login_seconds`` (its :class:`~fqbroker.frontends.kit.component.Auth` says when a
connection logged in) and ``idle_seconds`` (its sessions say when input last came,
:class:`~fqbroker.frontends.kit.component.Watched`). The listeners keep them here, for
every front end alike, so no session keeps a timer of its own for them.

A front end with a login deadline and no idle one (fq's channels) costs one entry in a
queue per front end while a connection has not logged in, under one timer for the queue:
every connection starts one, and ten thousand clients connecting at once should not each
carry a timer and a watch until it fires.
"""

from __future__ import annotations

import asyncio
import collections
import logging
from typing import cast

from fqbroker.frontends.kit.component import LiveFrontEnd, Watched
from fqbroker.frontends.kit.connections import peer_address
from fqbroker.frontends.kit.limits import Limits

__all__ = ["Deadlines"]


class Deadlines:
    """One broker's per-connection deadlines, by transport.

    A connection of a front end without deadlines costs nothing here. An idle check that
    finds input came meanwhile waits for the rest of the period (at least a quarter of it):
    one timer per connection, moved on only when it fires, never per read.
    """

    __slots__ = ("_logins", "_watches", "limits")

    def __init__(self, limits: Limits) -> None:
        self.limits = limits
        self._watches: dict[asyncio.Transport, _Watch] = {}
        self._logins: dict[LiveFrontEnd, _Logins] = {}

    def watch(
        self, live: LiveFrontEnd, transport: asyncio.Transport, protocol: asyncio.BaseProtocol
    ) -> None:
        """Start the deadlines ``live`` declares for a connection it has just taken over."""
        limits = live.limits
        if limits.idle_seconds is None:
            if limits.login_seconds is None:
                return
            logins = self._logins.get(live)
            if logins is None:
                logins = self._logins[live] = _Logins(self, live, limits.login_seconds)
            logins.add(transport, protocol)
            return
        self._watches[transport] = _Watch(self, live, transport, protocol)

    def forget(self, transport: asyncio.Transport) -> None:
        """A connection ended: its timers go with it."""
        if self._watches:
            watch = self._watches.pop(transport, None)
            if watch is not None:
                watch.cancel()
        for logins in self._logins.values():
            # Not kept to its deadline: a closed connection's buffers go with it now.
            logins.queue.pop(transport, None)

    def kept(self) -> int:
        """How many connections have deadlines kept here now."""
        return len(self._watches) + sum(len(logins.queue) for logins in self._logins.values())

    def close(self) -> None:
        for watch in self._watches.values():
            watch.cancel()
        self._watches.clear()
        for logins in self._logins.values():
            logins.cancel()
        self._logins.clear()

    def expired(self, live: LiveFrontEnd, transport: asyncio.Transport, why: str) -> None:
        """Close a connection past one of its deadlines, in one rate-limited line."""
        seconds = live.limits.login_seconds if why == _NOT_LOGGED_IN else live.limits.idle_seconds
        self.limits.log.log(
            logging.INFO,
            live.name,
            "closing %s connection from %s: " + why,
            live.spec.title or live.name,
            "{}:{}".format(*peer_address(transport)),
            seconds,
        )
        self.forget(transport)
        transport.close()


_NOT_LOGGED_IN = "not logged in after %gs"


class _Logins:
    """The connections of one front end that have yet to log in, oldest first.

    They share one deadline length, so arrival order is deadline order: one timer, for
    the oldest. A connection that logs in stays queued until its time comes and is then
    passed over; one that ends leaves the queue at once (``Deadlines.forget``).
    """

    __slots__ = ("deadlines", "live", "queue", "seconds", "timer")

    def __init__(self, deadlines: Deadlines, live: LiveFrontEnd, seconds: float) -> None:
        self.deadlines = deadlines
        self.live = live
        self.seconds = seconds
        # transport -> (its deadline, its protocol), oldest first
        self.queue: collections.OrderedDict[
            asyncio.Transport, tuple[float, asyncio.BaseProtocol]
        ] = collections.OrderedDict()
        self.timer: asyncio.TimerHandle | None = None

    def add(self, transport: asyncio.Transport, protocol: asyncio.BaseProtocol) -> None:
        loop = asyncio.get_running_loop()
        due = loop.time() + self.seconds
        self.queue[transport] = (due, protocol)
        if self.timer is None:
            self.timer = loop.call_at(due, self._due)

    def cancel(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        self.queue.clear()

    def _due(self) -> None:
        self.timer = None
        loop = asyncio.get_running_loop()
        now = loop.time()
        queue = self.queue
        logged_in = self.live.spec.auth.logged_in
        while queue:
            transport, (due, protocol) = next(iter(queue.items()))
            if due > now:
                self.timer = loop.call_at(due, self._due)
                return
            del queue[transport]
            if transport.is_closing() or logged_in is None or logged_in(protocol):
                continue
            self.deadlines.expired(self.live, transport, _NOT_LOGGED_IN)


class _Watch:
    """One connection's deadlines."""

    __slots__ = ("deadlines", "idle", "live", "login", "protocol", "transport")

    def __init__(
        self,
        deadlines: Deadlines,
        live: LiveFrontEnd,
        transport: asyncio.Transport,
        protocol: asyncio.BaseProtocol,
    ) -> None:
        self.deadlines = deadlines
        self.live = live
        self.transport = transport
        self.protocol = protocol
        loop = asyncio.get_running_loop()
        limits = live.limits
        self.login: asyncio.TimerHandle | None = None
        self.idle: asyncio.TimerHandle | None = None
        if limits.login_seconds is not None:
            self.login = loop.call_later(limits.login_seconds, self._on_login)
        if limits.idle_seconds is not None:
            self.idle = loop.call_later(limits.idle_seconds, self._on_idle)

    def cancel(self) -> None:
        for handle in (self.login, self.idle):
            if handle is not None:
                handle.cancel()
        self.login = self.idle = None

    def _on_login(self) -> None:
        self.login = None
        logged_in = self.live.spec.auth.logged_in
        if logged_in is None or logged_in(self.protocol):
            return
        self.deadlines.expired(self.live, self.transport, _NOT_LOGGED_IN)

    def _on_idle(self) -> None:
        self.idle = None
        idle = cast(float, self.live.limits.idle_seconds)
        loop = asyncio.get_running_loop()
        last = cast(Watched, self.protocol).last_input()
        if last is None:
            # The session holds reading: we are the ones not reading its input.
            self.idle = loop.call_later(idle / 4, self._on_idle)
            return
        wait = last + idle - loop.time()
        if wait > 0.001:
            self.idle = loop.call_later(max(wait, idle / 4), self._on_idle)
            return
        self.deadlines.expired(self.live, self.transport, "nothing received for %gs")
