"""The broker: the routing core, the queues and the client registry, behind every front end.

This is fqd's main plus the client and queue registry of fqd_config.c. The
:class:`Broker` owns the router, the queues and the key registry; sessions call into it
and it never calls into a socket. The ports and the connections on them are
:mod:`fqbroker.server.listeners`' business, opened for each front end of the table
(:mod:`fqbroker.server.frontends`).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

from fqbroker.core.dedup import DedupLimits
from fqbroker.core.message import MsgIdCounter
from fqbroker.core.permissions import Permissions
from fqbroker.core.program import RuleRegistry, default_registry
from fqbroker.core.publisher import Publisher
from fqbroker.core.queue import Queue
from fqbroker.core.router import ClientStats, Router, RouteTimes
from fqbroker.frontends.figg.settings import Figg, topic_config
from fqbroker.frontends.fq.registry import ClientRegistry
from fqbroker.frontends.kit.certs import anonymous, plain_under_tls_required, unauthenticated
from fqbroker.frontends.kit.component import FrontEnd, LiveFrontEnd
from fqbroker.frontends.kit.heartbeats import HeartbeatClock
from fqbroker.frontends.kit.limits import Limits, install_exception_handler, raised_in_package
from fqbroker.frontends.kit.logins import LoginThrottle
from fqbroker.peering.rows import Peering
from fqbroker.server.frontends import FRONT_ENDS
from fqbroker.server.listeners import Listeners
from fqbroker.settings.broker import Settings, is_loopback, resolve_node_id
from fqbroker.storage.configdb.catalog import Catalog
from fqbroker.storage.configdb.state import ConfigStore
from fqbroker.storage.configdb.users import Users
from fqbroker.storage.diskalarm import DiskAlarm
from fqbroker.storage.files import exposed

if TYPE_CHECKING:
    from fqbroker.frontends.fyrehose.endpoint import FyrehoseHost
    from fqbroker.frontends.http.host import HttpHost
    from fqbroker.frontends.lumberjack.session import LumberjackHost
    from fqbroker.storage.topics.retained import Topics

__all__ = ["Broker"]

log = logging.getLogger(__name__)


class Broker:
    """One fq broker: router, queues, clients, and the front ends of the table
    (``front_ends``: the registered one, :mod:`fqbroker.server.frontends`, or a test's).

    fq's command and data channels and HTTP share the main port, told apart by their first
    4 bytes. Sessions are protocols on the connection's transport, not tasks: an idle client
    costs its two transports and two small objects, so a broker holds tens of thousands of
    them. HTTP, rare and short, keeps its streams and a task per connection.
    """

    def __init__(
        self,
        settings: Settings | None = None,
        front_ends: Iterable[FrontEnd[Any]] = FRONT_ENDS,
    ) -> None:
        self.settings = settings or Settings()
        self.node_id = resolve_node_id(self.settings.node_id)
        self.router = Router(self._rule_registry())
        self.router.dedup = DedupLimits(self.settings.dedup_window, self.settings.dedup_window_ids)
        # Free space of what the broker writes to, below which writes are refused or held
        # back (docs/reliability.md, "Disk alarm"); the stores add their directories.
        self.disk_alarm = DiskAlarm(
            self.settings.disk_free_limit,
            (self.settings.queue_dir, self.settings.config_db.parent),
        )
        log.info("Opening configdb %s", self.settings.config_db)
        self.catalog = Catalog(
            self.settings, self.router, ConfigStore(self.settings.config_db), self.disk_alarm
        )
        self.queues: dict[bytes, Queue] = self.catalog.queues
        self.budget = self.catalog.budget  # memory held for publishers (docs/memory.md)
        self.established = self.catalog.restore()
        # Retained topics, when the Figg listener is configured (docs/topics.md): their
        # appends share the catalog's dirty set and budget, so publishers' flush and
        # durable() cover them as they cover disk queues.
        self.topics: Topics | None = None
        if self.settings.section(Figg).listen is not None:
            # Imported here: the topic logs' code is no broker's without a Figg listener.
            from fqbroker.storage.topics.retained import Topics

            config = topic_config(self.settings)
            self.topics = Topics(
                config, self.router, self.catalog.dirty, self.catalog.budget, self.disk_alarm
            )
        self.limits = Limits(self.settings, self.queues)
        # Users and their permissions under auth = "password" (docs/security.md); their
        # tables live in the config database beside fqd's.
        self.users: Users | None = None
        if self.settings.auth == "password":
            self.users = Users(self.settings.config_db)
        # One count of password checks per source network for every listener that checks
        # passwords, so a guesser gains nothing by turning from one to another.
        self.logins = LoginThrottle()
        log.info("Established %d exchanges, %d queues, %d bindings", *self.established)
        self.msgids = MsgIdCounter()
        # Every port and connection, for each front end of the table.
        self.listeners = Listeners(self, self.settings, self.limits, front_ends)
        self._stopped = False
        self.heartbeats = HeartbeatClock()
        # Client keys to command sessions, and those sessions' host (docs/architecture.md).
        self.registry = ClientRegistry(
            self.catalog,
            self.limits,
            self.heartbeats,
            self.settings,
            self.closed,
            self.users,
            self.logins,
        )
        self.clients = self.registry.clients
        self.port = 0
        self.peering = Peering(
            self.settings, self.node_id, self.catalog.config.upstreams, self.make_publisher
        )
        # Set by HTTP /shutdown; whoever runs the broker (fqd's main) waits on it and stops.
        self.shutdown_requested = asyncio.Event()
        self.started = time.monotonic()  # for the uptime /node.json shows
        self._route_sampler: asyncio.TimerHandle | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    def _rule_registry(self) -> RuleRegistry:
        if not self.settings.modules:
            return default_registry()
        # -m modules are this broker's own, so brokers in one process never see each
        # other's functions.
        registry = RuleRegistry()
        registry.load_entry_points()
        for module in self.settings.modules:
            registry.load_module(module)
        return registry

    # --- lifecycle ------------------------------------------------------------------------

    async def start(self) -> None:
        self.listeners.check()  # two front ends on one address: refused before anything binds
        for spec in self.listeners.specs:
            # A front end that would serve anyone under auth = "password", or in plain
            # text under tls_required: refused before anything binds, naming the fix.
            problem = plain_under_tls_required(spec, self.settings) or unauthenticated(
                spec, self.settings
            )
            if problem is None and spec.refuse_start is not None and spec.claims(self.settings):
                problem = spec.refuse_start(self.settings)
            if problem is not None:
                raise ValueError(problem)
        open_hosts = self.settings.open_to_anyone(self.listeners.specs)
        if open_hosts and not self.settings.allow_open_network:
            raise ValueError(
                f'refusing to listen on {", ".join(open_hosts)} with auth = "none": anyone'
                ' who reaches it could read every queue; set auth = "password", or'
                " allow_open_network = true to serve an open network on purpose"
            )
        loop = asyncio.get_running_loop()
        install_exception_handler(loop, self.limits, self._is_ours)
        if self.topics is not None:
            self.topics.start()
        self.disk_alarm.start()  # looks once now: set before the first publisher comes
        await self.listeners.start()
        self.port = self.listeners.port
        log.info("Listening on port: %d", self.port)
        self._warn_open()
        for loose in exposed(self.settings):
            log.warning("%s is readable by other users: chmod go-rwx it (docs/security.md)", loose)
        self.peering.start()
        self._sample_routing()

    async def stop(self) -> None:
        if self._stopped:
            return
        self._stopped = True
        self.disk_alarm.stop()
        if self._route_sampler is not None:
            self._route_sampler.cancel()
            self._loop = None
        await self.peering.stop()
        await self.listeners.stop()
        self.heartbeats.close()
        if self.topics is not None:
            await self.topics.close()
        self.catalog.close()
        if self.users is not None:
            self.users.close()

    async def __aenter__(self) -> Broker:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    async def serve_forever(self) -> None:
        await self.listeners.serve_forever()

    def _sample_routing(self) -> None:
        """Have the router time its next batch, now and every RouteTimes.SAMPLE_SECONDS:
        the routing-time histogram of /metrics without a clock read per batch."""
        self.router.sample = True
        loop = self._loop
        if loop is None:  # kept: each get_running_loop is a getpid system call
            loop = self._loop = asyncio.get_running_loop()
        self._route_sampler = loop.call_later(RouteTimes.SAMPLE_SECONDS, self._sample_routing)

    def _warn_open(self) -> None:
        """Name every listener anyone who reaches it may use without a password."""
        for live in self.listeners.front_ends.values():
            if live.address is None or is_loopback(live.address[0]):
                continue
            if self.settings.auth == "none":
                why = 'auth = "none": no password is checked'
            elif not live.spec.auth.credentials and (
                not live.spec.auth.certificates or anonymous(live.spec, self.settings)
            ):
                why = "it serves clients without a login (anonymous = true)"
            else:
                continue
            log.warning(
                "%s listening on %s:%d is open to anyone (%s)", live.name, *live.address, why
            )

    # --- connections ----------------------------------------------------------------------

    @property
    def front_ends(self) -> Mapping[str, LiveFrontEnd]:
        """Each front end of the table by name: its counters, connections and address."""
        return self.listeners.front_ends

    @property
    def _http_tasks(self) -> set[asyncio.Task[None]]:
        # The HTTP front end's tasks, under the name tests wait on.
        live = self.listeners.front_ends.get("http")
        return live.tasks if live is not None else set()

    def closed(self, transport: asyncio.Transport) -> None:
        """A connection of any front end ended: give back what the limits counted."""
        self.listeners.closed(transport)

    def make_publisher(
        self, stats: ClientStats | None = None, permissions: Permissions | None = None
    ) -> Publisher:
        """A publisher into this broker's router, for one connection or link; with the
        ``permissions`` of its user under auth = "password" (None: it may publish anything)."""
        return Publisher(self.router, self.catalog.flush_dirty, stats, permissions=permissions)

    def _is_ours(self, context: dict[str, Any]) -> bool:
        """Whether an error asyncio reports came from this broker's connections or code."""
        if getattr(context.get("protocol"), "broker", None) is self:
            return True
        transport = context.get("transport")
        if transport is not None and self.listeners.owns(transport):
            return True
        sock = context.get("socket")
        if sock is not None:
            return self.listeners.listens_on(sock)
        exc = context.get("exception")
        return isinstance(exc, BaseException) and raised_in_package(exc)


if TYPE_CHECKING:

    def _serves_http(broker: Broker) -> HttpHost:
        return broker  # the Broker is the host the HTTP front end declares

    def _serves_lumberjack(broker: Broker) -> LumberjackHost:
        return broker  # and the Lumberjack listener's

    def _serves_fyrehose(broker: Broker) -> FyrehoseHost:
        return broker  # and the fyrehose listener's
