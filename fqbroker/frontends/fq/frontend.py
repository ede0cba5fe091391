"""fq's two front ends on the main port: the command channel, and the data channel
(publisher and peer modes), each claimed by its 4-byte magic (docs/fq-protocol.md §1.2,
:class:`wire.Mode`).

The sessions are built here and handed the transport; they tell the broker when they
end (``closed(transport)``), which keeps the connection accounting right.
"""

from __future__ import annotations

import asyncio
from typing import Any

from fqbroker.frontends.fq.command import CommandSession
from fqbroker.frontends.fq.data import DataSession
from fqbroker.frontends.kit.component import (
    Auth,
    ConnectionLimits,
    FrontEnd,
    LiveFrontEnd,
    Sniffed,
)
from fqbroker.protocols.fq import wire
from fqbroker.settings.broker import Settings

__all__ = ["COMMAND", "DATA"]

Facts = tuple[tuple[str, str | int], ...]


def _preamble(mode: wire.Mode) -> bytes:
    return int(mode).to_bytes(4, "big")


# The sessions declare the host they need (today the Broker itself); the table only
# passes it through.
def _open_command(
    host: Any, live: LiveFrontEnd, transport: asyncio.Transport, first4: bytes
) -> asyncio.BaseProtocol:
    return CommandSession(host.registry, transport)


def _open_data(
    host: Any, live: LiveFrontEnd, transport: asyncio.Transport, first4: bytes
) -> asyncio.BaseProtocol:
    return DataSession(host, wire.Mode(int.from_bytes(first4, "big")), transport)


def _describe_command(protocol: asyncio.BaseProtocol) -> Facts:
    if not isinstance(protocol, CommandSession):
        return ()
    queue = protocol.queue.name.decode(errors="replace") if protocol.queue else ""
    return (("user", protocol.user.decode(errors="replace")), ("queue", queue))


def _describe_data(protocol: asyncio.BaseProtocol) -> Facts:
    if not isinstance(protocol, DataSession):
        return ()
    mode = "peer" if protocol.is_peer else "client"
    owner = protocol.owner
    user = owner.user.decode(errors="replace") if owner is not None else ""
    return (("mode", mode), ("user", user))


def _logged_in(protocol: asyncio.BaseProtocol) -> bool:
    return isinstance(protocol, CommandSession) and bool(protocol.key)


def _paired(protocol: asyncio.BaseProtocol) -> bool:
    return isinstance(protocol, DataSession) and protocol.owner is not None


def _limits(settings: Settings) -> ConnectionLimits:
    # A login deadline only, under auth = "none" too (fq's auth request is the first
    # frame). No idle limit once logged in: a consumer that asked no heartbeats may
    # rightly send nothing for hours (fq-recv, the C tools), and one that asked them is
    # closed by fq's own rule when it misses three.
    return ConnectionLimits(login_seconds=settings.login_timeout)


def _close_clients(host: Any) -> None:
    # Each command session ends its data channel and leaves its queue as a client's
    # close would, before the broker closes what is left.
    for session in list(host.clients.values()):
        session.close()


COMMAND: FrontEnd[Any] = FrontEnd(
    name="fq-command",
    reach=Sniffed(frozenset({_preamble(wire.Mode.CMD)}), _open_command),
    describe=_describe_command,
    stop=_close_clients,
    summary="fq command channel: auth, bindings, heartbeats, status",
    auth=Auth(
        'fq\'s auth request: under auth = "password", a user of fq-admin and its password',
        credentials=True,
        logged_in=_logged_in,
    ),
    limits=_limits,
    fuzz=("fq-command",),
    bench=("idle",),
)

DATA: FrontEnd[Any] = FrontEnd(
    name="fq-data",
    reach=Sniffed(
        frozenset(_preamble(m) for m in (wire.Mode.DATA, wire.Mode.PEER, wire.Mode.OLD_PEER)),
        _open_data,
    ),
    describe=_describe_data,
    summary="fq data channel: messages in and out, publisher or peer mode",
    auth=Auth(
        "the key its command channel was given when it logged in",
        credentials=True,
        logged_in=_paired,
    ),
    limits=_limits,
    fuzz=("fq-data", "fq-peer"),
    bench=(
        "1to1-100",
        "1to1-4k",
        "1to1-128k",
        "1to1-routes",
        "fanout",
        "fanin",
        "disk",
        "durable",
        "latency",
        "memory",
    ),
)
