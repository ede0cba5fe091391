"""Which command session holds which key, and what a session asks of the broker.

This is the client half of fqd_config.c: a client's key is issued at auth and filed
here, the data socket presenting it pairs with that client, and the client's queue is
attached within its user's limits (docs/limits.md) and bound through the catalog. The
Broker builds one :class:`ClientRegistry` and hands it to every command session as its
:class:`~fqbroker.frontends.fq.command.CommandHost`.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable
from typing import TYPE_CHECKING

from fqbroker.core.bindflags import BIND_ILLEGAL
from fqbroker.errors import AuthError
from fqbroker.frontends.fq.command import LINGER_SECONDS, CommandSession
from fqbroker.frontends.kit.logins import LoginThrottle
from fqbroker.protocols.fq import wire

if TYPE_CHECKING:
    from fqbroker.core.queue import Queue
    from fqbroker.core.queuespec import QueueSpec
    from fqbroker.frontends.kit.heartbeats import HeartbeatClock
    from fqbroker.frontends.kit.limits import Limits
    from fqbroker.settings.broker import Settings
    from fqbroker.storage.configdb.catalog import Catalog
    from fqbroker.storage.configdb.users import Users

__all__ = ["ClientRegistry"]


def _text(name: bytes) -> str:
    # For an error frame: printable, whatever bytes the name holds.
    return name.decode("utf-8", errors="replace")


class ClientRegistry:
    """Client keys to command sessions; a command session's host."""

    __slots__ = (
        "_names",
        "_on_closed",
        "catalog",
        "clients",
        "heartbeats",
        "limits",
        "logins",
        "settings",
        "users",
    )

    def __init__(
        self,
        catalog: Catalog,
        limits: Limits,
        heartbeats: HeartbeatClock,
        settings: Settings,
        closed: Callable[[asyncio.Transport], None],
        users: Users | None = None,
        logins: LoginThrottle | None = None,
    ) -> None:
        self.clients: dict[bytes, CommandSession] = {}
        self.catalog = catalog
        self.limits = limits
        self.heartbeats = heartbeats
        self.settings = settings
        self._on_closed = closed
        # auth = "password": the user store passwords are checked against, and the
        # broker's login throttle, shared with every listener that checks passwords
        # (docs/security.md).
        self.users = users
        self.logins = logins if logins is not None else LoginThrottle()
        # The user names of attached clients, each one bytes object however many
        # clients share it, and how many do: a name read off the wire is a new object
        # (37 bytes and more in every idle client otherwise).
        self._names: dict[bytes, tuple[bytes, int]] = {}

    @property
    def confirm_pair_timeout(self) -> float:
        return self.settings.confirm_pair_timeout

    def closed(self, transport: asyncio.Transport) -> None:
        """A session's connection is gone: the broker's connection count drops."""
        self._on_closed(transport)

    def session(self, key: bytes) -> CommandSession | None:
        """The command session a data socket presenting ``key`` pairs with."""
        return self.clients.get(key)

    def attach(self, spec: QueueSpec, client: CommandSession) -> Queue:
        """The client's queue, found or created, within the user's limits (docs/limits.md)
        and permissions (a queue-name pattern; another user's private queue is refused)."""
        permissions = client.permissions
        assert permissions is not None, "a queue is attached once the client is authenticated"
        if not permissions.may_attach(spec.name):
            raise AuthError("permission denied: queue " + _text(spec.name))
        existing = self.catalog.queues.get(spec.name)
        if (
            existing is not None
            and existing.private
            and existing.owner not in (None, client.user)
            and not permissions.admin
        ):
            raise AuthError("permission denied: private queue of another user")
        counted = self.limits.admit_queue(spec, client.user)
        queue = self.catalog.attach(spec, client)
        # Attached (nothing refuses it now): the client's name becomes the shared one,
        # before the limits or its queue keep it; deregister counts it off.
        name, count = self._names.get(client.user, (client.user, 0))
        self._names[name] = (name, count + 1)
        client.user = name
        if counted:
            self.limits.charge(client.user, queue)
        if queue.private and queue.owner is None:
            queue.owner = client.user
        return queue

    def register(self, client: CommandSession) -> bytes:
        """Issue a fresh client key and file the client under it."""
        while True:
            key = os.urandom(wire.KEY_LEN)
            if key not in self.clients:
                self.clients[key] = client
                return key

    def deregister(self, client: CommandSession) -> None:
        """A command session ended: drop its key and data channel, maybe its queue."""
        if client.key and self.clients.get(client.key) is client:
            del self.clients[client.key]
        if client.data is not None:
            client.data.drain_then_close(LINGER_SECONDS)
        if client.queue is not None:
            self.catalog.detach(client.queue, client)
            name, count = self._names.get(client.user, (client.user, 0))
            if count > 1:
                self._names[name] = (name, count - 1)
            else:
                self._names.pop(name, None)

    def bind(self, exchange: bytes, program: bytes, queue: Queue, flags: int, user: bytes) -> int:
        """The route id of the binding, or fq's bind failure (BIND_ILLEGAL) for a program
        that does not compile or a binding over the limits (docs/limits.md)."""
        limits, router = self.limits, self.catalog.router
        if limits.bound(router, exchange, program, queue) is not None:
            return self.catalog.bind(exchange, program, queue, flags)  # no new route
        if not limits.admit_binding(exchange, queue, user):
            return BIND_ILLEGAL
        route_id = self.catalog.bind(exchange, program, queue, flags)
        if route_id != BIND_ILLEGAL:
            limits.charge_binding(user, router.exchanges[exchange].bindings[route_id])
        return route_id

    def unbind(self, exchange: bytes, route_id: int, queue: Queue) -> bool:
        return self.catalog.unbind(exchange, route_id, queue)
