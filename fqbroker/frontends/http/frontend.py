"""HTTP as a front end of the main port: its preambles, how a connection is taken over.

A connection whose first 4 bytes are an HTTP method (docs/fq-protocol.md §4.1) is put on
asyncio streams with a task of its own: HTTP is rare and short, so it keeps the simple
shape. h11 and the endpoints are imported by the first HTTP request, not by every broker.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Final, cast

from fqbroker.frontends.http.headers import SECURITY_HEADERS
from fqbroker.frontends.kit.component import Auth, FrontEnd, LiveFrontEnd, Sniffed

# The host's Protocol and what it imports (auth) come with the first request too.
if TYPE_CHECKING:
    from fqbroker.frontends.http.host import HttpHost

__all__ = ["HTTP", "HTTP_METHODS", "SERVICE_UNAVAILABLE"]

HTTP_METHODS: Final = frozenset({b"GET ", b"PUT ", b"POST", b"HEAD"})

# The answer to an HTTP request over a connection limit (docs/limits.md).
SERVICE_UNAVAILABLE = (
    b"HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\n"
    b"content-length: 34\r\nconnection: close\r\n"
    + b"".join(name + b": " + value + b"\r\n" for name, value in SECURITY_HEADERS)
    + b'\r\n{"error": "too many connections"}\n'
)


def _open(
    host: HttpHost, live: LiveFrontEnd, transport: asyncio.Transport, first4: bytes
) -> asyncio.BaseProtocol:
    """Put the connection on streams, with what was read already, for the HTTP task."""
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader(loop=loop)
    protocol = _HttpProtocol(host, reader, loop=loop)
    protocol.connection_made(transport)
    writer = asyncio.StreamWriter(transport, protocol, reader, loop)
    live.track(loop.create_task(_serve(host, first4, reader, writer)))
    return protocol


async def _serve(
    host: HttpHost, first4: bytes, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
) -> None:
    try:
        from fqbroker.frontends.http import endpoints

        await endpoints.serve(host, first4, reader, writer)
    except (ConnectionError, asyncio.IncompleteReadError, TimeoutError):
        writer.close()
    except asyncio.CancelledError:
        # The broker is stopping. Ending quietly matters: whoever looks at this task's
        # result would log a cancelled one as an error.
        writer.close()
    except Exception as exc:
        host.limits.bug(exc, "HTTP connection")
        writer.close()


def _refusal(host: HttpHost) -> bytes:
    from fqbroker.frontends.http.stats.snapshot import http_counters

    http_counters(host).responses[503] += 1
    return SERVICE_UNAVAILABLE


class _HttpProtocol(asyncio.StreamReaderProtocol):
    def __init__(
        self, host: HttpHost, reader: asyncio.StreamReader, loop: asyncio.AbstractEventLoop
    ) -> None:
        super().__init__(reader, loop=loop)
        self.host = host
        self._conn: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        self._conn = cast(asyncio.Transport, transport)

    def connection_lost(self, exc: Exception | None) -> None:
        super().connection_lost(exc)
        if self._conn is not None:
            self.host.closed(self._conn)
            self._conn = None


HTTP: FrontEnd[HttpHost] = FrontEnd(
    name="http",
    reach=Sniffed(HTTP_METHODS, _open),
    refusal=_refusal,
    summary="HTTP/1.1: stats, metrics, submit, checkpoints, replay, the web UI",
    auth=Auth(
        "admin_token or read_token as a bearer token, or a user's HTTP Basic credentials",
        credentials=True,
    ),
    fuzz=("http",),
)
