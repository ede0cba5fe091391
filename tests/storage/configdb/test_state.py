"""Permanent configuration in sqlite with fqd's schema (docs/fq-protocol.md §3.5), across
restarts."""

from __future__ import annotations

import sqlite3
from pathlib import Path

from fqbroker.protocols.fq import wire
from fqbroker.server.broker import Broker
from fqbroker.settings.broker import Settings
from tests.conftest import open_session, wait_for

# fqd 0.13.12's tables, as its setup_initial_config creates them (docs/fq-protocol.md §3.5).
FQD_SCHEMA = """
CREATE TABLE queue (name TEXT PRIMARY KEY, type TEXT DEFAULT "mem", attributes TEXT);
CREATE TABLE binding (exchange TEXT, queue TEXT, peermode BOOLEAN DEFAULT FALSE, program TEXT,
        UNIQUE(exchange,queue,peermode,program), FOREIGN KEY(queue) REFERENCES queue(name));
CREATE TABLE upstream (host TEXT, port INTEGER DEFAULT 8765, source TEXT, password TEXT,
        exchange TEXT, program TEXT DEFAULT '', permanent_binding BOOLEAN DEFAULT FALSE,
        UNIQUE(host,port,source,password,exchange,program,permanent_binding));
"""


def _rows(db: Path, sql: str) -> list[tuple[object, ...]]:
    with sqlite3.connect(db) as conn:
        return conn.execute(sql).fetchall()


def test_schema_is_fqds_column_for_column(settings: Settings, tmp_path: Path) -> None:
    Broker(settings).catalog.close()
    reference = tmp_path / "reference.sqlite"
    with sqlite3.connect(reference) as conn:
        conn.executescript(FQD_SCHEMA)
    for table in ("queue", "binding", "upstream"):
        ours = _rows(settings.config_db, f"PRAGMA table_info({table})")
        theirs = _rows(reference, f"PRAGMA table_info({table})")
        assert ours == theirs, table


async def test_an_fqd_written_database_is_read(settings: Settings) -> None:
    with sqlite3.connect(settings.config_db) as conn:
        conn.executescript(FQD_SCHEMA)
        conn.executemany(
            "INSERT INTO queue VALUES (?, ?, ?)",
            [
                ("pq", "mem", "private,drop,backlog=16384"),
                ("toolq", "mem", "public,drop,backlog=-1"),
            ],
        )
        conn.executemany(
            "INSERT INTO binding VALUES (?, ?, ?, ?)",
            [("tx", "pq", "false", "prefix:"), ("maryland", "toolq", "false", 'prefix:"x."')],
        )
    async with Broker(settings) as broker:
        assert broker.established == (2, 2, 2)
        toolq = broker.queues[b"toolq"]
        assert (toolq.private, toolq.backlog_limit, toolq.permanent) == (False, -1, True)
        publisher = await open_session(broker.port)
        await publisher.publish(b"maryland", b"x.1", b"kept")
        await publisher.publish(b"tx", b"any", b"kept too")
        await wait_for(lambda: toolq.backlog == 1 and broker.queues[b"pq"].backlog == 1)
        reader = await open_session(broker.port, b"u", b"toolq\x00mem:public")
        assert [m.payload for m in await reader.receive()] == [b"kept"]
        await reader.close()
        await publisher.close()


async def test_permanent_queue_and_bindings_survive_a_restart(settings: Settings) -> None:
    async with Broker(settings) as broker:
        s = await open_session(broker.port, b"u", b"pq\x00mem:public,backlog=100,permanent")
        assert await s.bind(b"ex", b'prefix:"a."', 0x0110) == 1
        assert await s.bind(b"ex", b'prefix:"b."', 0x0100) == 2  # transient binding
        await s.close()
    assert _rows(settings.config_db, "SELECT name, type, attributes FROM queue") == [
        ("pq", "mem", "public,drop,backlog=100")
    ]
    assert _rows(settings.config_db, "SELECT * FROM binding") == [
        ("ex", "pq", "false", 'prefix:"a."')
    ]
    async with Broker(settings) as broker:
        assert broker.established == (1, 1, 1)
        queue = broker.queues[b"pq"]
        assert queue.permanent and not queue.private and queue.limit == 100
        publisher = await open_session(broker.port)
        await publisher.publish(b"ex", b"a.1", b"routed")
        await publisher.publish(b"ex", b"b.1", b"transient binding is gone")
        await wait_for(lambda: broker.clients[publisher.key].stats.msgs_in == 2)
        assert queue.backlog == 1
        # A restored queue stays permanent when its first client leaves (fqd forgets).
        s = await open_session(broker.port, b"u", b"pq\x00mem:public")
        assert [m.payload for m in await s.receive()] == [b"routed"]
        await s.close()
        await wait_for(lambda: not queue.clients)
        assert b"pq" in broker.queues
        await publisher.close()


async def test_unbind_and_transient_rebind_delete_rows(settings: Settings) -> None:
    async with Broker(settings) as broker:
        s = await open_session(broker.port, b"u", b"pq\x00mem:permanent")
        first = await s.bind(b"ex", b"prefix:a", 0x0110)
        await s.bind(b"ex", b"prefix:b", 0x0110)
        assert len(_rows(settings.config_db, "SELECT * FROM binding")) == 2
        await s.cmd.send(wire.encode(wire.UnbindRequest(first, b"ex")))
        assert await s.cmd.reply() == wire.UnbindResponse(first)
        assert await s.bind(b"ex", b"prefix:b", 0x0100) == 2  # fqtool -b
        assert _rows(settings.config_db, "SELECT * FROM binding") == []
        await s.close()
    async with Broker(settings) as broker:
        assert broker.established == (0, 1, 0)


async def test_making_a_queue_transient_deletes_it(settings: Settings) -> None:
    async with Broker(settings) as broker:
        s = await open_session(broker.port, b"u", b"pq\x00mem:permanent")
        await s.bind(b"ex", b"prefix:", 0x0110)
        await s.close()
        await wait_for(lambda: not broker.queues[b"pq"].clients)
        t = await open_session(broker.port, b"u", b"pq\x00mem:transient")  # fqtool -D
        await t.close()
        await wait_for(lambda: b"pq" not in broker.queues)
    assert _rows(settings.config_db, "SELECT * FROM queue") == []
    assert _rows(settings.config_db, "SELECT * FROM binding") == []


async def test_permanent_binding_on_a_transient_queue_is_not_persisted(settings: Settings) -> None:
    async with Broker(settings) as broker:
        s = await open_session(broker.port, b"u", b"tq")
        assert await s.bind(b"ex", b"prefix:", 0x0110) == 1
        await s.close()
    assert _rows(settings.config_db, "SELECT * FROM binding") == []


async def test_names_are_kept_byte_for_byte(settings: Settings) -> None:
    name = 'q\u00e9"x'.encode()
    async with Broker(settings) as broker:
        s = await open_session(broker.port, b"u", name + b"\x00mem:permanent")
        await s.bind(b"\xff\xfeex", b"prefix:", 0x0110)
        await s.close()
    async with Broker(settings) as broker:
        assert name in broker.queues
        assert b"\xff\xfeex" in broker.router.exchanges
