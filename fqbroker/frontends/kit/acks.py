"""The sans-IO half of a publishing front end: the ACKs it owes, and the events its
machine hands its shell.

A protocol that acknowledges what it took in (Lumberjack's ACK, Figg's ACK) promises with
each ACK that the messages before it are routed, and on disk where a disk queue or a
topic took them (docs/lumberjack.md, docs/figg.md). The front end's machine decides what
it owes and after how many of its messages (:class:`AckingMachine`); the shared asyncio tail
(:mod:`fqbroker.frontends.kit.publishing`) learns how many are handled and durable and tells
the machine, which writes the ACKs. A machine hands its shell a :class:`Batch` to publish
and, when the input breaks the protocol, a :class:`BadInput`.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import TYPE_CHECKING, Generic, TypeVar

if TYPE_CHECKING:
    from fqbroker.core.message import Run

__all__ = ["AckingMachine", "BadInput", "Batch"]

T = TypeVar("T")


@dataclass(slots=True)
class Batch:
    """Messages to publish: runs of fq frames (one per route in a row) and their bytes."""

    runs: list[Run]
    octets: int


@dataclass(slots=True)
class BadInput:
    """The input broke the protocol or a limit: the connection is to be closed."""

    reason: str


class AckingMachine(Generic[T]):
    """The ACKs a machine owes, oldest first, and the bytes it has to send.

    A subclass says what it owes with :meth:`owe` (a token, after how many of its
    messages) and how due tokens are written (:meth:`_encode_acks`); its other replies go
    to ``_out`` too, so everything leaves in order through :meth:`data_to_send`.
    """

    __slots__ = ("_marks", "_out")

    def __init__(self) -> None:
        self._marks: deque[tuple[T, int]] = deque()  # (token, messages handled when due)
        self._out: list[bytes] = []

    def owe(self, token: T, through: int) -> None:
        """``token`` is due once the connection's first ``through`` messages are handled."""
        self._marks.append((token, through))

    @property
    def ack_due(self) -> int | None:
        """How many messages the oldest ACK owed waits for; None when none is owed."""
        marks = self._marks
        return marks[0][1] if marks else None

    def acknowledge(self, handled: int) -> None:
        """The first ``handled`` messages are routed and durable: write the ACKs due."""
        marks = self._marks
        due = []
        while marks and marks[0][1] <= handled:
            due.append(marks.popleft()[0])
        if due:
            self._out.append(self._encode_acks(due))

    def _encode_acks(self, due: list[T]) -> bytes:
        """The bytes that acknowledge ``due``, oldest first."""
        raise NotImplementedError

    def data_to_send(self) -> bytes:
        """What to write now, in order; b"" for nothing."""
        out = self._out
        if not out:
            return b""
        data = out[0] if len(out) == 1 else b"".join(out)
        out.clear()
        return data
