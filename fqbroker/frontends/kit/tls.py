"""TLS on the shared main port, and the contexts servers and clients use.

A TLS client opens with a ClientHello record: byte 0x16 (handshake), then the record
version 0x03 0x0X. No preamble of the main port's table starts with 0x16 (fq's are
0xcc50...., HTTP's are method names), so the first byte tells the two apart
(:func:`looks_like_tls`), looked at without being read (:func:`first_bytes`).
"""

from __future__ import annotations

import asyncio
import socket
import ssl
from pathlib import Path

from fqbroker.settings.broker import Settings

__all__ = ["CLIENT_HELLO", "first_bytes", "looks_like_tls", "main_port_context", "server_context"]

CLIENT_HELLO = 0x16  # a TLS record of type handshake: what every TLS client sends first


def looks_like_tls(first: bytes) -> bool:
    """Whether a connection opening with ``first`` (1 to 3 bytes) is a TLS client."""
    if not first or first[0] != CLIENT_HELLO:
        return False
    return len(first) < 2 or first[1] == 0x03


def server_context(cert: Path | None, key: Path | None) -> ssl.SSLContext | None:
    """The context a TLS listener serves with, None without a certificate.

    Raises OSError (ssl.SSLError, FileNotFoundError) for files that will not load: the
    broker does not start, and fqd says why in one line.
    """
    if cert is None:
        return None
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(cert, key)
    return context


def main_port_context(settings: Settings) -> ssl.SSLContext | None:
    return server_context(settings.tls_cert, settings.tls_key)


async def first_bytes(sock: socket.socket, n: int = 3) -> bytes:
    """Up to ``n`` bytes a connection opens with, looked at and left unread (MSG_PEEK);
    b"" when it closed (or failed) before sending any.

    The bytes must be looked at without being read: the SSL protocol expects the whole
    ClientHello from the socket, and neither asyncio nor uvloop offers a way to give back
    bytes a transport already read (and uvloop starts reading right after
    ``connection_made``, whatever the protocol asked). So while TLS is configured the main
    port's listener keeps a duplicate of each new connection's descriptor and drops the
    transport it made before that reads anything; this looks at the opening bytes, and
    ``loop.connect_accepted_socket`` makes the transport the connection is served on, with
    the TLS context or without. That costs a task and a few system calls per connection,
    only when ``tls_cert`` is set; the data path is untouched.
    """
    loop = asyncio.get_running_loop()
    fd = sock.fileno()
    while True:
        ready: asyncio.Future[None] = loop.create_future()
        loop.add_reader(fd, _wake, ready)
        try:
            await ready
        finally:
            loop.remove_reader(fd)
        try:
            return sock.recv(n, socket.MSG_PEEK)
        except (BlockingIOError, InterruptedError):
            continue  # woken for nothing
        except OSError:
            return b""


def _wake(ready: asyncio.Future[None]) -> None:
    if not ready.done():
        ready.set_result(None)
