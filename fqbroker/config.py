"""Broker settings: one dataclass, from defaults < TOML file < command line (fqd.c).

The defaults mirror fqd's, except that the broker listens on 127.0.0.1 unless told
otherwise, and keeps its state under ``./var`` rather than ``/usr/local/var/lib/fq``.
"""

from __future__ import annotations

import ipaddress
import socket
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

__all__ = [
    "DEFAULT_PORT",
    "Figg",
    "Fyrehose",
    "Lumberjack",
    "OpenCluster",
    "Settings",
    "TopicRetention",
    "Upstream",
    "resolve_node_id",
]

DEFAULT_PORT = 8765
LUMBERJACK_PORT = 5044  # the Beats convention, for a ``listen`` that names a host only
FIGG_PORT = 8119  # the Figg seed's, for a ``listen`` that names a host only
FYREHOSE_PORT = 2323  # the fyrehose seed's example port, for a ``listen`` naming a host only
OPENCLUSTER_PORT = 13600  # the protocol's customary port, for a ``listen`` naming a host only
AUTH_MODES = ("none", "password")


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


@dataclass(frozen=True, slots=True)
class Lumberjack:
    """The ``[lumberjack]`` table: the Lumberjack/Beats listener (docs/lumberjack.md).

    Off while ``listen`` is empty. The limits bear the names of the protocol's ``Limits``
    (fqbroker/frontends/lumberjack/protocol.py) and its defaults; exceeding one closes that
    connection only.
    """

    listen: str = ""  # "HOST:PORT", "[V6]:PORT" or "PORT" (on ``bind``); port 0 picks one
    exchange: str = "logging"
    route: str = ""  # the route template; empty: mapping.DEFAULT_ROUTE_TEMPLATE
    max_window: int = 65536  # a W frame asking for more events
    max_frame: int = 16 << 20  # a J payload or a C frame's compressed bytes
    max_decompressed: int = 64 << 20  # bytes inflated out of one C frame (a zip bomb)
    max_fields: int = 1024  # pairs in one v1 D frame
    tls_cert: Path | None = None  # PEM certificate chain: TLS when given
    tls_key: Path | None = None  # PEM private key; None: it is in tls_cert's file
    ack_idle_ms: float = 100.0  # input idle this long with events unacknowledged: ACK them
    keepalive_seconds: float = 1.0  # ACK(0) to v2 clients this often while held back

    @classmethod
    def from_table(cls, table: dict[str, Any]) -> Lumberjack:
        """The ``[lumberjack]`` table of the TOML file; unknown keys are an error."""
        known = {f.name for f in fields(cls)}
        if unknown := set(table) - known:
            raise ValueError(f"unknown lumberjack setting(s): {', '.join(sorted(unknown))}")
        return cls().updated(table)

    def updated(self, values: dict[str, Any]) -> Lumberjack:
        out = {f.name: getattr(self, f.name) for f in fields(self)}
        for key, value in values.items():
            if value is None:
                continue
            if key in ("tls_cert", "tls_key"):
                value = Path(value) if value != "" else None
            out[key] = value
        made = Lumberjack(**out)
        made.check()
        return made

    def check(self) -> None:
        """Raise ValueError for a setting the listener cannot work with."""
        for name in ("listen", "exchange", "route"):
            if not isinstance(getattr(self, name), str):
                raise ValueError(f"lumberjack {name} must be a string")
        for name in ("ack_idle_ms", "keepalive_seconds"):
            value = getattr(self, name)
            if not isinstance(value, int | float) or isinstance(value, bool):
                raise ValueError(f"lumberjack {name} must be a number, not {value!r}")
        for name in ("max_window", "max_frame", "max_decompressed", "max_fields"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"lumberjack {name} must be a positive integer, not {value!r}")
        exchange = self.exchange.encode()
        if not 0 < len(exchange) <= 127:
            raise ValueError("lumberjack exchange must be 1 to 127 bytes")
        if self.ack_idle_ms <= 0 or self.keepalive_seconds <= 0:
            raise ValueError("lumberjack ack_idle_ms and keepalive_seconds must be positive")
        if self.tls_key is not None and self.tls_cert is None:
            raise ValueError("lumberjack tls_key needs tls_cert")
        if self.listen:
            self.address("127.0.0.1")

    def address(self, bind: str) -> tuple[str, int] | None:
        """Where to listen, or None when off; a bare port listens on the broker's ``bind``."""
        return listen_address("lumberjack", self.listen, bind, LUMBERJACK_PORT)


def listen_address(what: str, listen: str, bind: str, default_port: int) -> tuple[str, int] | None:
    """(host, port) of a front end's ``listen`` setting, or None when it is empty (off)."""
    text = listen.strip()
    if not text:
        return None
    host, sep, port = text.rpartition(":")
    if not sep:
        host, port = "", text
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    elif ":" in host:
        raise ValueError(f"{what} listen {text!r}: write an IPv6 address as [ADDR]:PORT")
    try:
        number = int(port) if port else default_port
    except ValueError:
        raise ValueError(f"{what} listen {text!r} is not HOST:PORT") from None
    if not 0 <= number <= 65535:
        raise ValueError(f"{what} listen {text!r}: port out of range")
    return (host or bind, number)


def _positive(what: str, value: object, kind: type | tuple[type, ...] = int) -> None:
    if not isinstance(value, kind) or isinstance(value, bool) or value <= 0:  # type: ignore[operator]
        noun = "integer" if kind is int else "number"
        raise ValueError(f"{what} must be a positive {noun}, not {value!r}")


@dataclass(frozen=True, slots=True)
class TopicRetention:
    """A ``[figg.topics."NAME"]`` table: one topic's retention, where it differs."""

    retention_bytes: int | None = None  # None: the [figg] table's
    retention_seconds: float | None = None

    @classmethod
    def from_table(cls, name: str, table: object) -> TopicRetention:
        if not isinstance(table, dict):
            raise ValueError(f"figg topic {name!r}: expected a table, not {table!r}")
        known = {f.name for f in fields(cls)}
        if unknown := set(table) - known:
            raise ValueError(
                f"unknown figg setting(s) for topic {name!r}: {', '.join(sorted(unknown))}"
            )
        made = cls(**table)
        if made.retention_bytes is not None:
            _positive(f"figg topic {name!r} retention_bytes", made.retention_bytes)
        if made.retention_seconds is not None:
            _positive(
                f"figg topic {name!r} retention_seconds", made.retention_seconds, (int, float)
            )
        return made


@dataclass(frozen=True, slots=True)
class Figg:
    """The ``[figg]`` table: retained topics and the Figg listener (docs/topics.md).

    Off while ``listen`` is None (or empty in the TOML file). Retention deletes a topic's
    oldest whole segments, never the one being written: while the topic holds more than
    ``retention_bytes``, and once a segment's newest record is older than
    ``retention_seconds``. ``topics`` overrides either for named topics.
    """

    listen: str | None = None  # "HOST:PORT", "[V6]:PORT" or "PORT" (on ``bind``); 0 picks one
    exchange: str = "figg"  # the fq exchange topics share (route = topic name)
    retention_bytes: int = 1 << 30  # per topic
    retention_seconds: float = 7 * 86400
    segment_bytes: int = 16 << 20  # a topic's segment files: the unit retention deletes
    max_topics: int = 10_000  # past it, messages to new topics are dropped and counted
    max_frame: int = 16 << 20  # a Figg frame's payload over this closes the connection
    idle_seconds: float = 30.0  # a connection that sent nothing (not even PING) this long
    # Topics' own fsync policy. "always" by default, where disk queues default to
    # "interval": every Figg publish waits for its ACK, and an ACK waits for the fsync, so
    # with "interval" a client's window of 256 is capped at 256 messages per 5 ms window
    # (~50k msg/s); back-to-back group commits keep the same power-cut guarantee with an
    # ACK ~0.3 ms after the write (docs/figg.md). "interval" uses the broker's
    # fsync_interval_ms.
    fsync: str = "always"
    topics: Mapping[str, TopicRetention] = field(default_factory=dict)
    tls_cert: Path | None = None  # PEM certificate chain: the listener speaks TLS when given
    tls_key: Path | None = None  # PEM private key; None: it is in tls_cert's file

    @classmethod
    def from_table(cls, table: dict[str, Any]) -> Figg:
        """The ``[figg]`` table of the TOML file; unknown keys are an error."""
        known = {f.name for f in fields(cls)}
        if unknown := set(table) - known:
            raise ValueError(f"unknown figg setting(s): {', '.join(sorted(unknown))}")
        return cls().updated(table)

    def updated(self, values: Mapping[str, Any]) -> Figg:
        out = {f.name: getattr(self, f.name) for f in fields(self)}
        for key, value in values.items():
            if key == "listen" and value == "":
                value = None
            elif key in ("tls_cert", "tls_key"):
                value = Path(value) if value not in (None, "") else None
            elif key == "topics":
                if not isinstance(value, Mapping):
                    raise ValueError("figg topics must be a table of tables")
                value = {
                    str(name): t if isinstance(t, TopicRetention)
                    else TopicRetention.from_table(str(name), t)
                    for name, t in value.items()
                }  # fmt: skip
            out[key] = value
        made = Figg(**out)
        made.check()
        return made

    def check(self) -> None:
        """Raise ValueError for a setting topics or the listener cannot work with."""
        if self.listen is not None and not isinstance(self.listen, str):
            raise ValueError("figg listen must be a string")
        if not isinstance(self.exchange, str) or not 0 < len(self.exchange.encode()) <= 127:
            raise ValueError("figg exchange must be a string of 1 to 127 bytes")
        for name in ("retention_bytes", "max_topics", "max_frame"):
            _positive(f"figg {name}", getattr(self, name))
        for name in ("retention_seconds", "idle_seconds"):
            _positive(f"figg {name}", getattr(self, name), (int, float))
        _positive("figg segment_bytes", self.segment_bytes)
        if self.fsync not in ("always", "interval", "never"):
            raise ValueError(f"figg fsync must be always, interval or never, not {self.fsync!r}")
        if self.segment_bytes < 4096:
            raise ValueError(f"figg segment_bytes must be at least 4096, not {self.segment_bytes}")
        for name in self.topics:
            if not 0 < len(name.encode("utf-8", "surrogateescape")) <= 127:
                raise ValueError(f"figg topic name {name!r} must be 1 to 127 bytes")
        if self.tls_key is not None and self.tls_cert is None:
            raise ValueError("figg tls_key needs tls_cert")
        if self.listen:
            self.address("127.0.0.1")

    def address(self, bind: str) -> tuple[str, int] | None:
        """Where to listen, or None when off; a bare port listens on the broker's ``bind``."""
        return listen_address("figg", self.listen or "", bind, FIGG_PORT)

    def retention(self, topic: bytes) -> tuple[int, float]:
        """(bytes, seconds) a topic keeps: its own table's values, else the defaults."""
        own = self.topics.get(topic.decode("utf-8", "surrogateescape")) if self.topics else None
        if own is None:
            return self.retention_bytes, self.retention_seconds
        return (
            self.retention_bytes if own.retention_bytes is None else own.retention_bytes,
            self.retention_seconds if own.retention_seconds is None else own.retention_seconds,
        )


@dataclass(frozen=True, slots=True)
class Fyrehose:
    """The ``[fyrehose]`` table: the fyrehose backbone's UDP listener (docs/fyrehose.md).

    Off while ``listen`` is None (or empty in the TOML file). Every message on ``exchange``
    gets the next sequence number and goes to every subscriber; the last
    ``window_messages`` (at most ``window_bytes`` of data) are kept in memory to answer
    REQUESTs, at most ``request_limit`` messages per REQUEST.
    """

    listen: str | None = None  # "HOST:PORT" or "PORT" (on ``bind``); 0 picks one; IPv4 only
    exchange: str = "fyrehose"  # the fq exchange the stream is (PUSH publishes there)
    route: str = "fyrehose"  # the route PUSHed messages are published with
    window_messages: int = 65536  # messages kept to answer REQUESTs
    window_bytes: int = 32 << 20  # and at most this much of their data
    request_limit: int = 4096  # messages one REQUEST may ask for
    max_subscribers: int = 1024  # past it, KEEPALIVEs are answered but not subscribed

    @classmethod
    def from_table(cls, table: dict[str, Any]) -> Fyrehose:
        """The ``[fyrehose]`` table of the TOML file; unknown keys are an error."""
        if not isinstance(table, dict):
            raise ValueError("fyrehose must be a table")
        known = {f.name for f in fields(cls)}
        if unknown := set(table) - known:
            raise ValueError(f"unknown fyrehose setting(s): {', '.join(sorted(unknown))}")
        return cls().updated(table)

    def updated(self, values: Mapping[str, Any]) -> Fyrehose:
        out = {f.name: getattr(self, f.name) for f in fields(self)}
        for key, value in values.items():
            if key not in out:
                raise ValueError(f"unknown fyrehose setting {key!r}")
            if key == "listen" and value == "":
                value = None
            out[key] = value
        made = Fyrehose(**out)
        made.check()
        return made

    def check(self) -> None:
        """Raise ValueError for a setting the listener cannot work with."""
        if self.listen is not None and not isinstance(self.listen, str):
            raise ValueError("fyrehose listen must be a string")
        for name in ("exchange", "route"):
            value = getattr(self, name)
            if not isinstance(value, str) or not 0 < len(value.encode()) <= 127:
                raise ValueError(f"fyrehose {name} must be a string of 1 to 127 bytes")
        for name in ("window_messages", "window_bytes", "request_limit", "max_subscribers"):
            _positive(f"fyrehose {name}", getattr(self, name))
        if self.listen:
            host, _ = self.address("127.0.0.1") or ("", 0)
            if host.startswith("[") or ":" in host:
                raise ValueError(f"fyrehose listen {self.listen!r}: the protocol is IPv4 only")

    def address(self, bind: str) -> tuple[str, int] | None:
        """Where to listen, or None when off; a bare port listens on the broker's ``bind``."""
        return listen_address("fyrehose", self.listen or "", bind, FYREHOSE_PORT)


@dataclass(frozen=True, slots=True)
class OpenCluster:
    """The ``[opencluster]`` table: the OpenCluster key/value listener (docs/opencluster.md).

    Off while ``listen`` is None (or empty in the TOML file). Values live in memory, and
    in a journal folded into sqlite under ``queue_dir``; a set is acknowledged once its
    batch is written to the journal, fsynced (``sync = "full"``) or not (``"normal"``:
    survives kill -9, not a power cut). A frame over a limit closes that connection;
    ``max_keys`` refuses new keys (failinfo); ``max_inflight`` stops reading a connection
    until its replies go out.
    """

    listen: str | None = None  # "HOST:PORT", "[V6]:PORT" or "PORT" (on ``bind``); 0 picks one
    sync: str = "full"  # "full": an ack survives a power cut; "normal": kill -9 only
    max_name: int = 1024  # bytes of a key's name
    max_value: int = 1 << 20  # bytes of a string value
    max_payload: int = (1 << 20) + 1024 + 64  # a frame's payload length (its header's)
    max_keys: int = 1_000_000  # keys held; a set of a new key past it is refused
    max_inflight: int = 1024  # commands read and not yet answered, per connection
    tls_cert: Path | None = None  # PEM certificate chain: the listener speaks TLS when given
    tls_key: Path | None = None  # PEM private key; None: it is in tls_cert's file

    @classmethod
    def from_table(cls, table: dict[str, Any]) -> OpenCluster:
        """The ``[opencluster]`` table of the TOML file; unknown keys are an error."""
        if not isinstance(table, dict):
            raise ValueError("opencluster must be a table")
        return cls().updated(table)

    def updated(self, values: Mapping[str, Any]) -> OpenCluster:
        out = {f.name: getattr(self, f.name) for f in fields(self)}
        for key, value in values.items():
            if key not in out:
                raise ValueError(f"unknown opencluster setting {key!r}")
            if key == "listen" and value == "":
                value = None
            elif key in ("tls_cert", "tls_key"):
                value = Path(value) if value not in (None, "") else None
            out[key] = value
        made = OpenCluster(**out)
        made.check()
        return made

    def check(self) -> None:
        """Raise ValueError for a setting the listener or its store cannot work with."""
        if self.listen is not None and not isinstance(self.listen, str):
            raise ValueError("opencluster listen must be a string")
        if self.sync not in ("full", "normal"):
            raise ValueError(f"opencluster sync must be full or normal, not {self.sync!r}")
        for name in ("max_name", "max_value", "max_payload", "max_keys", "max_inflight"):
            _positive(f"opencluster {name}", getattr(self, name))
        # A frame of the largest name and value must fit: 16 bytes of hashes, expiry and
        # full_wait, two 4-byte lengths.
        if self.max_payload > (1 << 31) - 1:
            raise ValueError("opencluster max_payload must fit the header's i32 length")
        if self.max_payload < 24 + self.max_name + 4:
            raise ValueError(
                "opencluster max_payload must hold a set of a max_name name "
                f"(at least {24 + self.max_name + 4})"
            )
        if self.tls_key is not None and self.tls_cert is None:
            raise ValueError("opencluster tls_key needs tls_cert")
        if self.listen:
            self.address("127.0.0.1")

    def address(self, bind: str) -> tuple[str, int] | None:
        """Where to listen, or None when off; a bare port listens on the broker's ``bind``."""
        return listen_address("opencluster", self.listen or "", bind, OPENCLUSTER_PORT)


@dataclass(slots=True)
class Settings:
    port: int = DEFAULT_PORT
    bind: str = "127.0.0.1"
    node_id: str = ""  # IPv4 used in hops; empty means the host name's address
    config_db: Path = Path("var/fqd.sqlite")
    queue_dir: Path = Path("var/queues")
    web_root: Path | None = None  # None serves the web UI shipped in the package
    modules: list[str] = field(default_factory=list)  # rule-function modules (-m)
    debug: str = ""  # -v flags: mem,msg,route,io,conn,config,peer,http
    max_message_size: int = 1 << 28
    default_backlog: int = 16384
    idle_sniff_timeout: float = 30.0  # seconds a new connection may take to say what it is
    fsync: str = "interval"  # disk queues: always | interval | never
    fsync_interval_ms: float = 5.0  # group-commit window for fsync = "interval"
    segment_bytes: int = 64 << 20  # disk-queue segment file size
    admin_token: str = ""  # when set, /submit, checkpoints and /shutdown need it
    # --- P12 HTTP reads (docs/security.md) ---
    http_auth_reads: bool = False  # /stats.json, /metrics, /queue/*, /topic/*, the UI need auth
    read_token: str = ""  # a bearer token for the reads (a Prometheus scraper's); never admin
    http_shutdown: bool = False  # whether /shutdown stops the broker (fqd: HTTP_SHUTDOWN=1)
    upstream: list[Upstream] = field(default_factory=list)  # peers, besides the sqlite table
    peer_poll_seconds: float = 1.0  # how often the sqlite upstream table is read again
    peer_dedupe: int = 0  # message ids from peers remembered to drop repeats; 0: off, as fqd
    confirm_pair_timeout: float = 10.0  # seconds a confirm waits for the data socket to pair
    # --- P8 resource limits and bad input (docs/limits.md) ---
    max_connections: int = 0  # all connections; 0: from RLIMIT_NOFILE, an eighth kept back
    max_connections_per_address: int = 0  # from one source address; 0: no such limit
    max_queues_per_user: int = 256  # permanent or disk queues a user creates; 0: no limit
    disk_queues_per_second: float = 10.0  # new disk queues, broker-wide; 0: no limit
    log_lines_per_second: int = 5  # log lines per kind of bad input or refusal
    # --- P8 memory bounds (docs/memory.md) ---
    backlog_bytes: int = 64 << 20  # a memory queue's backlog in bytes, unless it says; 0: none
    memory_budget: int = 1 << 30  # bytes held by memory queues and reads in flight, broker-wide
    http_max_body: int = 16 << 20  # largest HTTP request body (/submit); larger gets 413
    # --- P10 front ends of their own ports ---
    lumberjack: Lumberjack = field(default_factory=Lumberjack)  # off until ``listen`` is set
    # --- P11 retained topics and the Figg listener (docs/topics.md) ---
    figg: Figg = field(default_factory=Figg)  # off until ``listen`` is set
    # --- P13 the fyrehose backbone (docs/fyrehose.md) ---
    fyrehose: Fyrehose = field(default_factory=Fyrehose)  # off until ``listen`` is set
    # --- P14 the OpenCluster key/value store (docs/opencluster.md) ---
    opencluster: OpenCluster = field(default_factory=OpenCluster)  # off until ``listen``
    # --- P12 security (docs/security.md) ---
    auth: str = "none"  # "none": fq's behaviour, no password checked; "password": users
    allow_open_network: bool = False  # listen beyond loopback with auth = "none" anyway
    # --- P12 TLS on the main port (docs/tls.md) ---
    tls_cert: Path | None = None  # PEM certificate chain: TLS clients accepted when given
    tls_key: Path | None = None  # PEM private key; None: it is in tls_cert's file
    tls_required: bool = False  # refuse plain connections on the main port (needs tls_cert)
    # --- P15 /metrics (docs/http.md) ---
    metrics_client_series_max: int = 1000  # fq_client_* series while at most this many clients

    @classmethod
    def from_toml(cls, path: Path | str) -> Settings:
        with open(path, "rb") as fh:
            data = tomllib.load(fh)
        values = dict(data.get("fqd", data))
        if "fqd" in data:
            # Tables of their own beside [fqd].
            for table in ("upstream", "lumberjack", "figg", "fyrehose", "opencluster"):
                if table in data:
                    values[table] = data[table]
        return cls().updated(values)

    def updated(self, values: dict[str, Any]) -> Settings:
        """A copy with ``values`` applied; unknown keys are an error, not silently ignored."""
        known = {f.name: f for f in fields(self)}
        out = Settings(**{name: getattr(self, name) for name in known})
        for key, value in values.items():
            name = key.replace("-", "_")
            if name not in known:
                raise ValueError(f"unknown setting {key!r}")
            if value is None:
                continue
            if name in ("config_db", "queue_dir", "web_root", "tls_cert", "tls_key"):
                value = Path(value)
            elif name == "upstream":
                value = [v if isinstance(v, Upstream) else Upstream.from_table(v) for v in value]
            elif name == "lumberjack" and not isinstance(value, Lumberjack):
                value = Lumberjack.from_table(value)
            elif name == "figg" and not isinstance(value, Figg):
                if not isinstance(value, dict):
                    raise ValueError("figg must be a table")
                value = Figg.from_table(value)
            elif name == "fyrehose" and not isinstance(value, Fyrehose):
                value = Fyrehose.from_table(value)
            elif name == "opencluster" and not isinstance(value, OpenCluster):
                value = OpenCluster.from_table(value)
            setattr(out, name, value)
        out.check()
        return out

    def check(self) -> None:
        """Raise ValueError for a security setting the broker cannot work with."""
        if self.auth not in AUTH_MODES:
            raise ValueError(f"auth must be one of {', '.join(AUTH_MODES)}, not {self.auth!r}")
        if not isinstance(self.allow_open_network, bool):
            raise ValueError("allow_open_network must be true or false")
        if not isinstance(self.http_auth_reads, bool):
            raise ValueError("http_auth_reads must be true or false")
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

    def open_to_anyone(self) -> list[str]:
        """The listen addresses anyone on the network may use without a password: those
        beyond loopback while auth is "none" (empty under "password")."""
        if self.auth != "none":
            return []
        wanted = [self.bind]
        for address in (
            self.lumberjack.address(self.bind),
            self.figg.address(self.bind),
            self.fyrehose.address(self.bind),
            self.opencluster.address(self.bind),
        ):
            if address is not None:
                wanted.append(address[0])
        return [host for host in dict.fromkeys(wanted) if not is_loopback(host)]


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
