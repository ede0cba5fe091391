"""What every front end's connections share: the remote address, asked of the transport."""

from __future__ import annotations

import asyncio

__all__ = ["RemotePeer", "peer_address"]


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
