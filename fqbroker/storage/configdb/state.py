"""The configuration store: permanent queues, bindings and peers in sqlite (fqd_config.c).

The schema is fqd's own, column for column, and rows are written as fqd writes them (names
as raw bytes in TEXT columns, booleans as the text ``'true'``/``'false'``), so an existing
``fqd.sqlite`` works as our ``-c`` database unchanged and the other way round. Where we
differ from fqd on purpose (an unbind deletes its row, among others) is listed in
docs/fq-protocol.md §3.5.
"""

from __future__ import annotations

import contextlib
import logging
import sqlite3
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from fqbroker.core.queuespec import QueueKind, QueueSpec, parse_queue_field
from fqbroker.settings.broker import Upstream
from fqbroker.storage.files import private_dirs, private_file

__all__ = ["ConfigStore", "StoredBinding", "StoredQueue", "Upstream"]

log = logging.getLogger(__name__)

SCHEMA = """
CREATE TABLE IF NOT EXISTS queue (
    name TEXT PRIMARY KEY, type TEXT DEFAULT "mem", attributes TEXT);
CREATE TABLE IF NOT EXISTS binding (
    exchange TEXT, queue TEXT, peermode BOOLEAN DEFAULT FALSE, program TEXT,
    UNIQUE(exchange,queue,peermode,program),
    FOREIGN KEY(queue) REFERENCES queue(name));
CREATE TABLE IF NOT EXISTS upstream (
    host TEXT, port INTEGER DEFAULT 8765, source TEXT, password TEXT, exchange TEXT,
    program TEXT DEFAULT '', permanent_binding BOOLEAN DEFAULT FALSE,
    UNIQUE(host,port,source,password,exchange,program,permanent_binding));
"""


@dataclass(frozen=True, slots=True)
class StoredQueue:
    name: bytes
    kind: bytes
    attributes: bytes

    def spec(self) -> QueueSpec:
        """The queue as a client would have asked for it; restored queues stay permanent."""
        field = self.name + b"\x00" + self.kind + b":" + self.attributes + b",permanent"
        return parse_queue_field(field)


@dataclass(frozen=True, slots=True)
class StoredBinding:
    exchange: bytes
    queue: bytes
    peermode: bool
    program: bytes


def _bool(value: object) -> bool:
    # fqd writes 'true'/'false'; someone editing by hand may write 1/0 or TRUE.
    if isinstance(value, bytes):
        value = value.decode(errors="replace")
    return str(value).strip().lower() in ("true", "1", "t", "yes")


def _text(value: bool) -> str:
    return "true" if value else "false"


class ConfigStore:
    """One sqlite configuration database."""

    def __init__(self, path: Path | str) -> None:
        self.path = Path(path)
        if str(path) != ":memory:":
            private_dirs(self.path.parent)
            private_file(self.path)  # it holds password hashes (configdb/users.py)
        self._db = sqlite3.connect(str(path), isolation_level=None)
        self._db.text_factory = bytes
        self._db.execute("PRAGMA foreign_keys = ON")
        self._db.executescript(SCHEMA)

    def close(self) -> None:
        self._db.close()

    # --- reading --------------------------------------------------------------------------

    def queues(self) -> list[StoredQueue]:
        rows = self._db.execute("SELECT name, type, attributes FROM queue").fetchall()
        return [StoredQueue(n, t or b"mem", a or b"") for n, t, a in rows]

    def bindings(self) -> list[StoredBinding]:
        rows = self._db.execute("SELECT exchange, queue, peermode, program FROM binding")
        return [StoredBinding(e, q, _bool(p), prog) for e, q, p, prog in rows.fetchall()]

    def upstreams(self) -> Iterator[Upstream]:
        rows = self._db.execute(
            "SELECT host, port, source, password, exchange, program, permanent_binding "
            "FROM upstream"
        )
        for host, port, source, password, exchange, program, permanent in rows.fetchall():
            yield Upstream(
                host.decode(),
                int(port or 8765),
                (source or b"").decode(),
                (password or b"").decode(),
                exchange or b"",
                program or b"",
                _bool(permanent),
            )

    # --- writing --------------------------------------------------------------------------

    def save_queue(self, spec: QueueSpec) -> None:
        kind = str(spec.kind if isinstance(spec.kind, QueueKind) else QueueKind.MEM)
        self._db.execute(
            "INSERT OR REPLACE INTO queue (name, type, attributes) VALUES (CAST(? AS TEXT), ?, ?)",
            (spec.name, kind, spec.attributes),
        )

    def delete_queue(self, name: bytes) -> None:
        with self._transaction():
            self._db.execute("DELETE FROM binding WHERE queue = CAST(? AS TEXT)", (name,))
            self._db.execute("DELETE FROM queue WHERE name = CAST(? AS TEXT)", (name,))

    def save_binding(self, binding: StoredBinding) -> bool:
        """Persist a permanent binding; False when its queue is not a permanent one."""
        try:
            self._db.execute(
                "INSERT OR IGNORE INTO binding (exchange, queue, peermode, program) "
                "VALUES (CAST(? AS TEXT), CAST(? AS TEXT), ?, CAST(? AS TEXT))",
                (binding.exchange, binding.queue, _text(binding.peermode), binding.program),
            )
        except sqlite3.IntegrityError:
            # As in fqd, a binding can only be as permanent as its queue.
            return False
        return True

    def delete_binding(self, binding: StoredBinding) -> None:
        self._db.execute(
            "DELETE FROM binding WHERE exchange = CAST(? AS TEXT) AND queue = CAST(? AS TEXT) "
            "AND program = CAST(? AS TEXT)",
            (binding.exchange, binding.queue, binding.program),
        )

    def add_upstream(self, row: Upstream) -> bool:
        """Store an ``upstream`` row; False when the same row is there already."""
        cur = self._db.execute(
            "INSERT OR IGNORE INTO upstream (host, port, source, password, exchange, program, "
            "permanent_binding) VALUES (?, ?, ?, ?, CAST(? AS TEXT), CAST(? AS TEXT), ?)",
            (row.host, row.port, row.source, row.password, row.exchange, row.program,
             _text(row.permanent_binding)),
        )  # fmt: skip
        return cur.rowcount > 0

    def delete_upstreams(
        self, host: str, port: int, exchange: bytes, program: bytes | None, source: str | None
    ) -> int:
        """Delete the ``upstream`` rows pulling ``exchange`` from ``host:port`` (only those
        of ``program`` and ``source`` when given); how many went."""
        sql = "DELETE FROM upstream WHERE host = ? AND port = ? AND exchange = CAST(? AS TEXT)"
        args: list[object] = [host, port, exchange]
        if program is not None:
            sql += " AND program = CAST(? AS TEXT)"
            args.append(program)
        if source is not None:
            sql += " AND source = ?"
            args.append(source)
        return self._db.execute(sql, args).rowcount

    @contextlib.contextmanager
    def _transaction(self) -> Iterator[None]:
        self._db.execute("BEGIN")
        try:
            yield
        except BaseException:
            self._db.execute("ROLLBACK")
            raise
        self._db.execute("COMMIT")
