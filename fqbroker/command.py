"""The command channel: auth, then bind/unbind/status/heartbeats (fqd_ccs.c).

Phases: AWAIT_AUTH -> READY -> CLOSED. Commands are handled in order in this one task,
so replies go out in request order however many a client pipelines (§1.5). A second
task only sends heartbeats and enforces the 3x timeout once a client asked for them
with ``HeartbeatRequest`` (§1.7).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import time
from collections.abc import Coroutine
from enum import Enum
from typing import TYPE_CHECKING

from . import wire
from .errors import AuthError, ProtocolError, QueueError
from .queuespec import parse_queue_field
from .router import ClientStats

if TYPE_CHECKING:
    from .data import DataSession
    from .queue import Queue
    from .server import Broker

__all__ = ["CommandSession", "Phase"]

log = logging.getLogger(__name__)

READ_SIZE = 65536


class Phase(Enum):
    AWAIT_AUTH = "await_auth"
    READY = "ready"
    CLOSED = "closed"


class CommandSession:
    """One authenticated client: its queue, key, counters and (paired) data channel."""

    def __init__(
        self,
        broker: Broker,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        leftover: bytes = b"",
    ) -> None:
        self.broker = broker
        self.reader = reader
        self.writer = writer
        self.phase = Phase.AWAIT_AUTH
        self.decoder = wire.ServerCommandDecoder()
        self.decoder.feed(leftover)
        peer = writer.get_extra_info("peername") or ("0.0.0.0", 0)
        self.remote_addr: str = peer[0]
        self.remote_port: int = peer[1]
        self.user = b""
        self.queue: Queue | None = None
        self.key = b""
        self.stats = ClientStats()
        self.data: DataSession | None = None
        self.heartbeat_ms = 0
        self._last_read = time.monotonic()
        self._last_sent = time.monotonic()
        self._heartbeat_changed = asyncio.Event()
        self._closing = asyncio.Event()
        # Replies not yet sent because an earlier one (a confirm) is still pending.
        self._replies: collections.deque[asyncio.Future[wire.Frame]] = collections.deque()

    @property
    def pretty(self) -> str:
        queue = self.queue.name.decode(errors="replace") if self.queue else "?"
        return f"{self.user.decode(errors='replace')}/{queue}@{self.remote_addr}:{self.remote_port}"

    def _send(self, frame: wire.Frame) -> None:
        if not self.writer.is_closing():
            self.writer.write(wire.encode(frame))
            self._last_sent = time.monotonic()

    def _reply(self, frame: wire.Frame) -> None:
        """Answer a request, after any earlier answer still being worked out (confirms)."""
        if not self._replies:
            self._send(frame)
            return
        done: asyncio.Future[wire.Frame] = asyncio.get_running_loop().create_future()
        done.set_result(frame)
        self._replies.append(done)

    def _reply_later(self, work: Coroutine[None, None, wire.Frame]) -> None:
        task = asyncio.ensure_future(work)
        self._replies.append(task)
        task.add_done_callback(lambda _: self._send_ready_replies())

    def _send_ready_replies(self) -> None:
        replies = self._replies
        while replies and replies[0].done():
            future = replies.popleft()
            if not future.cancelled() and future.exception() is None:
                self._send(future.result())

    async def run(self) -> None:
        heartbeats = asyncio.create_task(self._heartbeats())
        try:
            await self._read_loop()
        except (AuthError, QueueError) as exc:
            log.info("refusing %s: %r", self.pretty, exc.text)
            self._send(wire.ErrorReply(exc.text))
            await self.broker.linger_close(self.reader, self.writer)
        except ProtocolError as exc:
            log.info("closing %s: %s", self.pretty, exc)
        except (ConnectionError, asyncio.IncompleteReadError):
            log.debug("connection lost: %s", self.pretty)
        finally:
            self.phase = Phase.CLOSED
            self._closing.set()
            heartbeats.cancel()
            for reply in self._replies:
                reply.cancel()
            self.broker.deregister(self)
            self.writer.close()

    async def _read_loop(self) -> None:
        reader, decoder = self.reader, self.decoder
        while True:
            while (frame := decoder.next_frame()) is not None:
                self._last_read = time.monotonic()
                self._handle(frame)
                if self.phase is Phase.CLOSED:
                    return
            await self.writer.drain()
            chunk = await reader.read(READ_SIZE)
            if not chunk:
                decoder.feed_eof()
                decoder.next_frame()  # an auth request cut short raises its error text
                return
            decoder.feed(chunk)

    def _handle(self, frame: wire.ClientRequest) -> None:
        broker = self.broker
        match frame:
            case wire.AuthPlain(user, queue_field, _password):
                # The password is read and ignored: fq authenticates nobody (§1.3).
                spec = parse_queue_field(queue_field)
                self.user = user
                self.queue = broker.attach(spec, self)
                self.key = broker.register(self)
                self.phase = Phase.READY
                self._send(wire.AuthResponse(self.key))
                self._send(wire.Heartbeat())
                log.info("client %s authenticated", self.pretty)
            case wire.Heartbeat():
                pass
            case wire.HeartbeatRequest(interval_ms):
                self.heartbeat_ms = interval_ms
                self._heartbeat_changed.set()
            case wire.StatusRequest():
                self._reply(wire.Status(self.status_items()))
            case wire.BindRequest(flags, exchange, program):
                assert self.queue is not None
                route_id = broker.bind(exchange, program, self.queue, flags)
                self._reply(wire.BindResponse(route_id))
            case wire.UnbindRequest(route_id, exchange):
                assert self.queue is not None
                ok = broker.unbind(exchange, route_id, self.queue)
                self._reply(wire.UnbindResponse(route_id if ok else wire.BIND_ILLEGAL))
            case wire.ConfirmRequest(count):
                self._reply_later(self._confirm(count))

    async def _confirm(self, count: int) -> wire.Frame:
        data = self.data
        why = "no data channel" if data is None else await data.confirm(count)
        return wire.Confirmed(count) if why is None else wire.ConfirmFailed(count, why)

    def status_items(self) -> tuple[tuple[str, int], ...]:
        assert self.queue is not None
        items: list[tuple[str, int]] = [("dropped_in", self.queue.dropped_to)]
        if self.data is not None:
            s = self.stats
            items += [
                ("no_exchange", s.no_exchange),
                ("no_route", s.no_route),
                ("routed", s.routed),
                ("dropped", s.dropped),
                ("size_dropped", s.size_dropped),
                ("msgs_in", s.msgs_in),
                ("msgs_out", s.msgs_out),
                ("octets_in", s.octets_in),
                ("octets_out", s.octets_out),
            ]
        # Last, so fq clients reading the keys they know see no change: the broker
        # takes confirm requests (docs/confirms.md).
        items.append((wire.CONFIRM_STATUS_KEY, wire.CONFIRM_VERSION))
        return tuple(items)

    async def _heartbeats(self) -> None:
        """Send heartbeats every ``heartbeat_ms`` and fail the client after 3x of silence."""
        next_due = 0.0
        while not self._closing.is_set():
            if self.heartbeat_ms == 0 or self.phase is not Phase.READY:
                self._heartbeat_changed.clear()
                waiter = asyncio.ensure_future(self._heartbeat_changed.wait())
                closer = asyncio.ensure_future(self._closing.wait())
                try:
                    await asyncio.wait({waiter, closer}, return_when=asyncio.FIRST_COMPLETED)
                finally:
                    waiter.cancel()
                    closer.cancel()
                continue
            interval = self.heartbeat_ms / 1000
            now = time.monotonic()
            if now - self._last_read > 3 * interval:
                log.info("client %s heartbeat failed", self.pretty)
                self._send(wire.ErrorReply("client heartbeat failed"))
                with contextlib.suppress(ConnectionError):
                    await self.writer.drain()
                self.close()
                return
            if not next_due:
                next_due = self._last_sent + interval  # one interval after auth's beat
            if now >= next_due:
                self._send(wire.Heartbeat())
                # Due one interval after the last one was *due*, not after it went out:
                # with thousands of sessions the loop runs a wave of timers late, and
                # counting from the send time added that lateness to every period.
                next_due += interval
                if next_due <= now:
                    next_due = now + interval
            next_send = next_due
            deadline = self._last_read + 3 * interval
            delay = max(0.001, min(next_send, deadline) - time.monotonic())
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(delay):
                    await self._closing.wait()

    def close(self) -> None:
        """End the session: the read loop sees EOF and cleans up."""
        self._closing.set()
        self.phase = Phase.CLOSED
        self.writer.close()
        self.reader.feed_eof()
