"""What every front end's connections share: the remote address, asked of the transport."""

from __future__ import annotations

import asyncio

__all__ = ["WRITE", "HeldReading", "RemotePeer", "peer_address"]


def peer_address(transport: asyncio.BaseTransport) -> tuple[str, int]:
    peer = transport.get_extra_info("peername")
    return (peer[0], peer[1]) if peer else ("0.0.0.0", 0)


class RemotePeer:
    """``remote_addr`` and ``remote_port``, asked of the transport when needed: ten
    thousand sessions holding them would be half a megabyte."""

    __slots__ = ()
    transport: asyncio.Transport

    @property
    def remote_addr(self) -> str:
        return peer_address(self.transport)[0]

    @property
    def remote_port(self) -> int:
        return peer_address(self.transport)[1]


WRITE = 1 << 8  # the hold every session has: the client does not read what we write


class HeldReading:
    """Reading paused for reasons, each a bit of ``_holds`` (a session's own below
    :data:`WRITE`): paused at the first, resumed when the last is released, never
    resumed once the session is closing or the peer sent EOF."""

    __slots__ = ()
    transport: asyncio.Transport
    closing: bool
    _eof: bool
    _holds: int

    def _hold(self, why: int) -> None:
        if not self._holds and not self.closing:
            self.transport.pause_reading()
        self._holds |= why  # type: ignore[misc]  # a slot of the session's class

    def _release(self, why: int) -> None:
        if not self._holds & why:
            return
        self._holds &= ~why  # type: ignore[misc]
        if not self._holds and not self.closing and not self._eof:
            self.transport.resume_reading()

    def pause_writing(self) -> None:
        # The peer does not read what we send: stop reading until it does, so neither
        # our write buffer nor anything else grows without bound.
        self._hold(WRITE)

    def resume_writing(self) -> None:
        self._release(WRITE)
