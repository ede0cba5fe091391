"""Broker settings: one dataclass, from defaults < TOML file < command line (fqd.c).

The defaults mirror fqd's, except that the broker listens on 127.0.0.1 unless told
otherwise, and keeps its state under ``./var`` rather than ``/usr/local/var/lib/fq``.
"""

from __future__ import annotations

import ipaddress
import socket
import tomllib
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

__all__ = ["DEFAULT_PORT", "Settings", "Upstream", "resolve_node_id"]

DEFAULT_PORT = 8765


@dataclass(frozen=True, slots=True)
class Upstream:
    """One row of fqd's ``upstream`` table: pull ``exchange`` through ``program`` from a
    broker at ``host:port``, logging in with ``source`` and ``password`` (§5.1)."""

    host: str
    port: int
    source: str
    password: str
    exchange: bytes
    program: bytes
    permanent_binding: bool

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
        )


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

    @classmethod
    def from_toml(cls, path: Path | str) -> Settings:
        with open(path, "rb") as fh:
            data = tomllib.load(fh)
        values = dict(data.get("fqd", data))
        if "fqd" in data and "upstream" in data:
            values["upstream"] = data["upstream"]
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
            if name in ("config_db", "queue_dir", "web_root"):
                value = Path(value)
            elif name == "upstream":
                value = [v if isinstance(v, Upstream) else Upstream.from_table(v) for v in value]
            setattr(out, name, value)
        return out


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
