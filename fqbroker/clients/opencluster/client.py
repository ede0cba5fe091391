"""An asyncio OpenCluster client (docs/opencluster-client.md).

:class:`OpenClusterClient` is the shell around
:class:`~fqbroker.clients.opencluster.machine.OCMachine`:
one socket and one reader task. Every call writes its request at once and waits for its
own answer, so many calls may be outstanding on the connection. There is no reconnect: a
lost connection or a reply out of step fails every outstanding and later call, and the
application connects again. Keys are hashed here (FNV-1a of the name, as the 2011 C client
computed it); the server only stores, so two names with one hash are one key.
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
from collections import deque
from pathlib import Path
from typing import Self

from fqbroker.clients.opencluster.machine import Answer, OCMachine, as_name, as_value
from fqbroker.clients.tls import client_ssl
from fqbroker.errors import ClientClosed, ClientError, OpenClusterProtocolError
from fqbroker.protocols.opencluster import wire

__all__ = ["DEFAULT_PORT", "OpenClusterClient"]

DEFAULT_PORT = 13600
READ_SIZE = 256 * 1024
HIGH_WATER = 1 << 20  # bytes queued in the transport before a call waits for the socket


class OpenClusterClient:
    """A connected client; make one with :meth:`connect` (``async with`` closes it)."""

    def __init__(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, machine: OCMachine
    ) -> None:
        self._reader = reader
        self._writer = writer
        self.machine = machine
        self._waiting: deque[asyncio.Future[Answer]] = deque()
        self._error: BaseException | None = None
        self._task: asyncio.Task[None] | None = None

    @classmethod
    async def connect(
        cls,
        host: str = "127.0.0.1",
        port: int = DEFAULT_PORT,
        *,
        tls: bool | ssl.SSLContext = False,
        cafile: str | Path | None = None,
        certfile: str | Path | None = None,
        keyfile: str | Path | None = None,
        connect_timeout: float = 10.0,
    ) -> OpenClusterClient:
        """Connect, send hello and wait for its ack, serverlist and hashmasks (acked as the
        2011 client did). ``OSError``/``TimeoutError`` when the server cannot be reached."""
        # A client certificate is the login under auth = "password" (its CN the user).
        context = client_ssl(tls, cafile, certfile, keyfile)
        async with asyncio.timeout(connect_timeout):
            reader, writer = await asyncio.open_connection(
                host, port, ssl=context, server_hostname=host if context else None
            )
            try:
                machine = OCMachine()
                writer.write(machine.hello())
                while not machine.ready:
                    data = await reader.read(READ_SIZE)
                    if not data:
                        raise ClientClosed("the server closed the connection during hello")
                    for answer in machine.receive_data(data):
                        if answer.reply != wire.ACK:
                            raise ClientError(f"hello refused: {_describe(answer)}")
                    writer.write(machine.data_to_send())
            except BaseException:
                writer.close()
                raise
        client = cls(reader, writer, machine)
        client._task = asyncio.create_task(client._read())
        return client

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # --- calls ----------------------------------------------------------------------------

    async def set(self, name: str | bytes, value: int | bytes | str, *, expires: int = 0) -> None:
        """Store ``value`` (an i32, or bytes; a str is stored as UTF-8) under ``name``,
        expiring ``expires`` seconds from now (0: never). Returns once the server has
        acknowledged it, which fqd does once it is durable."""
        answer = await self._call(self.machine.set(as_name(name), as_value(value), expires=expires))
        if answer.reply != wire.ACK:
            raise ClientError(f"set refused: {_describe(answer)}")

    async def get(
        self, name: str | bytes, *, kind: type[int] | type[bytes] = bytes
    ) -> int | bytes | None:
        """The value of ``name`` (get_int with ``kind=int``, get_string otherwise), or None
        when there is none (or it expired). A value of the other type is a ClientError."""
        answer = await self._call(self.machine.get(as_name(name), as_int=kind is int))
        if answer.reply in (wire.DATA_INT, wire.DATA_STR):
            return answer.value
        if answer.reply == wire.FAIL:
            return None
        raise ClientError(f"get refused: {_describe(answer)}")

    async def ping(self) -> None:
        answer = await self._call(self.machine.ping())
        if answer.reply != wire.ACK:
            raise ClientError(f"ping refused: {_describe(answer)}")

    async def close(self) -> None:
        """Say goodbye (waiting a second at most for its ack), then close the socket."""
        if self._error is None:
            with contextlib.suppress(Exception, TimeoutError):
                async with asyncio.timeout(1.0):
                    await self._call(self.machine.goodbye())
        self._shut(ClientClosed("client is closed"))
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._task
        with contextlib.suppress(OSError, ssl.SSLError):
            await self._writer.wait_closed()

    @property
    def closed(self) -> bool:
        return self._error is not None

    async def _call(self, frame: bytes) -> Answer:
        if self._error is not None:
            raise self._error
        future: asyncio.Future[Answer] = asyncio.get_running_loop().create_future()
        self._waiting.append(future)
        writer = self._writer
        writer.write(frame)
        if writer.transport.get_write_buffer_size() > HIGH_WATER:
            try:
                await writer.drain()
            except OSError as exc:
                self._shut(ClientClosed(f"connection lost: {exc}"))
        return await future

    # --- the reader -----------------------------------------------------------------------

    async def _read(self) -> None:
        reader, writer, machine = self._reader, self._writer, self.machine
        try:
            while True:
                data = await reader.read(READ_SIZE)
                if not data:
                    self._shut(ClientClosed("the server closed the connection"))
                    return
                answers = machine.receive_data(data)
                owed = machine.data_to_send()
                if owed:
                    writer.write(owed)
                waiting = self._waiting
                for answer in answers:
                    future = waiting.popleft()
                    if not future.done():  # a caller that was cancelled took its future with it
                        future.set_result(answer)
        except OpenClusterProtocolError as exc:
            self._shut(exc)
        except (OSError, ssl.SSLError) as exc:
            self._shut(ClientClosed(f"connection lost: {exc}"))

    def _shut(self, error: BaseException) -> None:
        """Fail every outstanding and later call with ``error``; close the socket."""
        if self._error is None:
            self._error = error
        while self._waiting:
            future = self._waiting.popleft()
            if not future.done():
                future.set_exception(self._error)
        self._writer.close()


def _describe(answer: Answer) -> str:
    if answer.reply == wire.FAILINFO:
        return f"failinfo {answer.code}: {answer.text.decode(errors='replace')}"
    if answer.reply == wire.TRYELSEWHERE:
        return f"try elsewhere: {answer.text.decode(errors='replace')}"
    return wire.PROTOCOL_NAMES.get(answer.reply, str(answer.reply))
