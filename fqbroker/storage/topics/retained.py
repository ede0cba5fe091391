"""Retained topics: never-consumed disk stores with offsets (Figg, seed 004; docs/topics.md).

A topic (:class:`~fqbroker.storage.topics.topic.Topic`, re-exported here) is a
:class:`~fqbroker.storage.store.DiskStore` of its own under ``<queue_dir>/topics/``, whose
appends go through the catalog's dirty set and memory budget, so publishers' flushes and
confirms cover them as they cover disk queues. :class:`Topics` keeps them; the
:class:`TopicSink`, bound with ``prefix:""`` on the topics' exchange (``TopicConfig.exchange``)
straight on the router (never persisted), appends each message to the topic named by its route.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Iterator
from itertools import repeat
from typing import TYPE_CHECKING

from fqbroker.core.dedup import current, now_us
from fqbroker.core.router import Sink
from fqbroker.errors import LogFormatError
from fqbroker.storage.topics.topic import Topic, TopicConfig, TopicReader

if TYPE_CHECKING:
    from fqbroker.core.budget import MemoryBudget
    from fqbroker.core.router import Router
    from fqbroker.storage.diskalarm import DiskAlarm
    from fqbroker.storage.store import DiskStore

__all__ = ["TOPIC_PROGRAM", "Topic", "TopicConfig", "TopicReader", "TopicSink", "Topics"]

log = logging.getLogger(__name__)

TOPIC_PROGRAM = b'prefix:""'  # the sink's binding: every route of the exchange
MAX_NAME = 127  # a topic is an fq route: 1 to 127 bytes
RETENTION_PERIOD = 1.0  # seconds between retention passes
RETRY_OPEN = 10.0  # seconds before a topic that could not be opened is tried again


def _route(frame: bytes) -> bytes:
    at = 1 + frame[0]
    return frame[at + 1 : at + 1 + frame[at]]


class TopicSink(Sink):
    """The router target that appends each message on the Figg exchange to the topic its
    route names. Never full, never blocks; messages are dropped only for a topic it cannot
    have (past ``max_topics``, an empty name, a directory it cannot open)."""

    name = b"(figg topics)"  # not a queue: what stats and the web UI show for its binding

    def __init__(self, topics: Topics) -> None:
        self.topics = topics

    def offer(self, frames: list[bytes], size: int = -1) -> int:
        if not frames:
            return 0
        first = frames[0]
        route = _route(first)
        head = first[: 2 + first[0] + len(route)]  # exchange and route, length bytes too
        n = len(frames)
        if n == 1 or sum(map(bytes.startswith, frames, repeat(head))) == n:
            return self._append(route, frames)
        taken, i = 0, 0
        while i < n:  # runs of one route, in order
            route = _route(frames[i])
            j = i + 1
            while j < n and _route(frames[j]) == route:
                j += 1
            taken += self._append(route, frames[i:j])
            i = j
        return taken

    def _append(self, route: bytes, frames: list[bytes]) -> int:
        topics = self.topics
        topic = topics.get(route) or topics.open(route)
        if topic is None:
            topics.dropped += len(frames)
            return 0
        n = len(frames)
        limits = current()
        if limits is not None:
            # An opted-in publisher (core/dedup.py): a topic drops repeats as a disk
            # queue does, its window read back from its log when first needed.
            store = topic.store
            window = store.window if store.window is not None else store.open_window(limits)
            frames = window.fresh(frames, now_us())
            if not frames:
                return n
        topic.append(frames)
        if topic.store.log.size_bytes > topic.retention_bytes:
            topics.retention_soon(topic)
        return n


class Topics:
    """Every retained topic of a broker (``broker.topics``), and their retention."""

    def __init__(
        self,
        config: TopicConfig,
        router: Router,
        dirty: set[DiskStore] | None = None,
        budget: MemoryBudget | None = None,
        alarm: DiskAlarm | None = None,
    ) -> None:
        self.config = config
        self.router = router
        self.directory = config.directory
        self.exchange = config.exchange
        self.max_topics = config.max_topics
        self._dirty = dirty
        self._budget = budget
        # Appends refused while free space is below disk_free_limit (docs/reliability.md).
        self._alarm = alarm
        if alarm is not None:
            alarm.watch(self.directory)
        self._topics: dict[bytes, Topic] = {}
        # Could not be opened (a full disk, permissions): name -> when to try again, so a
        # failing directory is not tried on every message, nor given up on for good.
        self._unusable: dict[bytes, float] = {}
        self.dropped = 0  # messages for topics past max_topics or that cannot be opened
        self._warned_full = False
        self.sink = TopicSink(self)
        self._task: asyncio.Task[None] | None = None
        self._soon: set[Topic] = set()
        self.closed = False
        self._recover()

    def _recover(self) -> None:
        if not self.directory.is_dir():
            return
        for entry in sorted(self.directory.iterdir()):
            try:
                name = bytes.fromhex(entry.name)
            except ValueError:
                name = b""
            if not entry.is_dir() or not 0 < len(name) <= MAX_NAME or name.hex() != entry.name:
                log.warning("topics: ignoring %s, not a topic's directory", entry)
                continue
            self._make(name)

    def _make(self, name: bytes) -> Topic | None:
        try:
            topic = Topic(
                name, self.directory / name.hex(), self.config, self._dirty, self._budget,
                self._alarm,
            )  # fmt: skip
        except (OSError, LogFormatError) as exc:
            if name not in self._unusable:
                log.error("topic %r cannot be opened, its messages are dropped: %s", name, exc)
            self._unusable[name] = time.monotonic() + RETRY_OPEN
            return None
        self._unusable.pop(name, None)
        self._topics[name] = topic
        return topic

    # --- the set --------------------------------------------------------------------------

    def get(self, name: bytes) -> Topic | None:
        return self._topics.get(name)

    def open(self, name: bytes) -> Topic | None:
        """The topic, created if new; None past ``max_topics``, for a name that is empty
        or over 127 bytes, or one whose directory cannot be opened."""
        topic = self._topics.get(name)
        if topic is not None or self.closed:
            return topic
        if not 0 < len(name) <= MAX_NAME:
            return None
        retry = self._unusable.get(name)
        if retry is not None and time.monotonic() < retry:
            return None
        if len(self._topics) >= self.max_topics:
            if not self._warned_full:
                self._warned_full = True
                log.warning(
                    "topics: %d topics, the most figg max_topics allows; messages to new "
                    "topics are dropped (first: %r)", len(self._topics), name,
                )  # fmt: skip
            return None
        return self._make(name)

    def __iter__(self) -> Iterator[Topic]:
        return iter(list(self._topics.values()))

    def __len__(self) -> int:
        return len(self._topics)

    # --- lifetime -------------------------------------------------------------------------

    def start(self) -> None:
        """Bind the sink on the Figg exchange and start the retention timer."""
        self.router.bind(self.exchange, TOPIC_PROGRAM, self.sink)
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._retention_loop())

    async def close(self) -> None:
        """Unbind the sink, wake every waiter, write, sync and close every topic."""
        if self.closed:
            return
        self.closed = True
        self.router.unbind_queue(self.sink)
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        for topic in self._topics.values():
            topic.close()

    # --- retention ------------------------------------------------------------------------

    def enforce_retention(self, now: float | None = None) -> int:
        """Delete every topic's expired and oversize whole segments; how many went."""
        when = time.time() if now is None else now
        return sum(topic.enforce_retention(when) for topic in self._topics.values())

    def retention_soon(self, topic: Topic) -> None:
        """A topic grew past its size: check it once the publisher's write is done."""
        if not self._soon and not self.closed:
            with contextlib.suppress(RuntimeError):  # no loop: the timer's pass does it
                asyncio.get_running_loop().call_soon(self._enforce_soon)
        self._soon.add(topic)

    def _enforce_soon(self) -> None:
        soon, self._soon = self._soon, set()
        now = time.time()
        for topic in soon:
            try:
                topic.enforce_retention(now)
            except OSError as exc:  # the timer's pass tries again
                log.error("topic %r: retention failed: %s", topic.name, exc)

    async def _retention_loop(self) -> None:
        while True:
            await asyncio.sleep(RETENTION_PERIOD)
            try:
                self.enforce_retention()
            except OSError as exc:
                log.error("topics: retention failed: %s", exc)
            self.trim_caches()

    def trim_caches(self) -> None:
        """Give back the memory of idle topics' caches (their readers have what they hold),
        and of every topic's while the broker's budget is over half spent: nothing drains a
        topic's cache, and it only saves reading the file back (docs/memory.md)."""
        budget = self._budget
        tight = budget is not None and not budget.fits(budget.limit // 2)
        for topic in self._topics.values():
            if (tight or not topic.appended) and topic.store.held_bytes:
                topic.store.drop_recent()
            if not topic.appended and not topic.subscribers:
                # Idle and unread: its descriptors go back too, so thousands of quiet
                # topics hold one each (checkpoints), not up to six.
                topic.store.log.release_descriptors()
            topic.appended = False
