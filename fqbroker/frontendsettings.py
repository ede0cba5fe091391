"""The settings tables of the front ends on ports of their own: ``[lumberjack]``,
``[figg]``, ``[fyrehose]`` and ``[opencluster]`` of the TOML file. Each is a frozen
dataclass whose ``updated`` refuses unknown keys and whose ``check`` raises ValueError for a
value its listener cannot work with. fqbroker.config re-exports them beside Settings.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

__all__ = [
    "Figg",
    "Fyrehose",
    "Lumberjack",
    "OpenCluster",
    "TopicRetention",
    "listen_address",
]

LUMBERJACK_PORT = 5044  # the Beats convention, for a ``listen`` that names a host only
FIGG_PORT = 8119  # the Figg seed's, for a ``listen`` that names a host only
FYREHOSE_PORT = 2323  # the fyrehose seed's example port, for a ``listen`` naming a host only
OPENCLUSTER_PORT = 13600  # the protocol's customary port, for a ``listen`` naming a host only


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
