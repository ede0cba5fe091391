"""What a binding delivers into, as the router sees it (:mod:`fqbroker.core.router`).

Targets are anything with the small :class:`Target` protocol, so the router knows nothing
of storage, sockets or any wire protocol; :class:`Sink` is one that takes everything.
"""

from __future__ import annotations

from collections.abc import Awaitable
from typing import Protocol

__all__ = ["Sink", "Target"]


class Target(Protocol):
    """What a binding delivers into: a queue, as far as the router cares."""

    def offer(self, frames: list[bytes], size: int = -1) -> int:
        """Take these peer frames in order, up to the tail-drop limit; how many it took.

        ``size``: the frames' bytes, when the caller has counted them (-1: not).
        """
        ...

    blocks: bool
    """Block policy: full, it takes messages still and makes the publisher wait."""

    name: bytes
    """What it is called, in a refused publisher's confirm failure."""

    rejects: bool
    """Reject policy: full, it refuses messages and their publisher learns of it."""

    @property
    def room(self) -> int:
        """Messages it takes before it is full (0 or less: none)."""
        ...

    @property
    def room_bytes(self) -> int:
        """Bytes it takes before it is full: each message while this is over 0."""
        ...

    def takes(self, frames: list[bytes]) -> int:
        """Block policy: how many of ``frames`` it takes before it is full (at least 1)."""
        ...

    @property
    def is_full(self) -> bool:
        """Whether a publisher should wait before sending more (block policy)."""
        ...

    def wait_not_full(self) -> Awaitable[None]:
        """Resolves once the target has room again."""
        ...


class Sink:
    """A target that is never full and never makes a publisher wait: what a front end
    binds straight on the router to see every message of an exchange (retained topics,
    the fyrehose sequence). A subclass gives ``name`` (shown for its binding) and
    :meth:`offer`."""

    blocks = False
    rejects = False
    name = b"(sink)"

    @property
    def room(self) -> int:
        return 1 << 62

    @property
    def room_bytes(self) -> int:
        return 1 << 62

    @property
    def is_full(self) -> bool:
        return False

    def takes(self, frames: list[bytes]) -> int:
        return len(frames)

    async def wait_not_full(self) -> None:
        return None

    def offer(self, frames: list[bytes], size: int = -1) -> int:
        raise NotImplementedError
