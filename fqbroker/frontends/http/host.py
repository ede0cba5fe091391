"""What the HTTP front end reads of its host: narrow Protocols the Broker satisfies.

The HTTP modules never import the broker (not even for types): the broker imports the
front ends, through the table in :mod:`fqbroker.server.frontends`, and never the other
way round. Each Protocol lists what one part reads, read-only, so a plain attribute of
the broker satisfies it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Collection, Iterable, Iterator, Mapping
from typing import Any, Protocol

from fqbroker.core.budget import MemoryBudget
from fqbroker.core.message import MsgIdCounter
from fqbroker.core.publisher import Publisher
from fqbroker.core.queue import Queue
from fqbroker.core.router import ClientStats, Router
from fqbroker.frontends.http.auth import UsersView
from fqbroker.frontends.kit.component import LiveFrontEnd
from fqbroker.frontends.kit.limits import Limits
from fqbroker.frontends.kit.logins import LoginThrottle
from fqbroker.settings.broker import Settings
from fqbroker.storage.configdb.catalog import Catalog
from fqbroker.storage.diskalarm import DiskAlarm
from fqbroker.storage.store import DiskStore

__all__ = [
    "AdminPeeringView",
    "DataChannelView",
    "FqClientView",
    "HttpHost",
    "PeerLinkView",
    "PeeringView",
    "QueueSource",
    "StatsSource",
    "TopicReaderView",
    "TopicSource",
    "TopicView",
    "TopicsView",
    "UsersAdminView",
]


class QueueSource(Protocol):
    """The queues by name: what the replay reads and the checkpoints look up."""

    @property
    def queues(self) -> Mapping[bytes, Queue]: ...


class TopicReaderView(Protocol):
    """A registered subscriber of a topic (a Figg session's attachment)."""

    @property
    def offset(self) -> int: ...  # the offset after the last message sent
    @property
    def remote(self) -> str: ...


class TopicView(Protocol):
    """A retained topic (fqbroker.storage.topics.retained.Topic) as reads and stats see it."""

    @property
    def name(self) -> bytes: ...
    @property
    def store(self) -> DiskStore: ...
    @property
    def first_offset(self) -> int: ...
    @property
    def last_offset(self) -> int: ...
    @property
    def size_bytes(self) -> int: ...
    @property
    def messages_in(self) -> int: ...
    @property
    def subscribers(self) -> Collection[TopicReaderView]: ...
    @property
    def closed(self) -> bool: ...  # the broker is stopping: its files are closing


class TopicsView(Protocol):
    def get(self, name: bytes) -> TopicView | None: ...
    def __iter__(self) -> Iterator[TopicView]: ...
    def __len__(self) -> int: ...


class TopicSource(Protocol):
    """The retained topics, or None when the Figg listener is not configured."""

    @property
    def topics(self) -> TopicsView | None: ...


class DataChannelView(Protocol):
    @property
    def is_peer(self) -> bool: ...


class FqClientView(Protocol):
    """An fq command session as /stats.json shows it (a client of a queue)."""

    @property
    def user(self) -> bytes: ...
    @property
    def remote_addr(self) -> str: ...
    @property
    def remote_port(self) -> int: ...
    @property
    def stats(self) -> ClientStats: ...
    @property
    def data(self) -> DataChannelView | None: ...


class PeerAddressView(Protocol):
    @property
    def host(self) -> str: ...
    @property
    def port(self) -> int: ...
    @property
    def source(self) -> str: ...


class PeerBindingView(Protocol):
    @property
    def exchange(self) -> bytes: ...
    @property
    def program(self) -> bytes: ...
    @property
    def permanent(self) -> bool: ...


class PeerLinkView(Protocol):
    """An upstream this broker pulls from (docs/fq-protocol.md §5), as stats.json shows
    it."""

    @property
    def address(self) -> PeerAddressView: ...
    @property
    def state(self) -> object: ...
    @property
    def reconnects(self) -> int: ...
    @property
    def looped(self) -> int: ...
    @property
    def duplicates(self) -> int: ...
    @property
    def wanted(self) -> Iterable[PeerBindingView]: ...
    @property
    def bound(self) -> Mapping[Any, int]: ...
    @property
    def stats(self) -> ClientStats: ...


class PeeringView(Protocol):
    @property
    def links(self) -> Mapping[Any, PeerLinkView]: ...


class AdminPeeringView(PeeringView, Protocol):
    """Peering as the admin API changes it: after a row changes, apply it now."""

    async def reconcile(self) -> None: ...


class UsersAdminView(UsersView, Protocol):
    """The user table (fqbroker.storage.configdb.users.Users) as the admin API changes it."""

    def add(self, name: str, password: str, iterations: int = ...) -> None: ...
    def remove(self, name: str) -> bool: ...
    def names(self) -> list[str]: ...
    def rules(self, name: str) -> list[tuple[str, str, bool]]: ...
    def allow(self, name: str, kind: str, pattern: str) -> None: ...
    def deny(self, name: str, kind: str, pattern: str) -> None: ...


class StatsSource(QueueSource, Protocol):
    """Everything a snapshot (/stats.json, /metrics, /frontends.json) reads."""

    @property
    def node_id(self) -> bytes: ...
    @property
    def router(self) -> Router: ...
    @property
    def clients(self) -> Mapping[bytes, FqClientView]: ...
    @property
    def peering(self) -> PeeringView: ...
    @property
    def limits(self) -> Limits: ...
    @property
    def budget(self) -> MemoryBudget: ...
    @property
    def front_ends(self) -> Mapping[str, LiveFrontEnd]: ...
    @property
    def disk_alarm(self) -> DiskAlarm: ...


class HttpHost(StatsSource, TopicSource, Protocol):
    """What an HTTP connection uses of the broker."""

    @property
    def settings(self) -> Settings: ...
    @property
    def msgids(self) -> MsgIdCounter: ...
    @property
    def catalog(self) -> Catalog: ...
    @property
    def shutdown_requested(self) -> asyncio.Event: ...
    @property
    def users(self) -> UsersAdminView | None: ...  # None under auth = "none"
    @property
    def logins(self) -> LoginThrottle: ...  # the broker's one login throttle
    @property
    def peering(self) -> AdminPeeringView: ...
    @property
    def started(self) -> float: ...  # time.monotonic() when the broker was made

    def closed(self, transport: asyncio.Transport) -> None: ...

    def make_publisher(self, stats: ClientStats | None = None) -> Publisher: ...
