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

__all__ = [
    "CLIENT_HELLO",
    "first_bytes",
    "listener_context",
    "looks_like_tls",
    "main_port_context",
    "peer_user",
    "server_context",
]

CLIENT_HELLO = 0x16  # a TLS record of type handshake: what every TLS client sends first


def looks_like_tls(first: bytes) -> bool:
    """Whether a connection opening with ``first`` (1 to 3 bytes) is a TLS client."""
    if not first or first[0] != CLIENT_HELLO:
        return False
    return len(first) < 2 or first[1] == 0x03


def server_context(
    cert: Path | None, key: Path | None, client_ca: Path | None = None
) -> ssl.SSLContext | None:
    """The context a TLS listener serves with, None without a certificate.

    With ``client_ca``, a client may present a certificate, and one that CA did not sign
    fails the handshake; one presenting none still connects (CERT_OPTIONAL), so that the
    front end can answer it in its own protocol rather than with a broken handshake, and
    under auth = "password" refuses it (:func:`peer_user` says who a client is).

    Raises OSError (ssl.SSLError, FileNotFoundError) for files that will not load: the
    broker does not start, and fqd says why in one line.
    """
    if cert is None:
        return None
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(cert, key)
    if client_ca is not None:
        context.load_verify_locations(cafile=client_ca)
        context.verify_mode = ssl.CERT_OPTIONAL
    return context


def listener_context(
    settings: Settings, cert: Path | None, key: Path | None
) -> ssl.SSLContext | None:
    """A front end's own port's context: its certificate and key, and the broker's
    ``tls_client_ca`` for client certificates."""
    return server_context(cert, key, settings.tls_client_ca)


def main_port_context(settings: Settings) -> ssl.SSLContext | None:
    # No client certificates here: fq and HTTP log in with passwords, and a browser asked
    # for a certificate would prompt for one.
    return server_context(settings.tls_cert, settings.tls_key)


def peer_user(transport: asyncio.BaseTransport) -> str | None:
    """The user a TLS client's verified certificate names: its subject's common name
    (CN); None for a plain connection or a client that presented no certificate.

    Only a certificate the ``tls_client_ca`` signed gets this far (the handshake checked
    it), so the name is the CA's word, as a password is the user's.
    """
    ssl_object = transport.get_extra_info("ssl_object")
    if ssl_object is None:
        return None
    cert = ssl_object.getpeercert()
    if not cert:
        return None
    for rdn in cert.get("subject", ()):
        for name, value in rdn:
            if name == "commonName" and isinstance(value, str) and value:
                return value
    return None


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
