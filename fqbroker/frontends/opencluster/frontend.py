"""The OpenCluster listener as a front end of the table: a port of its own, off until
``[opencluster] listen`` (or ``fqd --opencluster``) names an address; TLS when
``tls_cert`` is set, as the Figg listener's. Its store (:class:`KVStore`, under
``queue_dir``/opencluster) is the front end's state: opened before the port, closed after
the connections (docs/opencluster.md)."""

from __future__ import annotations

import asyncio
import functools
import ssl
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fqbroker.frontends.kit.component import (
    ConnectionLimits,
    Counters,
    FrontEnd,
    LiveFrontEnd,
    OwnPort,
)
from fqbroker.frontends.kit.tls import server_context
from fqbroker.frontends.opencluster.settings import OpenCluster
from fqbroker.settings.broker import Settings
from fqbroker.settings.section import Flag

# The session, its machine and wire and the store are imported when the listener opens
# or a connection is told of, not by every broker: an idle one keeps its memory
# (bench/RESULTS.md, the idle row).
if TYPE_CHECKING:
    from fqbroker.frontends.opencluster.machine import Limits
    from fqbroker.frontends.opencluster.session import OpenClusterHost
    from fqbroker.storage.kv.store import KVStore

__all__ = ["OPENCLUSTER", "limits_of", "store_path"]

Facts = tuple[tuple[str, str | int], ...]


@functools.lru_cache(maxsize=8)
def limits_of(settings: OpenCluster) -> Limits:
    """What the listener's connections share."""
    from fqbroker.frontends.opencluster.machine import Limits

    return Limits(
        settings.max_name, settings.max_value, settings.max_payload, settings.max_inflight
    )


def store_path(settings: Settings) -> Path:
    """Where the store's sqlite database is."""
    return settings.queue_dir / "opencluster" / "kv.sqlite3"


def _address(settings: Settings) -> tuple[str, int] | None:
    return settings.section(OpenCluster).address(settings.bind)


def _tls(settings: Settings) -> ssl.SSLContext | None:
    table = settings.section(OpenCluster)
    return server_context(table.tls_cert, table.tls_key)


def _limits(settings: Settings) -> ConnectionLimits:
    return ConnectionLimits(
        handshake_seconds=settings.idle_sniff_timeout, idle_seconds=settings.idle_timeout
    )


def _state(host: OpenClusterHost, settings: Settings) -> KVStore:
    from fqbroker.storage.kv.store import KVStore

    table = settings.section(OpenCluster)
    return KVStore(store_path(settings), sync=table.sync, max_keys=table.max_keys)


def _open(
    host: OpenClusterHost, live: LiveFrontEnd, transport: asyncio.Transport, first: bytes
) -> asyncio.BaseProtocol:
    from fqbroker.frontends.opencluster.session import OpenClusterSession
    from fqbroker.storage.kv.store import KVStore

    assert isinstance(live.state, KVStore)  # made before the port opened
    limits = limits_of(host.settings.section(OpenCluster))
    return OpenClusterSession(host, live, transport, live.state, limits)


def _describe(protocol: asyncio.BaseProtocol) -> Facts:
    from fqbroker.frontends.opencluster.session import OpenClusterSession

    if not isinstance(protocol, OpenClusterSession):
        return ()
    return (("inflight", protocol.machine.inflight),)


def _counters() -> Counters[Any, Any]:
    from fqbroker.frontends.opencluster.stats import COUNTERS

    return COUNTERS


OPENCLUSTER: FrontEnd[Any] = FrontEnd(
    name="opencluster",
    reach=OwnPort(_address, _open, tls=_tls),
    describe=_describe,
    state=_state,
    summary="OpenCluster (seed 001): a durable key/value store, int and string values with expiry",
    settings=OpenCluster,
    flags=(
        Flag(
            "--opencluster",
            "listen",
            "ADDR:PORT",
            "serve the OpenCluster key/value store here (off by default; port 0 picks one)",
        ),
    ),
    limits=_limits,
    title="OpenCluster",
    counters=_counters,
    fuzz=("opencluster",),
    bench=("opencluster",),
    counts_bytes=True,
)
