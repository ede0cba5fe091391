"""De-duplication by writer-chosen message id, sans I/O (docs/confirms.md, "Exactly once").

A publisher that opts in (fq's ``DEDUP`` request, ``/submit``'s ``X-Fq-Msg-Id``) asks
every queue its messages reach to drop one whose id, from the same sender, that queue
accepted within its window: ``dedup_window`` seconds and at most ``dedup_window_ids`` ids.
Ids of publishers that did not opt in are never looked at nor remembered: fq's C clients
count ids from 1 in every process, so equal ids from them mean nothing.

Opting in is a scope, not an argument: :data:`SCOPE` holds the broker's limits while an
opted-in publisher's batch is routed (a synchronous call, so no other batch of that thread
runs meanwhile), keyed by the thread (brokers embedded on two threads each publish on
their own), and is empty otherwise; a queue tests it once per batch it is offered. Routing
code and the publishers that never opt in pay that one test.
"""

from __future__ import annotations

import collections
import time
from _thread import get_ident
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Final

__all__ = ["SCOPE", "DedupLimits", "Window", "current", "dedup_key", "enter", "leave", "now_us"]

ID_SIZE: Final = 16


@dataclass(frozen=True, slots=True)
class DedupLimits:
    """How long, and how many ids, a queue remembers (settings ``dedup_window`` and
    ``dedup_window_ids``)."""

    seconds: float = 120.0
    ids: int = 1_000_000

    @property
    def span_us(self) -> int:
        return int(self.seconds * 1_000_000)


# The limits while an opted-in batch is routed, by thread (module docstring).
SCOPE: dict[int, DedupLimits] = {}


def enter(limits: DedupLimits) -> None:
    """This thread's batches are an opted-in publisher's until :func:`leave`."""
    SCOPE[get_ident()] = limits


def leave() -> None:
    SCOPE.pop(get_ident(), None)


def current() -> DedupLimits | None:
    """The limits if this thread routes an opted-in batch now, else None."""
    return SCOPE.get(get_ident()) if SCOPE else None


def now_us() -> int:
    """Wall-clock microseconds: what disk records stamp arrival with, so a window rebuilt
    from a log after a restart lines up with one kept in memory."""
    return time.time_ns() // 1000


def dedup_key(frame: bytes) -> bytes:
    """What a duplicate shares with the original in a peer frame: the 16-byte id and the
    sender (its length byte and name), so one user cannot suppress another's messages."""
    at = 2 + frame[0] + frame[1 + frame[0]]
    return frame[at : at + ID_SIZE + 1 + frame[at + ID_SIZE]]


class Window:
    """The keys (:func:`dedup_key`) one queue accepted recently, oldest first.

    A key is kept from its first acceptance for ``seconds``, and only the newest ``ids``
    are kept: a repeat does not extend its time, as in NATS JetStream.
    """

    __slots__ = ("_order", "duplicates", "ids", "limits", "on_repeat")

    def __init__(self, limits: DedupLimits) -> None:
        self.limits = limits
        self.ids: dict[bytes, int] = {}  # key -> accepted at, microseconds
        self._order: collections.deque[bytes] = collections.deque()  # keys, oldest first
        self.duplicates = 0  # messages dropped as repeats
        # Called when a batch had repeats: a disk store makes their publisher wait for
        # its fsync, which covers the originals too.
        self.on_repeat: Callable[[], None] | None = None

    def __len__(self) -> int:
        return len(self.ids)

    def __contains__(self, key: bytes) -> bool:
        return key in self.ids

    def expire(self, now: int) -> None:
        """Forget what is older than the window, and the oldest past its count."""
        ids, order = self.ids, self._order
        cutoff = now - self.limits.span_us
        most = self.limits.ids
        while order:
            at = ids.get(order[0])
            if at is not None and at > cutoff and len(ids) <= most:
                return
            key = order.popleft()
            if at is not None:  # else taken back by forget()
                del ids[key]

    def add(self, key: bytes, at: int) -> None:
        if key not in self.ids:
            self.ids[key] = at
            self._order.append(key)

    def fresh(self, frames: list[bytes], now: int) -> list[bytes]:
        """The frames not seen before, in order, each now remembered as of ``now``; the
        others are counted in :attr:`duplicates`. A repeat within ``frames`` is one too."""
        self.expire(now)
        ids, order = self.ids, self._order
        kept: list[bytes] = []
        for frame in frames:
            at = 2 + frame[0] + frame[1 + frame[0]]  # dedup_key(), inline: once a message
            key = frame[at : at + ID_SIZE + 1 + frame[at + ID_SIZE]]
            if key in ids:
                continue
            ids[key] = now
            order.append(key)
            kept.append(frame)
        if len(kept) < len(frames):
            self.duplicates += len(frames) - len(kept)
            if self.on_repeat is not None:
                self.on_repeat()
        return kept

    def forget(self, frames: Iterable[bytes]) -> None:
        """Take back the keys of frames just remembered that were not stored after all (a
        full queue refused them, a disk write failed): a publisher sending them again must
        not see them dropped as duplicates. They are the newest, at the end."""
        keys = {dedup_key(frame) for frame in frames}
        order = self._order
        for key in keys:
            self.ids.pop(key, None)
        while order and order[-1] in keys:
            order.pop()
