"""What a front end is: one component that declares what the rest of the broker needs of it.

A front end is one protocol that publishes into the routing core (fq's command and data
channels, HTTP, Lumberjack, Figg, fyrehose, OpenCluster). Its module declares one
:class:`FrontEnd` that carries its plugs, as a Vector component does, and
:mod:`fqbroker.server.frontends` lists it; the settings, fqd, the listeners, the stats and
the web UI loop over that table, so adding a front end touches no other module.
"""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Final, Generic, Literal, Protocol, TypeVar

from fqbroker.frontends.kit.connections import peer_address
from fqbroker.settings.broker import Settings
from fqbroker.settings.section import Claim, Flag, Section

__all__ = [
    "CLIENT_CERTIFICATES",
    "NO_CREDENTIALS",
    "RATE_WINDOW",
    "Auth",
    "ConnectionLimits",
    "ConnectionView",
    "Counters",
    "Datagrams",
    "FrontEnd",
    "FrontEndCounters",
    "LiveFrontEnd",
    "Metric",
    "OwnPort",
    "Rate",
    "Sniffed",
    "StreamOpener",
    "Watched",
    "default_limits",
    "preambles",
]

H = TypeVar("H")
S = TypeVar("S")

Address = tuple[str, int]


@dataclass(slots=True)
class FrontEndCounters:
    """What a front end counts, for one broker.

    ``bytes_in`` and ``bytes_out`` stay None for a front end that does not count them
    (fq's sessions count wire bytes per client already, in their status counters).
    """

    open: int = 0  # connections now
    accepted: int = 0
    refused: int = 0  # turned away by a connection limit (docs/limits.md)
    bytes_in: int | None = None
    bytes_out: int | None = None
    datagrams: int | None = None  # datagrams received, for UDP front ends


@dataclass(frozen=True, slots=True)
class ConnectionView:
    """One connection as a front end tells it: who, and what it wants shown of it."""

    remote_addr: str
    remote_port: int
    facts: tuple[tuple[str, str | int], ...] = ()


@dataclass(frozen=True, slots=True)
class ConnectionLimits:
    """What one front end's connections may take, applied by the listeners (docs/limits.md)
    on top of the broker-wide ``max_connections`` and ``max_connections_per_address``.

    None is no such limit. A connection over ``connections`` is refused as one over the
    broker's limits is (counted as ``frontend_connections``); one past a deadline is
    closed. ``handshake_seconds`` bounds the TLS handshake on a port of its own (None:
    asyncio's 60 s; the main port's connections have ``idle_sniff_timeout`` to say what
    they are, whoever they are for); ``login_seconds`` the time to log in, for a front
    end whose :class:`Auth` can tell (``logged_in``); ``idle_seconds`` the time without
    input, for a front end whose sessions say when input last came (:class:`Watched`).
    """

    connections: int | None = None
    handshake_seconds: float | None = None
    login_seconds: float | None = None
    idle_seconds: float | None = None


def default_limits(settings: Settings) -> ConnectionLimits:
    """Every front end's unless it says otherwise: the broker-wide limits only, and a TLS
    handshake as long as a main-port connection may take to say what it is."""
    return ConnectionLimits(handshake_seconds=settings.idle_sniff_timeout)


class Watched(Protocol):
    """A session whose connection an idle limit applies to: it says when input last came."""

    def last_input(self) -> float | None:
        """The loop time of its last read, or None while it holds reading itself (then it
        is not idle: the broker is the one not reading)."""
        ...


@dataclass(frozen=True, slots=True)
class Auth:
    """Whether and how a front end's clients say who they are (docs/security.md).

    ``credentials``: its protocol carries them, and they are checked under auth =
    "password". ``certificates``: its clients log in with TLS client certificates instead
    (the broker's ``tls_client_ca``, :mod:`fqbroker.frontends.kit.certs`), once its port
    has TLS. Under auth = "password" a front end with neither (or without the TLS its
    certificates need) keeps fqd from starting, unless its table says ``anonymous =
    true``. ``logged_in``: whether one of its connections (the protocol serving it) has
    logged in, for a login deadline.
    """

    how: str
    credentials: bool
    logged_in: Callable[[asyncio.BaseProtocol], bool] | None = None
    certificates: bool = False


# Lumberjack's, Figg's and OpenCluster's: the protocols carry no password.
CLIENT_CERTIFICATES = Auth(
    "TLS client certificates signed by tls_client_ca; the subject CN is the user",
    credentials=False,
    certificates=True,
)


NO_CREDENTIALS = Auth("none: the protocol carries no credentials", credentials=False)


class LiveFrontEnd:
    """A front end running in one broker: its counters, connections and address.

    ``connections`` maps each transport the front end owns to its source address when a
    per-address limit needs it (else ""): a connection is in exactly one such map (or
    in its listener's while it is not yet claimed), so the accounting costs what the
    broker's one map cost before.
    """

    __slots__ = ("address", "connections", "counters", "limits", "spec", "state", "tasks", "tls")

    def __init__(self, spec: FrontEnd[Any]) -> None:
        self.spec = spec
        self.limits = ConnectionLimits()  # the spec's for the broker's settings, once started
        self.counters = FrontEndCounters()
        if isinstance(spec.reach, Datagrams):
            self.counters.datagrams = 0
        if spec.counts_bytes:
            self.counters.bytes_in = self.counters.bytes_out = 0
        self.connections: dict[asyncio.Transport, str] = {}
        # Tasks the front end runs for its connections (HTTP's, one per request stream);
        # the broker cancels them when it stops.
        self.tasks: set[asyncio.Task[None]] = set()
        self.address: Address | None = None  # where it listens, once started
        # Whether its port speaks TLS: a front end that may (``OwnPort.tls``) does once
        # the settings gave it a context; until it starts, whether it may.
        self.tls: bool | None = None
        # The front end's own running state, for stats to read (the fyrehose listener's
        # Backbone); None for front ends whose state is their connections'.
        self.state: object | None = None

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def transport(self) -> Literal["main", "tcp", "tls", "udp"]:
        """How it is reached: the main port, or a TCP, TLS or UDP port of its own."""
        reach = self.spec.reach
        if isinstance(reach, Sniffed):
            return "main"
        if isinstance(reach, Datagrams):
            return "udp"
        tls = reach.tls is not None if self.tls is None else self.tls
        return "tls" if tls else "tcp"

    def track(self, task: asyncio.Task[None]) -> None:
        """Keep ``task`` until it ends, and cancel it if the broker stops first."""
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    def views(self) -> list[ConnectionView]:
        describe = self.spec.describe
        out = []
        for transport in list(self.connections):
            addr, port = peer_address(transport)
            facts = describe(transport.get_protocol()) if describe is not None else ()
            out.append(ConnectionView(addr, port, facts))
        return out


# Given the host (the broker, typed by each front end as the narrow Protocol it uses),
# the front end's live state, the transport and the bytes that claimed it (the 4-byte
# preamble on the main port, b"" on a port of its own): the protocol that takes over.
StreamOpener = Callable[[H, LiveFrontEnd, asyncio.Transport, bytes], asyncio.BaseProtocol]


@dataclass(frozen=True, slots=True)
class Sniffed(Generic[H]):
    """Reached on the main port: a connection whose first 4 bytes are one of
    ``preambles`` is this front end's."""

    preambles: frozenset[bytes]
    open: StreamOpener[H]


@dataclass(frozen=True, slots=True)
class OwnPort(Generic[H]):
    """A TCP port of its own. ``address`` reads it from the settings (None: the front
    end is off); ``tls``, when given, makes it a TLS port with the context it returns."""

    address: Callable[[Settings], Address | None]
    open: StreamOpener[H]
    tls: Callable[[Settings], ssl.SSLContext | None] | None = None


@dataclass(frozen=True, slots=True)
class Datagrams(Generic[H]):
    """A UDP port of its own: one endpoint, no connections."""

    address: Callable[[Settings], Address | None]
    open: Callable[[H, LiveFrontEnd], asyncio.DatagramProtocol]


@dataclass(frozen=True, slots=True)
class FrontEnd(Generic[H]):
    """One protocol the broker serves, as the table lists it.

    It is reached one of three ways, its ``reach``:

    * :class:`Sniffed`: on the broker's main port, where a connection's first 4 bytes say
      which front end it is for (docs/fq-protocol.md §1.2);
    * :class:`OwnPort`: a TCP port of its own, TLS when the front end gives an
      ``ssl.SSLContext``;
    * :class:`Datagrams`: a UDP port of its own.

    A stream front end's ``open`` gets the transport after the connection limits let it in,
    and returns the protocol that takes it over (no ``connection_made`` follows: the
    transport is given, as a session of fq's takes it). That protocol tells the broker when
    the connection ends, through ``closed(transport)`` on its host, as fq's sessions do.
    :mod:`fqbroker.server.listeners` starts, counts, limits and stops every front end of the
    table from its declaration.

    Beyond how it is reached: ``settings``, its table of the settings file
    (:mod:`fqbroker.settings.section`; None: it has none); ``flags``, fqd's flags that set
    settings of that table; ``limits``, its connections' limits for the broker's settings
    (:class:`ConnectionLimits`); ``auth``, whether and how its clients authenticate
    (:class:`Auth`); ``title``, its name as people write it ("Figg"), in fqd's "TITLE
    listening on port:" line. The addresses it claims follow from its reach
    (:meth:`claims`); two front ends claiming one are refused before anything binds.

    ``refusal``: what a connection over a limit is told before it is closed (HTTP's
    503), or None to close it without a word. ``describe``: what to show of one of its
    connections, given the protocol serving it. ``stop``: called when the broker stops,
    before the connections are closed, to end them gracefully. ``state``: what the front
    end's connections share beyond the host (OpenCluster's store), made from the host and
    the settings before its port opens and kept in ``LiveFrontEnd.state``; an object with
    an ``async def close()`` is closed after its connections are, when the broker stops
    (or when its port cannot be opened).
    """

    name: str
    reach: Sniffed[H] | OwnPort[H] | Datagrams[H]
    refusal: Callable[[H], bytes] | None = None
    describe: Callable[[asyncio.BaseProtocol], tuple[tuple[str, str | int], ...]] | None = None
    stop: Callable[[H], None] | None = None
    state: Callable[[H, Settings], object] | None = None
    # Shown in /frontends.json and the web UI: which protocol this is, in a few words.
    summary: str = ""
    settings: type[Section] | None = None
    flags: tuple[Flag, ...] = ()
    limits: Callable[[Settings], ConnectionLimits] = default_limits
    auth: Auth = NO_CREDENTIALS
    # Why it must not start with these settings (one line naming the fix), or None:
    # asked before anything binds (fyrehose beyond loopback without allow_remote).
    refuse_start: Callable[[Settings], str | None] | None = None
    title: str = ""
    # What it counts beyond FrontEndCounters (its /stats.json key, metrics and panel). A
    # function returning them, so that the code reading them is imported by the first
    # stats request rather than by every broker (tests/test_idle_imports.py).
    counters: Callable[[], Counters[H, Any]] | None = None
    # The names of its entries in the fuzzer (bench/frontends.py): the bench sits above
    # the package and keeps the sockets and clients each entry needs.
    fuzz: tuple[str, ...] = ()
    # The benchmark scenarios that measure it (``python -m bench NAME``, bench/suite.py).
    bench: tuple[str, ...] = ()
    # Whether its sessions count the wire bytes they read and write (bytes_in, bytes_out
    # of FrontEndCounters: 0 from the start, else None).
    counts_bytes: bool = False

    def claims(self, settings: Settings) -> list[Claim]:
        """The addresses it listens on with ``settings``: the main port's, shared with the
        others sniffed there, or its own port's (none while it is off)."""
        reach = self.reach
        if isinstance(reach, Sniffed):
            return [Claim("tcp", settings.bind, settings.port, self.name, shared=True)]
        address = reach.address(settings)
        if address is None:
            return []
        transport = "udp" if isinstance(reach, Datagrams) else "tcp"
        return [Claim(transport, address[0], address[1], self.name)]


# --- a front end's own counters -------------------------------------------------------------

Number = int | float
Series = Iterable[tuple[tuple[str, ...], Number]]  # (label values, value) of each series


@dataclass(frozen=True, slots=True)
class Metric(Generic[S]):
    """One metric family a front end adds to /metrics, read from its reading ``S``.

    ``name`` follows Prometheus naming, without the ``_total`` a counter gets on the wire.
    ``read`` gives the value of a family without ``labels``, or the series of one with
    them: ``(label values, value)`` each, in the order of ``labels``.
    """

    name: str
    kind: Literal["counter", "gauge"]
    help: str
    read: Callable[[S], Number | Series]
    labels: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class Counters(Generic[H, S]):
    """What a front end counts of its own, and how every reader shows it.

    Counters are per read or per connection, never per message: the hot path stays where
    each front end's sessions keep it. Every front end has the connection counters of
    :class:`FrontEndCounters`; these are its own, rendered by the HTTP front end without
    knowing the protocol (:mod:`fqbroker.frontends.http.stats.snapshot`).

    ``read`` takes one reading (a snapshot ``S``) from the host and the front end's live
    state, or None while there is nothing to show (its listener off): then it has no
    /stats.json key and no metric families. Each reader renders the same reading, so
    /stats.json, /metrics, /frontends.json and the web UI agree:

    * ``key`` and ``json``: its /stats.json key (default: the front end's name) and section;
    * ``metrics``: its families, in the order /metrics lists them;
    * ``title`` and ``panel``: its web UI panel, drawn by the UI from the JSON ``panel``
      returns (the vocabulary is in web/js/ownpanels.js), or None to hide it for now;
      without ``panel``, one tile per metric without labels.
    """

    read: Callable[[H, LiveFrontEnd], S | None]
    metrics: tuple[Metric[S], ...] = ()
    key: str = ""
    json: Callable[[S], object] | None = None
    title: str = ""
    panel: Callable[[S], Mapping[str, object] | None] | None = None


# Samples of a counter closer than this keep the previous rate, so every reader of one
# broker (/stats.json, /metrics, the web UI) shares one rate per stats interval.
RATE_WINDOW: Final = 1.0


@dataclass(slots=True)
class Rate:
    """A counter's rate per second between samples at least :data:`RATE_WINDOW` apart;
    0 until it has been sampled twice, and again when the counter goes down (its source
    was made anew)."""

    at: float
    count: int
    rate: float = 0.0

    def sample(self, count: int, now: float) -> float:
        if count < self.count:
            self.at, self.count, self.rate = now, count, 0.0
        elif now - self.at >= RATE_WINDOW:
            self.rate = (count - self.count) / (now - self.at)
            self.at, self.count = now, count
        return self.rate


def preambles(front_ends: Iterable[FrontEnd[Any]]) -> dict[bytes, FrontEnd[Any]]:
    """Which front end each 4-byte preamble of the main port claims a connection for.

    Raises ValueError when two front ends share a name, a settings table or a preamble, or
    a preamble is not 4 bytes: the table must say one thing for each.
    """
    names: set[str] = set()
    tables: set[str] = set()
    claims: dict[bytes, FrontEnd[Any]] = {}
    for spec in front_ends:
        if spec.name in names:
            raise ValueError(f"two front ends are named {spec.name!r}")
        names.add(spec.name)
        if spec.settings is not None:
            if spec.settings.NAME in tables:
                raise ValueError(f"two front ends read the table [{spec.settings.NAME}]")
            tables.add(spec.settings.NAME)
        if isinstance(spec.reach, Sniffed):
            for preamble in spec.reach.preambles:
                if len(preamble) != 4 or preamble in claims:
                    raise ValueError(f"{spec.name}: preamble {preamble!r} taken or not 4 bytes")
                claims[preamble] = spec
    return claims
