"""The Lumberjack listener as a front end of the table: a port of its own, TLS when
configured, off until ``[lumberjack] listen`` (or ``fqd --lumberjack``) names an address.

Under auth = "password" a shipper logs in with a TLS client certificate (the broker's
``tls_client_ca``; :mod:`fqbroker.frontends.kit.certs`), as Beats and Logstash secure
Lumberjack, and its user needs the publish right on ``exchange``.

The settings are read once per listener: the route template is parsed and the limits
built when the broker starts (a bad template stops fqd with its message), and every
connection shares them.
"""

from __future__ import annotations

import asyncio
import functools
import ssl
from typing import TYPE_CHECKING, Any

from fqbroker.frontends.kit.certs import Refused, certificate_login, refuse
from fqbroker.frontends.kit.component import (
    CLIENT_CERTIFICATES,
    ConnectionLimits,
    FrontEnd,
    LiveFrontEnd,
    OwnPort,
)
from fqbroker.frontends.kit.tls import listener_context
from fqbroker.frontends.lumberjack.settings import Lumberjack
from fqbroker.settings.broker import Settings
from fqbroker.settings.section import Flag

# The session, its protocol and mapping are imported when the listener opens or a
# connection is told of, not by every broker: an idle one keeps its memory
# (bench/RESULTS.md, the idle row).
if TYPE_CHECKING:
    from fqbroker.frontends.lumberjack.session import Config, LumberjackHost

__all__ = ["LUMBERJACK", "config_of"]

Facts = tuple[tuple[str, str | int], ...]


@functools.lru_cache(maxsize=8)
def config_of(settings: Lumberjack) -> Config:
    """What the listener's connections share; ValueError for a template that will not do."""
    from fqbroker.frontends.lumberjack.mapping import DEFAULT_ROUTE_TEMPLATE, RouteTemplate
    from fqbroker.frontends.lumberjack.session import Config
    from fqbroker.protocols.lumberjack.wire import Limits

    return Config(
        exchange=settings.exchange.encode(),
        template=RouteTemplate(settings.route or DEFAULT_ROUTE_TEMPLATE),
        limits=Limits(
            max_window=settings.max_window,
            max_frame=settings.max_frame,
            max_decompressed=settings.max_decompressed,
            max_fields=settings.max_fields,
        ),
        ack_idle=settings.ack_idle_ms / 1000.0,
        keepalive=settings.keepalive_seconds,
    )


def _address(settings: Settings) -> tuple[str, int] | None:
    table = settings.section(Lumberjack)
    address = table.address(settings.bind)
    if address is not None:
        config_of(table)  # the template is checked before the port opens
    return address


def _tls(settings: Settings) -> ssl.SSLContext | None:
    lumberjack = settings.section(Lumberjack)
    return listener_context(settings, lumberjack.tls_cert, lumberjack.tls_key)


def _limits(settings: Settings) -> ConnectionLimits:
    # Beats keep a connection open between batches: the broker-wide idle_timeout is
    # generous (minutes), and a held-back shipper is never idle (we are not reading it).
    return ConnectionLimits(
        handshake_seconds=settings.idle_sniff_timeout, idle_seconds=settings.idle_timeout
    )


def _open(
    host: LumberjackHost, live: LiveFrontEnd, transport: asyncio.Transport, first: bytes
) -> asyncio.BaseProtocol:
    from fqbroker.frontends.lumberjack.session import LumberjackSession

    config = config_of(host.settings.section(Lumberjack))
    # Under auth = "password" a shipper logs in with its client certificate, and its user
    # must have the publish right on the exchange every event goes to. The protocol has
    # no error frame: a refused shipper is closed (and retries, as on any close).
    user, permissions = certificate_login(host, live, transport)
    if permissions is not None and not permissions.may_publish(config.exchange):
        why = f"user {user!r} may not publish to exchange {config.exchange.decode()!r}"
        refuse(host, live, transport, why)
        permissions = None
    if permissions is None:
        return Refused(host, transport)
    session = LumberjackSession(host, live, transport, config)
    session.user = user  # whose share of the memory budget it reserves from
    return session


def _describe(protocol: asyncio.BaseProtocol) -> Facts:
    from fqbroker.frontends.lumberjack.session import LumberjackSession

    if not isinstance(protocol, LumberjackSession):
        return ()
    return (
        ("version", protocol.version),
        ("events", protocol.events),
        ("acked", protocol.acked),
        ("held", protocol.held),
    )


LUMBERJACK: FrontEnd[Any] = FrontEnd(
    name="lumberjack",
    reach=OwnPort(_address, _open, tls=_tls),
    describe=_describe,
    summary="Lumberjack v1/v2 (Elastic Beats, logstash-forwarder): log shippers publish",
    settings=Lumberjack,
    flags=(
        Flag(
            "--lumberjack",
            "listen",
            "ADDR:PORT",
            "serve Lumberjack/Beats log shippers here (off by default; port 0 picks one)",
        ),
    ),
    limits=_limits,
    auth=CLIENT_CERTIFICATES,
    title="Lumberjack",
    fuzz=("lumberjack",),
    bench=("lumberjack",),
    counts_bytes=True,
)
