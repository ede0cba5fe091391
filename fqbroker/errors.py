"""Exceptions raised by fqbroker.

::

    FqError
    ├── ProtocolError        malformed bytes, or a frame illegal in this phase
    │   ├── FrameTooLarge    a length field over its limit (.size, .limit)
    │   └── AuthError        the auth request is refused; .text is fq's exact error text
    ├── ProgramError         a route program does not compile (answered as BIND_ILLEGAL)
    ├── QueueError           a queue cannot be created or attached; .text is fq's error text
    └── PeerError            a peer link failure (retried with backoff)

Sans-IO code raises these; each session's ``run()`` is the one place that maps them to an
error frame and a close. Traffic outcomes (no exchange, no route, dropped) are counters,
never exceptions.
"""

from __future__ import annotations

__all__ = [
    "AuthError",
    "FqError",
    "FrameTooLarge",
    "PeerError",
    "ProgramError",
    "ProtocolError",
    "QueueError",
]


class FqError(Exception):
    """Root of every fqbroker exception."""


class ProtocolError(FqError):
    """The peer sent bytes that break the protocol; the connection is closed."""


class FrameTooLarge(ProtocolError):
    """A length field is over its limit."""

    def __init__(self, field: str, size: int, limit: int) -> None:
        super().__init__(f"{field} of {size} bytes is over the limit of {limit}")
        self.field = field
        self.size = size
        self.limit = limit


class AuthError(ProtocolError):
    """The auth request is refused; ``text`` is what goes on the wire in the error frame."""

    def __init__(self, text: str) -> None:
        super().__init__(text)
        self.text = text


class ProgramError(FqError):
    """A route program does not compile."""

    def __init__(self, reason: str, position: int = -1) -> None:
        where = f" at offset {position}" if position >= 0 else ""
        super().__init__(f"{reason}{where}")
        self.reason = reason
        self.position = position


class QueueError(FqError):
    """A queue cannot be created or attached to; ``text`` is fq's exact error text."""

    def __init__(self, text: str) -> None:
        super().__init__(text)
        self.text = text


class PeerError(FqError):
    """A peer link failed."""
