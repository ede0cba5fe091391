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

from fqbroker.frontends.kit.certs import Refused, certificate_login, refuse
from fqbroker.frontends.kit.component import (
    CLIENT_CERTIFICATES,
    ConnectionLimits,
    Counters,
    FrontEnd,
    LiveFrontEnd,
    OwnPort,
)
from fqbroker.frontends.kit.tls import listener_context
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
    return listener_context(settings, table.tls_cert, table.tls_key)


def _limits(settings: Settings) -> ConnectionLimits:
    return ConnectionLimits(
        handshake_seconds=settings.idle_sniff_timeout, idle_seconds=settings.idle_timeout
    )


def _state(host: OpenClusterHost, settings: Settings) -> KVStore:
    from fqbroker.storage.kv.store import KVStore

    table = settings.section(OpenCluster)
    return KVStore(
        store_path(settings), sync=table.sync, max_keys=table.max_keys, alarm=host.disk_alarm,
        inline_flush=table.inline_sync_ms / 1000,
    )  # fmt: skip


def _open(
    host: OpenClusterHost, live: LiveFrontEnd, transport: asyncio.Transport, first: bytes
) -> asyncio.BaseProtocol:
    from fqbroker.frontends.opencluster.session import OpenClusterSession
    from fqbroker.storage.kv.store import KVStore

    assert isinstance(live.state, KVStore)  # made before the port opened
    table = host.settings.section(OpenCluster)
    # Under auth = "password" a client logs in with its client certificate. Gets carry
    # only hashes of a key's name, so its user's rights are asked of the table's
    # namespace: consume to get, publish to set; a user with neither is closed (the
    # protocol has no error for a connection), one with one of them is answered
    # failinfo for the other.
    user, permissions = certificate_login(host, live, transport)
    if permissions is None:
        return Refused(host, transport)
    namespace = table.namespace.encode()
    may_get, may_set = permissions.may_consume(namespace), permissions.may_publish(namespace)
    if not (may_get or may_set):
        refuse(host, live, transport, f"user {user!r} has no right on {table.namespace!r}")
        return Refused(host, transport)
    return OpenClusterSession(host, live, transport, live.state, limits_of(table), may_get, may_set)


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
    summary="OpenCluster: a durable key/value store, int and string values with expiry",
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
    auth=CLIENT_CERTIFICATES,
    title="OpenCluster",
    counters=_counters,
    fuzz=("opencluster",),
    bench=("opencluster",),
    counts_bytes=True,
)
