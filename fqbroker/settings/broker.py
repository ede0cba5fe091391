"""Broker settings: one dataclass, from defaults < TOML file < command line (fqd.c).

The ``[fqd]`` table is :class:`Settings`' own fields; each front end with settings of its
own declares its table (a :class:`~fqbroker.settings.section.Section`), which
:class:`Settings` holds by name. Front ends sit above the settings, so parsing is handed
the table of front ends it knows (:class:`Component`): by default the one
:mod:`fqbroker.server.frontends` registers (:func:`register`), or a test's own.
"""

from __future__ import annotations

import ipaddress
import socket
import tomllib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any, Protocol, TypeVar

from fqbroker.errors import ConfigError
from fqbroker.settings.datadir import CONFIG_DB_NAME, QUEUE_DIR_NAME, default_data_dir
from fqbroker.settings.section import Claim, Section, default_of, refuse_shared

__all__ = [
    "DEFAULT_PORT",
    "Component",
    "Settings",
    "Upstream",
    "debug_flags",
    "free_limit",
    "register",
    "registered",
    "resolve_node_id",
]

DEFAULT_PORT = 8765
AUTH_MODES = ("none", "password")
# fqd's -v names and their bits (fq.h's fq_debug_bits_t); 0x40000000 is "panic", always on.
DEBUG_BITS = {"mem": 1, "msg": 2, "route": 4, "io": 8, "conn": 16, "config": 32, "peer": 64,
              "http": 128}  # fmt: skip
PANIC_BIT = 0x40000000
S = TypeVar("S", bound=Section)


class Component(Protocol):
    """A front end as the settings see it: its name, its settings table (None: it has
    none) and the addresses it claims. :class:`fqbroker.frontends.kit.component.FrontEnd` is one."""

    @property
    def name(self) -> str: ...

    @property
    def settings(self) -> type[Section] | None: ...

    def claims(self, settings: Settings) -> Iterable[Claim]: ...


_REGISTERED: list[Component] = []


def register(front_ends: Iterable[Component]) -> None:
    """Make ``front_ends`` the table settings are read with when none is given: the
    broker's own table registers itself when imported (fqbroker/server/frontends.py)."""
    _REGISTERED[:] = front_ends


def registered() -> tuple[Component, ...]:
    return tuple(_REGISTERED)


def _sections(front_ends: Iterable[Component] | None) -> dict[str, type[Section]]:
    """The settings tables of ``front_ends`` (None: the registered ones), by table name."""
    table = registered() if front_ends is None else front_ends
    return {fe.settings.NAME: fe.settings for fe in table if fe.settings is not None}


def debug_flags(text: str) -> tuple[str, ...]:
    """The flag names of fqd's ``-v``: comma-separated names, or the bits as a decimal or
    ``0x`` number; ValueError for anything else."""
    text = text.strip()
    if not text:
        return ()
    try:
        bits = int(text, 0)
    except ValueError:
        names = [name.strip() for name in text.split(",")]
        for name in names:
            if name not in DEBUG_BITS:
                raise ValueError(
                    f"debug flag {name!r} is not one of {','.join(DEBUG_BITS)}"
                    " (or their bits as a number)"
                ) from None
        return tuple(dict.fromkeys(names))
    if bits < 0 or bits & ~(sum(DEBUG_BITS.values()) | PANIC_BIT):
        raise ValueError(f"debug bits {text!r} name no known flag set")
    return tuple(name for name, bit in DEBUG_BITS.items() if bits & bit)


def check_port(what: str, value: object, *, zero: bool = True) -> None:
    """ValueError unless ``value`` is a TCP/UDP port (0, "pick one", only when ``zero``)."""
    low = 0 if zero else 1
    if not isinstance(value, int) or isinstance(value, bool) or not low <= value <= 65535:
        raise ValueError(f"{what} must be a port number from {low} to 65535, not {value!r}")


@dataclass(frozen=True, slots=True)
class Upstream:
    """One row of fqd's ``upstream`` table: pull ``exchange`` through ``program`` from a
    broker at ``host:port``, logging in with ``source`` and ``password``
    (docs/fq-protocol.md §5.1).

    ``tls`` and ``cafile`` (ours, so only in ``[[upstream]]`` tables of the TOML file:
    fqd's sqlite table has no such columns) connect over TLS, checking the upstream's
    certificate against the system's CAs or only ``cafile``'s; a ``cafile`` implies TLS."""

    host: str
    port: int
    source: str
    password: str
    exchange: bytes
    program: bytes
    permanent_binding: bool
    tls: bool = False
    cafile: str = ""

    @classmethod
    def from_table(cls, table: dict[str, Any]) -> Upstream:
        """An ``[[upstream]]`` table of the TOML file, with the sqlite columns' defaults."""
        known = {f.name for f in fields(cls)}
        if unknown := set(table) - known:
            raise ValueError(f"unknown upstream setting(s): {', '.join(sorted(unknown))}")
        for required in ("host", "source", "exchange"):
            if not table.get(required):
                raise ValueError(f"an upstream needs {required!r}")
        check_port("upstream port", table.get("port", DEFAULT_PORT), zero=False)
        return cls(
            host=str(table["host"]),
            port=int(table.get("port", DEFAULT_PORT)),
            source=str(table["source"]),
            password=str(table.get("password", "")),
            exchange=str(table["exchange"]).encode(),
            program=str(table.get("program", "")).encode(),
            permanent_binding=bool(table.get("permanent_binding", False)),
            tls=bool(table.get("tls", False) or table.get("cafile")),
            cafile=str(table.get("cafile", "")),
        )


@dataclass(slots=True)
class Settings:
    """Every setting of one broker: the ``[fqd]`` table, and the front ends' tables by name.

    The defaults mirror fqd's, except that the broker listens on 127.0.0.1 unless told
    otherwise, and keeps its state under ``data_dir`` (:mod:`fqbroker.settings.datadir` says
    where that is by default) rather than ``/usr/local/var/lib/fq``. A setting fqd cannot
    work with is a ValueError that names it; one read from a file is a ConfigError that
    names the file too. :meth:`section` reads a front end's table.
    """

    port: int = DEFAULT_PORT
    bind: str = "127.0.0.1"
    node_id: str = ""  # IPv4 used in hops; empty means the host name's address
    # State: config_db and queue_dir default under data_dir, and follow it when it is set.
    data_dir: Path = field(default_factory=default_data_dir)
    config_db: Path = field(default_factory=lambda: default_data_dir() / CONFIG_DB_NAME)
    queue_dir: Path = field(default_factory=lambda: default_data_dir() / QUEUE_DIR_NAME)
    web_root: Path | None = None  # None serves the web UI shipped in the package
    modules: list[str] = field(default_factory=list)  # rule-function modules (-m)
    debug: str = ""  # -v flags: mem,msg,route,io,conn,config,peer,http
    max_message_size: int = 1 << 28
    default_backlog: int = 16384
    idle_sniff_timeout: float = 30.0  # seconds a new connection may take to say what it is
    fsync: str = "interval"  # disk queues: always | interval | never
    fsync_interval_ms: float = 5.0  # group-commit window for fsync = "interval"
    segment_bytes: int = 64 << 20  # disk-queue segment file size
    # Free space below which publishers into disk queues and topics are held back or
    # refused (docs/reliability.md, "Disk alarm"): bytes, a size ("1GiB") or a share of
    # the file system ("5%"); 0: off.
    disk_free_limit: int | str = "256MiB"
    admin_token: str = ""  # when set, /submit, checkpoints and /shutdown need it
    # --- HTTP reads (docs/security.md) ---
    http_auth_reads: bool = False  # /stats.json, /metrics, /queue/*, /topic/*, the UI need auth
    read_token: str = ""  # a bearer token for the reads (a Prometheus scraper's); never admin
    http_shutdown: bool = False  # whether /shutdown stops the broker (fqd: HTTP_SHUTDOWN=1)
    # Host names plain HTTP answers to besides IP addresses, dotless names and the machine's
    # own (docs/security.md); "*": any. Others get 421, which defeats DNS rebinding.
    http_hosts: list[str] = field(default_factory=list)
    upstream: list[Upstream] = field(default_factory=list)  # peers, besides the sqlite table
    peer_poll_seconds: float = 1.0  # how often the sqlite upstream table is read again
    peer_dedupe: int = 0  # message ids from peers remembered to drop repeats; 0: off, as fqd
    confirm_pair_timeout: float = 10.0  # seconds a confirm waits for the data socket to pair
    # Publishers that opt in to de-duplication by message id (docs/confirms.md): how long
    # each queue remembers an id it took, and how many ids at most (about 150 bytes each).
    dedup_window: float = 120.0  # seconds
    dedup_window_ids: int = 1_000_000
    # --- resource limits and bad input (docs/limits.md) ---
    max_connections: int = 0  # all connections; 0: from RLIMIT_NOFILE, an eighth kept back
    max_connections_per_address: int = 0  # from one source address; 0: no such limit
    max_queues_per_user: int = 256  # permanent or disk queues a user creates; 0: no limit
    disk_queues_per_second: float = 10.0  # new disk queues, broker-wide; 0: no limit
    log_lines_per_second: int = 5  # log lines per kind of bad input or refusal
    max_bindings_per_queue: int = 1000  # bindings into one queue; 0: no limit
    max_bindings_per_user: int = 10000  # bindings one user's clients made; 0: no limit
    # --- deadlines (docs/limits.md) ---
    login_timeout: float = 10.0  # seconds an fq channel may take to log in (or pair)
    idle_timeout: float = 300.0  # seconds a front end's connection may send nothing
    http_header_timeout: float = 10.0  # seconds an HTTP request's head may take
    http_keepalive_timeout: float = 5.0  # seconds an HTTP connection waits for its next request
    # --- memory bounds (docs/memory.md) ---
    backlog_bytes: int = 64 << 20  # a memory queue's backlog in bytes, unless it says; 0: none
    memory_budget: int = 1 << 30  # bytes held by memory queues and reads in flight, broker-wide
    http_max_body: int = 16 << 20  # largest HTTP request body (/submit); larger gets 413
    # What one connection, and all of one user's connections, may reserve of the budget
    # for messages still arriving; 0: the largest message (and its head), half the budget.
    max_reserved_per_connection: int = 0
    max_reserved_per_user: int = 0
    partial_message_seconds: float = 30.0  # a partial message idle this long: closed; 0: never
    # --- security (docs/security.md) ---
    auth: str = "none"  # "none": fq's behaviour, no password checked; "password": users
    allow_open_network: bool = False  # listen beyond loopback with auth = "none" anyway
    # --- TLS on the main port (docs/tls.md) ---
    tls_cert: Path | None = None  # PEM certificate chain: TLS clients accepted when given
    tls_key: Path | None = None  # PEM private key; None: it is in tls_cert's file
    tls_required: bool = False  # refuse plain connections on every TCP port (needs tls_cert)
    # The CA that signs client certificates: the front ends on TLS ports of their own
    # (Lumberjack, Figg, OpenCluster) take a client's certificate as its login, the
    # subject CN its user, under auth = "password" (docs/security.md).
    tls_client_ca: Path | None = None
    # --- /metrics (docs/http.md) ---
    metrics_client_series_max: int = 1000  # fq_client_* series while at most this many clients

    # The front ends' own tables ([lumberjack], [figg], ...) by name, each only when it
    # differs from its defaults: not a setting of [fqd], see section().
    sections: dict[str, Section] = field(default_factory=dict)

    # --- the front ends' tables -----------------------------------------------------------

    def reservation_caps(self, limit: int) -> tuple[int, int]:
        """What one connection and one user may reserve of a budget of ``limit`` bytes
        (docs/memory.md): the settings, or else the largest message with room for its
        head (what one connection must be able to read), and half the budget."""
        per_connection = self.max_reserved_per_connection or self.max_message_size + (64 << 10)
        per_user = self.max_reserved_per_user or limit // 2
        return min(per_connection, limit), min(per_user, limit)

    def section(self, kind: type[S]) -> S:
        """The front end's table of kind ``kind``: as the file or the flags set it, else its
        defaults."""
        held = self.sections.get(kind.NAME)
        return held if isinstance(held, kind) else default_of(kind)

    def set_section(self, table: Section) -> None:
        """Hold ``table`` in place of the table of its name (unchecked)."""
        self.sections = _trimmed({**self.sections, table.NAME: table})

    def with_sections(self, *sections: Section) -> Settings:
        """A copy holding ``sections`` in place of the tables of the same names (unchecked,
        as ``dataclasses.replace``)."""
        held = dict(self.sections)
        for table in sections:
            held[table.NAME] = table
        return replace(self, sections=_trimmed(held))

    # --- reading --------------------------------------------------------------------------

    @classmethod
    def from_toml(cls, path: Path | str, front_ends: Iterable[Component] | None = None) -> Settings:
        """The settings of a TOML file; a ConfigError naming the file if it cannot be read
        or holds a setting fqd cannot work with. ``front_ends``: whose tables it may hold
        (None: the registered table's)."""
        try:
            with open(path, "rb") as fh:
                data = tomllib.load(fh)
        except FileNotFoundError:
            raise ConfigError(f"config file {path}: no such file") from None
        except OSError as exc:
            raise ConfigError(f"config file {path}: {exc.strerror or exc}") from None
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(f"config file {path}: not valid TOML: {exc}") from None
        front_ends = registered() if front_ends is None else tuple(front_ends)
        values = dict(data.get("fqd", data))
        if "fqd" in data:
            # Tables of their own beside [fqd]; any other is a typo fqd would silently skip.
            tables = {"upstream", *_sections(front_ends)}
            if unknown := set(data) - {"fqd", *tables}:
                names = ", ".join(f"[{name}]" for name in sorted(unknown))
                raise ConfigError(f"config file {path}: unknown table(s) {names}")
            for table in tables:
                if table in data:
                    values[table] = data[table]
        try:
            return cls().updated(values, front_ends)
        except (ValueError, TypeError) as exc:
            raise ConfigError(f"config file {path}: {exc}") from None

    def updated(
        self, values: Mapping[str, Any], front_ends: Iterable[Component] | None = None
    ) -> Settings:
        """A copy with ``values`` applied; unknown keys are an error, not silently ignored.
        A front end's table (of ``front_ends``; None: the registered ones) is given under
        its name, as a TOML table or as its section."""
        front_ends = registered() if front_ends is None else tuple(front_ends)
        known = {f.name: f for f in fields(self) if f.name != "sections"}
        tables = _sections(front_ends)
        out = replace(self, sections=dict(self.sections))
        given = set()
        for key, value in values.items():
            name = key.replace("-", "_")
            if name in tables:
                kind = tables[name]
                if value is not None:
                    out.sections[name] = (
                        value if isinstance(value, kind) else kind.from_table(value)
                    )
                continue
            if name not in known:
                raise ValueError(f"unknown setting {key!r}")
            if value is None:
                continue
            given.add(name)
            if name in (
                "data_dir",
                "config_db",
                "queue_dir",
                "web_root",
                "tls_cert",
                "tls_key",
                "tls_client_ca",
            ):
                if not isinstance(value, str | Path):
                    raise ValueError(f"{key} must be a path, not {value!r}")
                value = Path(value)
            elif name == "upstream":
                if not isinstance(value, list):
                    raise ValueError("upstream must be an array of tables ([[upstream]])")
                value = [v if isinstance(v, Upstream) else Upstream.from_table(v) for v in value]
            setattr(out, name, value)
        if "data_dir" in given:
            # What still sits at its default place under the old data_dir moves along.
            for name, leaf in (("config_db", CONFIG_DB_NAME), ("queue_dir", QUEUE_DIR_NAME)):
                if name not in given and getattr(out, name) == self.data_dir / leaf:
                    setattr(out, name, out.data_dir / leaf)
        out.sections = _trimmed(out.sections)
        out.check(front_ends)
        return out

    def check(self, front_ends: Iterable[Component] | None = None) -> None:
        """Raise ValueError for a setting the broker cannot work with, or for two front
        ends (of ``front_ends``; None: the registered ones) claiming one address."""
        for f in fields(self):
            value = getattr(self, f.name)
            kinds = _SCALARS.get(str(f.type))
            if kinds is not None and (not isinstance(value, kinds) or _bool_for_number(f, value)):
                raise ValueError(f"{f.name} must be {_KIND_NAMES[str(f.type)]}, not {value!r}")
        check_port("port", self.port)
        debug_flags(self.debug)
        for name in _POSITIVE:
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be positive, not {getattr(self, name)!r}")
        for name in _NOT_NEGATIVE:
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be 0 or more, not {getattr(self, name)!r}")
        free_limit(self.disk_free_limit)
        if self.fsync not in ("always", "interval", "never"):
            raise ValueError(f"fsync must be always, interval or never, not {self.fsync!r}")
        if not isinstance(self.modules, list) or not all(isinstance(m, str) for m in self.modules):
            raise ValueError("modules must be a list of module names")
        if self.auth not in AUTH_MODES:
            raise ValueError(f"auth must be one of {', '.join(AUTH_MODES)}, not {self.auth!r}")
        if not isinstance(self.allow_open_network, bool):
            raise ValueError("allow_open_network must be true or false")
        if not isinstance(self.http_auth_reads, bool):
            raise ValueError("http_auth_reads must be true or false")
        if not isinstance(self.http_hosts, list) or not all(
            isinstance(h, str) and h.strip() for h in self.http_hosts
        ):
            raise ValueError("http_hosts must be a list of host names")
        for name in ("admin_token", "read_token"):
            if not isinstance(getattr(self, name), str):
                raise ValueError(f"{name} must be a string")
        if (
            self.http_auth_reads
            and self.auth == "none"
            and not (self.read_token or self.admin_token)
        ):
            # Every read would get 401: surely not what was meant.
            raise ValueError('http_auth_reads needs read_token, admin_token or auth = "password"')
        if self.tls_key is not None and self.tls_cert is None:
            raise ValueError("tls_key needs tls_cert")
        if self.tls_required and self.tls_cert is None:
            raise ValueError("tls_required needs tls_cert")
        refuse_shared(self.claims(front_ends))

    def claims(self, front_ends: Iterable[Component] | None = None) -> list[Claim]:
        """The addresses ``front_ends`` (None: the registered ones) listen on."""
        table = registered() if front_ends is None else front_ends
        return [claim for fe in table for claim in fe.claims(self)]

    def open_to_anyone(self, front_ends: Iterable[Component] | None = None) -> list[str]:
        """The listen addresses anyone on the network may use without a password: those
        beyond loopback while auth is "none" (empty under "password"); ``front_ends``
        (None: the registered ones) say where they listen."""
        if self.auth != "none":
            return []
        wanted = [self.bind, *(claim.host for claim in self.claims(front_ends))]
        return [host for host in dict.fromkeys(wanted) if not is_loopback(host)]


def _trimmed(sections: dict[str, Section]) -> dict[str, Section]:
    """Only the tables that differ from their defaults: settings equal whatever the file
    left at its default."""
    return {name: t for name, t in sections.items() if t != default_of(type(t))}


# The scalar settings' types as the dataclass spells them (annotations are strings here).
_SCALARS: dict[str, type | tuple[type, ...]] = {
    "int": int, "float": (int, float), "str": str, "bool": bool
}  # fmt: skip
_POSITIVE = (
    "max_message_size", "idle_sniff_timeout", "fsync_interval_ms", "segment_bytes",
    "peer_poll_seconds", "confirm_pair_timeout", "http_max_body", "login_timeout",
    "dedup_window", "dedup_window_ids",
    "idle_timeout", "http_header_timeout", "http_keepalive_timeout",
)  # fmt: skip
_NOT_NEGATIVE = (
    "default_backlog", "peer_dedupe", "max_connections", "max_connections_per_address",
    "max_queues_per_user", "disk_queues_per_second", "log_lines_per_second", "backlog_bytes",
    "memory_budget", "max_bindings_per_queue", "max_bindings_per_user",
    "max_reserved_per_connection", "max_reserved_per_user", "partial_message_seconds",
)  # fmt: skip
_KIND_NAMES = {"int": "an integer", "float": "a number", "str": "a string", "bool": "true or false"}


_UNITS = {
    "": 1, "b": 1, "k": 1000, "kb": 1000, "kib": 1 << 10, "m": 1000**2, "mb": 1000**2,
    "mib": 1 << 20, "g": 1000**3, "gb": 1000**3, "gib": 1 << 30, "t": 1000**4, "tb": 1000**4,
    "tib": 1 << 40,
}  # fmt: skip


def free_limit(value: object) -> tuple[int, float]:
    """``disk_free_limit`` read: (bytes, 0.0) for a size, (0, fraction) for a share of the
    file system ("5%"), (0, 0.0) for off; ValueError naming the setting otherwise."""
    wrong = ValueError(
        f'disk_free_limit must be bytes, a size such as "1GiB" or a share such as "5%",'
        f" not {value!r}"
    )
    if isinstance(value, bool):
        raise wrong
    if isinstance(value, int):
        if value < 0:
            raise wrong
        return value, 0.0
    if not isinstance(value, str):
        raise wrong
    text = value.strip().lower().replace(" ", "")
    try:
        if text.endswith("%"):
            percent = float(text[:-1])
            if not 0 <= percent < 100:
                raise wrong
            return 0, percent / 100
        number = text.rstrip("kmgtib")
        unit = _UNITS.get(text[len(number) :])
        size = float(number) * unit if unit is not None else -1.0
    except ValueError:
        raise wrong from None
    if not 0 <= size < 2**63:
        raise wrong
    return int(size), 0.0


def _bool_for_number(f: Any, value: object) -> bool:
    return isinstance(value, bool) and str(f.type) in ("int", "float")


def is_loopback(host: str) -> bool:
    """Whether ``host`` (an address or a name) is reachable from this machine only; a
    name is resolved, and one that does not resolve counts as open (it fails later)."""
    if host in ("localhost", "ip6-localhost"):
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        pass
    try:
        infos = socket.getaddrinfo(host, None)
    except OSError:
        return False
    return bool(infos) and all(ipaddress.ip_address(i[4][0]).is_loopback for i in infos)


def resolve_node_id(node_id: str) -> bytes:
    """The 4 network-order bytes of the node id.

    fqd refuses loopback; we accept it (a lone broker on a laptop is a fine use) and only
    refuse 0.0.0.0, which would end the hop list. Peered brokers need distinct ids.
    """
    text = node_id or _host_address()
    try:
        ip = ipaddress.IPv4Address(text)
    except ValueError:
        raise ValueError(f"node id {text!r} is not an IPv4 address") from None
    if int(ip) == 0:
        raise ValueError("nodeid cannot be INADDR_ANY or loopback")
    return ip.packed


def _host_address() -> str:
    try:
        return socket.gethostbyname(socket.gethostname())
    except OSError:
        return "127.0.0.1"
