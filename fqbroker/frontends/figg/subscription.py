"""One ATTACH of one Figg connection: a cursor into a retained topic, fed to the socket.

A :class:`Subscription` is a task that reads the topic after its cursor, writes what it
read as DATA frames, and moves the cursor on; caught up, it awaits ``wait_beyond(cursor)``.
Replay and live delivery are the same loop, so there is neither gap nor duplicate where
one turns into the other, and only durable messages are ever sent (the topic's reads
stop at its durable end).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol

from fqbroker.protocols.figg.wire import data_frames

if TYPE_CHECKING:
    from fqbroker.storage.topics.retained import Topic

__all__ = ["BATCH_BYTES", "BATCH_RECORDS", "Subscription", "Writer"]

BATCH_RECORDS = 4096
BATCH_BYTES = 1 << 20


class Writer(Protocol):
    """The connection a subscription writes to."""

    writable: asyncio.Event  # set while the write buffer is under its high-water mark
    delivered: int

    def write(self, data: bytes) -> None: ...


class Subscription:
    """A cursor into ``topic`` from ``offset``, delivering until cancelled.

    Why it costs little: each read is one bounded batch (``BATCH_RECORDS``/``BATCH_BYTES``)
    from the topic's store, written as one ``transport.write`` of one joined buffer, so a
    thousand subscribers replaying one topic hold a batch each, never the backlog. Each
    record's DATA frame is a prefix (header, topic, offset) and the tail of the stored fq
    frame from its payload length on, which is byte for byte the tail of a DATA frame: no
    payload is copied out of its frame on its own (wire.data_frames, compiled). While the
    connection's write buffer is over its high-water mark (``pause_writing``) every
    subscription waits before its next read.
    """

    __slots__ = ("_task", "offset", "remote", "topic")

    def __init__(
        self,
        topic: Topic,
        offset: int,
        remote: str,
        writer: Writer,
        on_error: Callable[[BaseException], None],
    ) -> None:
        self.topic = topic
        self.offset = offset  # the last offset sent (and where reading goes on after)
        self.remote = remote
        topic.subscribers.add(self)
        self._task = asyncio.ensure_future(self._run(writer))
        self._task.add_done_callback(lambda task: _report(task, on_error))

    def stop(self) -> None:
        self._task.cancel()
        self.topic.subscribers.discard(self)

    async def _run(self, writer: Writer) -> None:
        topic = self.topic
        name = topic.name
        read = topic.read_frames
        writable = writer.writable
        while not topic.closed:
            if not writable.is_set():
                await writable.wait()
                continue
            start, frames = read(self.offset, BATCH_RECORDS, BATCH_BYTES)
            if not frames:
                await topic.wait_beyond(self.offset)
                continue
            self.offset = start + len(frames) - 1
            writer.delivered += len(frames)
            writer.write(data_frames(name, start, frames))
            # Others (this connection's input, other subscribers) get their turn.
            await asyncio.sleep(0)


def _report(task: asyncio.Task[None], on_error: Callable[[BaseException], None]) -> None:
    if not task.cancelled() and (exc := task.exception()) is not None:
        on_error(exc)
