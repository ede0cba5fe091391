"""A blocking client for replaying readers: queue setup, positions, range reads, checkpoints.

Spark runs the fq source's code in plain Python processes with no event loop, one call at
a time, so this client is synchronous: ``http.client`` for the replay, topic and checkpoint
endpoints (:mod:`fqbroker.frontends.http.reads.queues`,
:mod:`~fqbroker.frontends.http.reads.topics`),
and the sans-IO :class:`~fqbroker.clients.fq.channel.CommandChannel` over a blocking socket to
create a queue and bind it. It keeps no connection between calls, so objects holding it
stay picklable. A topic is read by 0-based message index, which an entry's ``seq`` is then.
"""

from __future__ import annotations

import base64
import contextlib
import http.client
import json
import socket
import ssl
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlencode

from fqbroker.clients.fq.channel import Authenticated, CommandChannel, Refused, Reply
from fqbroker.clients.tls import shared_client_ssl
from fqbroker.errors import BrokerError, DataLost, ProtocolError
from fqbroker.protocols.fq import wire
from fqbroker.protocols.replay import (
    CONTENT_TYPE,
    DEFAULT_READ_BYTES,
    Entry,
    decode_entries,
)
from fqbroker.storage.configdb.checkpoints import format_position

__all__ = ["BrokerError", "DataLost", "QueueInfo", "ReplayClient", "TopicInfo"]

IN_USE = "requested queue is private and in use"
SETUP_PATIENCE = 10.0  # seconds to wait for another setup holding a private queue
RETRY_FIRST = 0.1  # seconds before the first retry of a request that found no broker
RETRY_MAX = 2.0  # the most between retries


@dataclass(frozen=True, slots=True)
class QueueInfo:
    first: int  # the oldest stored seq
    next: int  # one past the newest readable seq
    checkpoints: dict[str, int] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class TopicInfo:
    first: int  # index of the oldest retained message
    next: int  # index the next durable message will have
    size_bytes: int = 0
    subscribers: int = 0


@dataclass(frozen=True, slots=True)
class ReplayClient:
    host: str = "127.0.0.1"
    port: int = 8765
    token: str = ""  # the broker's admin token, for checkpoints
    # A user's login for HTTP (Basic), when no token is given: under auth = "password"
    # a queue's contents need the queue right, a checkpoint the admin right.
    user: str = ""
    password: str = ""
    timeout: float = 30.0
    # How long an HTTP request keeps trying while the broker cannot be reached (a
    # restart); every request this client makes is safe to repeat. 0: one try.
    retry_seconds: float = 0.0
    # TLS to the broker's main port (fq and HTTPS share it): plain values, not a context,
    # so that Spark can pickle the client to its executors.
    tls: bool = False
    cafile: str = ""

    # --- setup over the fq protocol -------------------------------------------------------

    def ensure_queue(
        self,
        queue: str,
        *,
        params: str = "disk:permanent,private,backlog=-1",
        user: str = "spark",
        password: str = "",
        exchange: str = "",
        program: str = "prefix:",
    ) -> None:
        """Create ``queue`` if missing and, with an ``exchange``, bind it permanently.

        Authenticating creates the queue; a permanent binding survives this connection and
        broker restarts, so messages go on arriving while no reader runs. Binding the same
        program again finds the existing binding. No data socket is opened, so nothing
        is consumed.
        """
        deadline = time.monotonic() + SETUP_PATIENCE
        while True:
            try:
                self._setup(queue, params, user, password, exchange, program)
                return
            except BrokerError as exc:
                # A private queue takes one client: another setup may hold it for a moment.
                if IN_USE not in exc.text or time.monotonic() > deadline:
                    raise
                time.sleep(0.1)

    def _setup(
        self, queue: str, params: str, user: str, password: str, exchange: str, program: str
    ) -> None:
        channel: CommandChannel[None] = CommandChannel()
        field_ = queue.encode() + b"\0" + params.encode()
        try:
            with self._connect() as sock:
                sock.sendall(channel.hello(user.encode(), field_, password.encode()))
                event = _next_event(sock, channel)
                if isinstance(event, Refused):
                    raise BrokerError(f"queue {queue!r} refused: {event.text.strip()}")
                if not exchange:
                    return
                bind = wire.BindRequest(wire.BindFlags.PERM, exchange.encode(), program.encode())
                sock.sendall(channel.request(bind, None))
                reply = _next_event(sock, channel)
                assert isinstance(reply, Reply) and isinstance(reply.frame, wire.BindResponse)
                if reply.frame.route_id == wire.BIND_ILLEGAL:
                    raise BrokerError(f"cannot bind {program!r} on exchange {exchange!r}")
        except (OSError, ProtocolError) as exc:
            raise BrokerError(f"queue setup at {self.host}:{self.port} failed: {exc}") from exc

    def _connect(self) -> socket.socket:
        sock = socket.create_connection((self.host, self.port), self.timeout)
        context = self._ssl()
        if context is None:
            return sock
        try:
            return context.wrap_socket(sock, server_hostname=self.host)
        except BaseException:
            sock.close()
            raise

    def _ssl(self) -> ssl.SSLContext | None:
        return shared_client_ssl(self.tls, self.cafile) if self.tls or self.cafile else None

    # --- positions and reads --------------------------------------------------------------

    def info(self, queue: str) -> QueueInfo:
        status, body, _ = self._get("/queue/info", {"queue": queue})
        doc = _json(body)
        if status != 200:
            raise BrokerError(f"queue {queue!r}: {doc.get('error', status)}")
        return QueueInfo(int(doc["first"]), int(doc["next"]), dict(doc["checkpoints"]))

    def read(
        self, queue: str, start: int, stop: int, max_bytes: int = DEFAULT_READ_BYTES
    ) -> list[Entry]:
        """Entries from ``start`` on, before ``stop``: as many as fit in ``max_bytes``.

        Raises :class:`DataLost` when ``start`` was trimmed away.
        """
        args = {"queue": queue, "from": start, "to": stop, "max_bytes": max_bytes}
        status, body, content_type = self._get("/queue/read", args)
        if status == 410:
            doc = _json(body)
            raise DataLost(f"queue {queue!r}: {doc['error']}", int(doc["first"]))
        if status != 200 or content_type != CONTENT_TYPE:
            raise BrokerError(f"queue {queue!r}: {_json(body).get('error', status)}")
        return decode_entries(body)

    def read_range(self, queue: str, start: int, stop: int) -> Iterator[list[Entry]]:
        """Every entry of ``[start, stop)``, a response at a time.

        Raises :class:`DataLost` if some of them are not stored (any more): trimmed away,
        or lost when the broker crashed before they were durable.
        """
        seq = start
        while seq < stop:
            entries = self.read(queue, seq, stop)
            if not entries or entries[0].seq != seq:
                raise DataLost(f"queue {queue!r}: seq {seq} is not stored", seq)
            yield entries
            seq = entries[-1].seq + 1

    def topic_info(self, topic: str, *, missing_ok: bool = False) -> TopicInfo:
        """The topic's retained index range; :class:`BrokerError` if there is no such topic
        (with ``missing_ok``, an empty one: a topic is created by its first message) or the
        broker keeps no topics."""
        status, body, _ = self._get("/topic/info", {"topic": topic})
        doc = _json(body)
        if status == 404 and missing_ok and doc.get("configured") == 1:
            return TopicInfo(0, 0)
        if status != 200:
            raise BrokerError(f"topic {topic!r}: {doc.get('error', status)}")
        return TopicInfo(
            int(doc["first"]), int(doc["next"]), int(doc["size_bytes"]), int(doc["subscribers"])
        )

    def read_topic(
        self, topic: str, start: int, stop: int, max_bytes: int = DEFAULT_READ_BYTES
    ) -> list[Entry]:
        """Messages of index ``start`` on, before ``stop``: as many as fit in ``max_bytes``.

        Each entry's ``seq`` is the message index. Raises :class:`DataLost` (with the
        topic's first index) when retention deleted ``start``.
        """
        args = {"topic": topic, "from": start, "to": stop, "max_bytes": max_bytes}
        status, body, content_type = self._get("/topic/read", args)
        if status == 410:
            doc = _json(body)
            raise DataLost(f"topic {topic!r}: {doc['error']}", int(doc["first"]))
        if status != 200 or content_type != CONTENT_TYPE:
            raise BrokerError(f"topic {topic!r}: {_json(body).get('error', status)}")
        return decode_entries(body)

    def read_topic_range(self, topic: str, start: int, stop: int) -> Iterator[list[Entry]]:
        """Every message of index ``[start, stop)``, a response at a time.

        Raises :class:`DataLost` if some are not stored: deleted by retention (its
        ``first`` is then past ``start``) or skipped as damaged.
        """
        index = start
        while index < stop:
            entries = self.read_topic(topic, index, stop)
            if not entries or entries[0].seq != index:
                found = entries[0].seq if entries else stop
                raise DataLost(f"topic {topic!r}: index {index} is not stored", found)
            yield entries
            index = entries[-1].seq + 1

    def set_checkpoint(self, queue: str, name: str, seq: int) -> None:
        """Move the named checkpoint to ``seq`` (the next seq its reader needs)."""
        args = {"cpname": name, "qname": queue, "chkptid": format_position(seq)}
        # POST: the broker takes no change by GET (docs/security.md); the query says it all.
        status, body, _ = self._get("/add_checkpoint", args, method="POST")
        doc = _json(body)
        if status != 200 or doc.get("status") != "success":
            raise BrokerError(f"checkpoint {name!r} on {queue!r}: {doc.get('message', doc)}")

    def _get(
        self, path: str, args: Mapping[str, object], *, method: str = "GET"
    ) -> tuple[int, bytes, str]:
        deadline = time.monotonic() + self.retry_seconds
        delay = RETRY_FIRST
        while True:
            try:
                return self._get_once(path, args, method)
            except (OSError, http.client.HTTPException) as exc:
                # Refused, reset, or cut off mid-answer: no answer to act on. Requests here
                # are reads or set a checkpoint to a given place, so asking again is safe.
                if time.monotonic() + delay > deadline:
                    where = f"{self.host}:{self.port}"
                    raise BrokerError(f"cannot reach the broker at {where}: {exc!r}") from exc
            time.sleep(delay)
            delay = min(delay * 2, RETRY_MAX)

    def _get_once(
        self, path: str, args: Mapping[str, object], method: str
    ) -> tuple[int, bytes, str]:
        context = self._ssl()
        conn = (
            http.client.HTTPConnection(self.host, self.port, timeout=self.timeout)
            if context is None
            else http.client.HTTPSConnection(
                self.host, self.port, timeout=self.timeout, context=context
            )
        )
        try:
            conn.request(method, f"{path}?{urlencode(args)}", headers=self._credentials())
            response = conn.getresponse()
            body = response.read()
            return response.status, body, response.getheader("content-type", "")
        finally:
            conn.close()

    def _credentials(self) -> dict[str, str]:
        if self.token:
            return {"X-Fq-Token": self.token}
        if self.user and self.password:
            login = base64.b64encode(f"{self.user}:{self.password}".encode()).decode()
            return {"Authorization": f"Basic {login}"}
        return {}


def _next_event(
    sock: socket.socket, channel: CommandChannel[None]
) -> Authenticated | Refused | Reply[None]:
    while (event := channel.next_event()) is None:
        if out := channel.data_to_send():
            sock.sendall(out)  # heartbeat answers
        chunk = sock.recv(65536)
        if not chunk:
            raise BrokerError("the broker closed the command connection")
        channel.receive_data(chunk)
    return event


def _json(body: bytes) -> dict[str, Any]:
    with contextlib.suppress(ValueError):
        doc = json.loads(body)
        if isinstance(doc, dict):
            return doc
    return {"error": body[:200].decode(errors="replace")}
