"""The data channel: messages in from a client, messages out of its queue (fqd_dss.c).

Phases: AWAIT_KEY -> STREAMING -> CLOSED. Once paired with its command session by key
(§1.4), two tasks run side by side:

* ``_pump_in`` reads whatever has arrived, decodes every whole frame, stamps sender and
  hops as fqd does (§1.11) and publishes into the router. Reading what is there, never a
  fixed size per field, keeps it cancel-safe. After a block-policy queue fills up it
  waits for room before reading more, which pushes back on this publisher only.
* ``_pump_out`` waits on the queue, drops messages that already passed through the peer
  at the other end (loop prevention, §5.3), and writes the rest in peer format, one
  write per batch.

A bad frame closes this data channel only; the command session survives and can pair a
new one (§1.9). Messages taken from the queue but not yet written go back to its head.
"""

from __future__ import annotations

import asyncio
import logging
from enum import Enum
from typing import TYPE_CHECKING

from . import wire
from .errors import ProtocolError
from .message import Message, accept_from_peer, frame_hops, has_hop, ipv4_bytes
from .router import ClientStats

if TYPE_CHECKING:
    from .command import CommandSession
    from .server import Broker
    from .store import DiskStore

__all__ = ["DataSession", "Phase"]

log = logging.getLogger(__name__)

READ_SIZE = 256 * 1024
BATCH = 1024
NO_PEER = bytes(4)


class Phase(Enum):
    AWAIT_KEY = "await_key"
    STREAMING = "streaming"
    CLOSED = "closed"


class DataSession:
    def __init__(
        self,
        broker: Broker,
        mode: wire.Mode,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        leftover: bytes = b"",
    ) -> None:
        self.broker = broker
        self.mode = mode
        self.reader = reader
        self.writer = writer
        self.phase = Phase.AWAIT_KEY
        self.hello = wire.DataHelloDecoder(mode)
        self.hello.feed(leftover)
        self.is_peer = mode in (wire.Mode.PEER, wire.Mode.OLD_PEER)
        self.peer_id = NO_PEER
        self.owner: CommandSession | None = None
        peer = writer.get_extra_info("peername") or ("0.0.0.0", 0)
        self.remote_addr: str = peer[0]
        self.remote_port: int = peer[1]
        # The hops a publisher's messages get: this broker, then the publisher (§1.11).
        self._stamp_hops = broker.node_id + ipv4_bytes(self.remote_addr)
        self._stamp_size = 0  # bytes the stamp adds to each frame, once paired
        self._draining = False
        self._pump_out_task: asyncio.Task[None] | None = None
        # Publisher confirms (docs/confirms.md): messages handled so far on this channel,
        # the disk stores they went to with the last seq written, and the number of the
        # first message a disk write failed for.
        self.handled = 0
        self.written: dict[DiskStore, int] = {}
        self.failed_from: int | None = None
        self._progress = asyncio.Event()

    async def run(self) -> None:
        try:
            owner = await self._pair()
            if owner is None:
                return
            self.phase = Phase.STREAMING
            async with asyncio.TaskGroup() as tasks:
                pump_in = tasks.create_task(self._pump_in(owner))
                pump_out = self._pump_out_task = tasks.create_task(self._pump_out(owner))
                # Whichever pump ends first ends the channel...
                await asyncio.wait({pump_in, pump_out}, return_when=asyncio.FIRST_COMPLETED)
                if self._draining and not pump_in.done():
                    # ...except after the command session ended: what the client sent
                    # before it hung up is still routed, as fqd_dss.c reads to EOF.
                    await pump_in
                pump_in.cancel()
                pump_out.cancel()
        except* ProtocolError as group:
            log.info("closing data channel of %s: %s", self._name(), group.exceptions[0])
        except* (ConnectionError, asyncio.IncompleteReadError):
            log.debug("data channel of %s lost", self._name())
        finally:
            self.phase = Phase.CLOSED
            self._progress.set()  # confirms still waiting learn the channel is gone
            if self.owner is not None and self.owner.data is self:
                self.owner.data = None
            self.writer.close()

    def _name(self) -> str:
        return self.owner.pretty if self.owner else f"{self.remote_addr}:{self.remote_port}"

    def close(self) -> None:
        self.writer.close()
        self.reader.feed_eof()

    def drain_then_close(self, linger: float) -> None:
        """The command session ended: send nothing more, read to EOF, close after ``linger``."""
        self._draining = True
        if self._pump_out_task is not None:
            self._pump_out_task.cancel()
        asyncio.get_running_loop().call_later(linger, self.close)

    async def _pair(self) -> CommandSession | None:
        while (hello := self.hello.next_hello()) is None:
            chunk = await self.reader.read(READ_SIZE)
            if not chunk:
                return None
            self.hello.feed(chunk)
        owner = self.broker.clients.get(hello.key)
        if owner is None or owner.data is not None:
            log.info("data channel from %s:%s: unknown or taken key", *self._addr())
            return None
        self.owner = owner
        self.peer_id = hello.peer_id
        owner.data = self
        self._leftover = self.hello.unconsumed()
        self._stamp_size = 2 + len(owner.user) + len(self._stamp_hops)
        log.debug("data channel paired for %s (peer=%s)", owner.pretty, self.is_peer)
        return owner

    def _addr(self) -> tuple[str, int]:
        return self.remote_addr, self.remote_port

    async def _pump_in(self, owner: CommandSession) -> None:
        broker = self.broker
        stats = owner.stats
        decoder = wire.MessageDecoder(
            peer_format=self.is_peer, max_payload=broker.settings.max_message_size
        )
        decoder.feed(self._leftover)
        publish = self._publish_peer_messages if self.is_peer else self._publish_runs
        reader = self.reader
        while True:
            await publish(decoder, stats)
            if decoder.oversized:
                stats.size_dropped += decoder.oversized
                broker.router.aggregate.size_dropped += decoder.oversized
                decoder.oversized = 0
            if decoder.error_pending:
                continue  # the next decode raises it
            chunk = await reader.read(READ_SIZE)
            if not chunk:
                return
            decoder.feed(chunk)

    async def _publish_runs(self, decoder: wire.MessageDecoder, stats: ClientStats) -> None:
        """Route every whole message of this read, stamped with sender and hops (§1.11)."""
        first = self.handled + 1
        assert self.owner is not None
        runs = decoder.runs(self.owner.user, self._stamp_hops)
        octets, decoder.octets = decoder.octets, 0
        publish_runs = self.broker.router.publish_runs
        counted = i = 0
        while i < len(runs):
            i, done, blocked = publish_runs(runs, i, stats)
            self.handled += done
            stats.msgs_in += done
            if not blocked:
                break
            # Block policy: hold this publisher, and only it, until there is room. What
            # went out so far counts now: a publisher frame is its peer frame less the stamp.
            stamp = self._stamp_size
            left = sum(sum(map(len, run[2])) - len(run[2]) * stamp for run in runs[i:])
            stats.octets_in += octets - left - counted
            counted = octets - left
            self._flush(first)
            first = self.handled + 1
            for queue in blocked:
                await queue.wait_not_full()
        stats.octets_in += octets - counted
        self._flush(first)

    async def _publish_peer_messages(
        self, decoder: wire.MessageDecoder, stats: ClientStats
    ) -> None:
        """A peer's messages: counted as read, looped ones too; then routed (§5.3)."""
        first = self.handled + 1
        msgs = decoder.messages()
        stats.octets_in += decoder.octets
        decoder.octets = 0
        self.handled += len(msgs)
        stats.msgs_in += len(msgs)
        node_id = self.broker.node_id
        msgs = [m for m in msgs if _accept(m, node_id)]
        publish_many = self.broker.router.publish_many
        i = 0
        while i < len(msgs):
            i, blocked = publish_many(msgs, i, stats)
            if not blocked:
                break
            self._flush(first)
            first = self.handled + 1
            for queue in blocked:
                await queue.wait_not_full()
        self._flush(first)

    def _flush(self, first: int) -> None:
        """Write what this publisher appended to disk queues, before it next waits."""
        assert self.owner is not None
        flushed, lost = self.broker.catalog.flush_dirty(self.owner.stats)
        for store in flushed:
            self.written[store] = store.written_seq
        if lost and self.failed_from is None:
            self.failed_from = first
        self._progress.set()
        self._progress = asyncio.Event()

    async def confirm(self, count: int) -> str | None:
        """Wait until the first ``count`` messages are routed and durable; None, or why not."""
        while self.handled < count:
            if self.phase is Phase.CLOSED:
                return "data channel closed"
            await self._progress.wait()
        if self.failed_from is not None and self.failed_from <= count:
            return "disk queue write failed"
        for store, seq in list(self.written.items()):
            if not await store.wait_durable(seq):
                return "disk queue write failed"  # an fsync failed
            if self.written.get(store) == seq:
                del self.written[store]
        return None

    async def _pump_out(self, owner: CommandSession) -> None:
        assert owner.queue is not None
        queue = owner.queue
        stats = owner.stats
        writer = self.writer
        peer_id = self.peer_id
        while True:
            batch = taken = await queue.get_batch(BATCH)
            if writer.is_closing():
                queue.put_back(batch)
                return
            if peer_id != NO_PEER:
                batch = [f for f in batch if not has_hop(frame_hops(f), peer_id)]
            writer.write(b"".join(batch))
            stats.msgs_out += len(batch)
            stats.octets_out += sum(map(len, batch))
            try:
                await writer.drain()
            except ConnectionError:
                return
            # In the kernel's hands now: a disk queue may move its read checkpoint.
            queue.ack(taken)


def _accept(msg: Message, node_id: bytes) -> bool:
    if accept_from_peer(msg, node_id):
        return True
    log.debug("received looped message %r", msg)
    return False
