"""The Figg listener as a front end of the table: a port of its own, off until ``[figg]
listen`` (or ``fqd --figg``) names an address; TLS when ``tls_cert`` is set, as the
Lumberjack listener's (our Figg client connects with ``tls``/``cafile``, and presents a
client certificate with ``certfile``/``keyfile``: under auth = "password" its subject CN is
the user, whose publish and consume rights apply per topic). A connection that sends
nothing for ``idle_seconds`` is closed by the listeners (its idle limit)."""

from __future__ import annotations

import asyncio
import functools
import ssl
from typing import TYPE_CHECKING, Any

from fqbroker.frontends.figg.settings import Figg
from fqbroker.frontends.kit.certs import Refused, certificate_login
from fqbroker.frontends.kit.component import (
    CLIENT_CERTIFICATES,
    ConnectionLimits,
    Counters,
    FrontEnd,
    LiveFrontEnd,
    OwnPort,
)
from fqbroker.frontends.kit.tls import listener_context
from fqbroker.settings.broker import Settings
from fqbroker.settings.section import Flag

# The session and its wire are imported when the listener opens or a connection is told
# of, not by every broker: an idle one keeps its memory (bench/RESULTS.md, the idle row).
if TYPE_CHECKING:
    from fqbroker.frontends.figg.session import Config, FiggHost

__all__ = ["FIGG", "config_of"]

Facts = tuple[tuple[str, str | int], ...]


def config_of(settings: Figg) -> Config:
    """What the listener's connections share."""
    return _config(settings.exchange, settings.max_frame)


@functools.lru_cache(maxsize=8)
def _config(exchange: str, max_frame: int) -> Config:
    # Keyed by the values: Figg itself is not hashable (its per-topic table is a dict).
    from fqbroker.frontends.figg.session import Config

    return Config(exchange.encode(), max_frame)


def _address(settings: Settings) -> tuple[str, int] | None:
    return settings.section(Figg).address(settings.bind)


def _tls(settings: Settings) -> ssl.SSLContext | None:
    figg = settings.section(Figg)
    return listener_context(settings, figg.tls_cert, figg.tls_key)


def _limits(settings: Settings) -> ConnectionLimits:
    return ConnectionLimits(
        handshake_seconds=settings.idle_sniff_timeout,
        idle_seconds=settings.section(Figg).idle_seconds,
    )


def _open(
    host: FiggHost, live: LiveFrontEnd, transport: asyncio.Transport, first: bytes
) -> asyncio.BaseProtocol:
    from fqbroker.frontends.figg.session import FiggSession

    # Under auth = "password" a client logs in with its client certificate; its user's
    # rights are asked per topic (FiggSession). Figg has no error frame: a refused
    # client is closed.
    user, permissions = certificate_login(host, live, transport)
    if permissions is None:
        return Refused(host, transport)
    config = config_of(host.settings.section(Figg))
    return FiggSession(host, live, transport, config, user, permissions)


def _describe(protocol: asyncio.BaseProtocol) -> Facts:
    from fqbroker.frontends.figg.session import FiggSession

    if not isinstance(protocol, FiggSession):
        return ()
    return (
        ("published", protocol.published),
        ("acked", protocol.acked),
        ("delivered", protocol.delivered),
        ("subscriptions", len(protocol.subscriptions)),
    )


def _counters() -> Counters[Any, Any]:
    from fqbroker.frontends.figg.stats import COUNTERS

    return COUNTERS


FIGG: FrontEnd[Any] = FrontEnd(
    name="figg",
    reach=OwnPort(_address, _open, tls=_tls),
    describe=_describe,
    summary="Figg: retained topics, publish with ACK, subscribe from an offset",
    settings=Figg,
    flags=(
        Flag(
            "--figg",
            "listen",
            "ADDR:PORT",
            "serve retained topics to Figg clients here (off by default; port 0 picks one)",
        ),
    ),
    limits=_limits,
    auth=CLIENT_CERTIFICATES,
    title="Figg",
    counters=_counters,
    fuzz=("figg",),
    bench=("figg",),
    counts_bytes=True,
)
