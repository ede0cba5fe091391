"""A toy front end, declared here and registered by the tests alone: what adding a front end
takes (docs/architecture.md, "Adding a front end", follows these steps).

The toy is a line echo on a port of its own: it greets, echoes every line, and counts a
connection as logged in once its first line was ``HELLO NAME``. It declares a settings
table (``[toy]``), a flag (``--toy``), limits read from its table, a login its auth can
tell, shared state its connections count into, and the counters read from that state.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any, Protocol

from fqbroker.frontends.kit.component import (
    Auth,
    ConnectionLimits,
    Counters,
    FrontEnd,
    LiveFrontEnd,
    Metric,
    OwnPort,
)
from fqbroker.server.broker import Broker
from fqbroker.server.frontends import FRONT_ENDS
from fqbroker.settings.broker import Settings
from fqbroker.settings.section import Flag, Section, setting

# 1. Its settings table: names, types, defaults and a line of doc each.


@dataclass(frozen=True, slots=True)
class Toy(Section):
    """The ``[toy]`` table."""

    NAME = "toy"
    TITLE = "A line echo (tests/frontends/kit/toy.py)"
    PORT = 7007

    listen: str | None = setting(None, "HOST:PORT or PORT (on `bind`); empty: off")
    greeting: str = setting("hello", "the line each connection is greeted with")
    max_connections: int = setting(0, "connections at once; 0: the broker's limits only")
    idle_seconds: float = setting(30.0, "a connection silent this long is closed", positive=True)
    login_seconds: float | None = setting(None, "to say HELLO; empty: no deadline")

    def check(self) -> None:
        if "\n" in self.greeting:
            raise ValueError("toy greeting must be one line")
        Section.check(self)


# 2. Its session, on what it needs of its host (a Protocol, never the Broker itself).


class ToyHost(Protocol):
    settings: Settings

    def closed(self, transport: asyncio.Transport) -> None: ...


class ToyState:
    """What the toy's connections share (``FrontEnd.state``): lines echoed, sessions open."""

    def __init__(self) -> None:
        self.echoes = 0
        self.sessions = 0


class LineEcho(asyncio.Protocol):
    """Greets, then echoes each line; ``HELLO NAME`` first logs in."""

    def __init__(
        self, host: ToyHost, state: ToyState, transport: asyncio.Transport, greeting: str
    ) -> None:
        self.host, self.state, self.transport = host, state, transport
        self.buffer = b""
        self.user: bytes | None = None
        self.lines = 0
        self.last = asyncio.get_running_loop().time()
        state.sessions += 1
        transport.write(greeting.encode() + b"\n")

    def data_received(self, data: bytes) -> None:
        self.last = asyncio.get_running_loop().time()
        *lines, self.buffer = (self.buffer + data).split(b"\n")
        for line in lines:
            if self.lines == 0 and line.startswith(b"HELLO "):
                self.user = line[6:]
            self.lines += 1
            self.state.echoes += 1
            self.transport.write(line + b"\n")

    def last_input(self) -> float | None:  # what the idle limit reads
        return self.last

    def connection_lost(self, exc: Exception | None) -> None:
        self.state.sessions -= 1
        self.host.closed(self.transport)


# 3. Its counters: one reading of its state, and the metrics read from it.


@dataclass(frozen=True)
class ToyReading:
    echoes: int
    sessions: int


def _read(host: ToyHost, live: LiveFrontEnd) -> ToyReading | None:
    state = live.state
    return ToyReading(state.echoes, state.sessions) if isinstance(state, ToyState) else None


TOY_COUNTERS: Counters[ToyHost, ToyReading] = Counters(
    read=_read,
    metrics=(
        Metric("fq_toy_echoes", "counter", "Lines the toy echoed.", lambda r: r.echoes),
        Metric("fq_toy_sessions", "gauge", "Toy connections open.", lambda r: r.sessions),
    ),
    json=lambda r: {"echoes": r.echoes, "sessions": r.sessions},
)


# 4. The component: everything the broker, settings, fqd, stats and the UI read of it.


def _address(settings: Settings) -> tuple[str, int] | None:
    return settings.section(Toy).address(settings.bind)


def _open(
    host: ToyHost, live: LiveFrontEnd, transport: asyncio.Transport, first: bytes
) -> asyncio.BaseProtocol:
    assert isinstance(live.state, ToyState)
    return LineEcho(host, live.state, transport, host.settings.section(Toy).greeting)


def _limits(settings: Settings) -> ConnectionLimits:
    toy = settings.section(Toy)
    return ConnectionLimits(
        connections=toy.max_connections or None,
        handshake_seconds=settings.idle_sniff_timeout,
        login_seconds=toy.login_seconds,
        idle_seconds=toy.idle_seconds,
    )


def _logged_in(protocol: asyncio.BaseProtocol) -> bool:
    return isinstance(protocol, LineEcho) and protocol.user is not None


TOY: FrontEnd[ToyHost] = FrontEnd(
    name="toy",
    reach=OwnPort(_address, _open),
    state=lambda host, settings: ToyState(),
    summary="a line echo",
    settings=Toy,
    flags=(Flag("--toy", "listen", "ADDR:PORT", "serve the line echo here (off by default)"),),
    limits=_limits,
    auth=Auth("HELLO NAME, believed", credentials=False, logged_in=_logged_in),
    title="Toy",
    counters=lambda: TOY_COUNTERS,
)

# 5. Registered: one line in the table (here, the table plus the toy, for these tests).

TABLE = (*FRONT_ENDS, TOY)


def with_toy(settings: Settings, **values: Any) -> Settings:
    """``settings`` with the toy on, on a port the kernel picks."""
    return settings.with_sections(Toy().updated({"listen": "127.0.0.1:0", **values}))


def toy_port(broker: Broker) -> int:
    address = broker.front_ends["toy"].address
    assert address is not None
    return address[1]
