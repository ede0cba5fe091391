"""Standard input for the tools that read it (fq-send, figg pub, fyrehose push): a file,
a pipe, a terminal, /dev/null or /dev/zero, read without blocking the event loop.

Pipes, sockets and terminals go through the event loop. epoll refuses regular files and
most character devices (/dev/null, /dev/zero): a file is read directly (it never blocks),
a device from a daemon thread (it may block, and a daemon thread never holds up the exit).
An endless source with no newline is bounded by ``max_line``.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import stat
import sys
import threading
from collections.abc import AsyncIterator

__all__ = ["READ_SIZE", "lines", "stdin_chunks"]

READ_SIZE = 64 * 1024


async def stdin_chunks(fd: int | None = None, size: int = READ_SIZE) -> AsyncIterator[bytes]:
    """The bytes of standard input (``fd``, default stdin's) as they come, until EOF.
    A closed descriptor is no input."""
    fd = sys.stdin.fileno() if fd is None and sys.stdin is not None else fd
    if fd is None:
        return
    try:
        mode = os.fstat(fd).st_mode
    except OSError:
        return  # stdin closed (`<&-`): nothing to read
    if stat.S_ISREG(mode):
        chunks = _direct(fd, size)
    elif stat.S_ISFIFO(mode) or stat.S_ISSOCK(mode) or os.isatty(fd):
        chunks = _watched(fd, size)
    else:
        chunks = _threaded(fd, size)
    try:
        async for chunk in chunks:
            yield chunk
    except OSError as exc:
        # Input that cannot be read (a directory, a device's error) is bad input, not a
        # broker that cannot be reached.
        raise ValueError(f"cannot read stdin: {exc.strerror or exc}") from None


async def _direct(fd: int, size: int) -> AsyncIterator[bytes]:
    # A regular file never blocks, and the event loop cannot watch one anyway.
    while chunk := os.read(fd, size):
        yield chunk


async def _watched(fd: int, size: int) -> AsyncIterator[bytes]:
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader(limit=size)
    blocking = os.get_blocking(fd)
    pipe = os.fdopen(fd, "rb", buffering=0, closefd=False)
    transport, _ = await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), pipe)
    try:
        while chunk := await reader.read(size):
            yield chunk
    except OSError:
        # A terminal whose other side went away reads EIO: the end of its input.
        if not os.isatty(fd):
            raise
    finally:
        transport.close()
        # The loop made it non-blocking; a terminal shared with the shell must not stay so.
        os.set_blocking(fd, blocking)


async def _threaded(fd: int, size: int) -> AsyncIterator[bytes]:
    loop = asyncio.get_running_loop()
    while True:
        done: asyncio.Future[bytes] = loop.create_future()
        threading.Thread(target=_read_into, args=(loop, done, fd, size), daemon=True).start()
        chunk = await done
        if not chunk:
            return
        yield chunk


def _read_into(
    loop: asyncio.AbstractEventLoop, done: asyncio.Future[bytes], fd: int, size: int
) -> None:
    try:
        chunk, error = os.read(fd, size), None
    except OSError as exc:
        chunk, error = b"", exc
    # The loop may have closed meanwhile: the tool is exiting, and no one waits.
    with contextlib.suppress(RuntimeError):
        loop.call_soon_threadsafe(_settle, done, chunk, error)


def _settle(done: asyncio.Future[bytes], chunk: bytes, error: OSError | None) -> None:
    if done.done():
        return  # cancelled: a signal ended the tool
    if error is not None:
        done.set_exception(error)
    else:
        done.set_result(chunk)


async def lines(
    chunks: AsyncIterator[bytes], *, max_line: int, keep_newline: bool = False
) -> AsyncIterator[bytes]:
    """The lines of ``chunks`` (with their newline when ``keep_newline``); a last line
    without one is kept. A line longer than ``max_line`` bytes is bad input (ValueError:
    exit 2, as a bad flag)."""
    buf = bytearray()
    scanned = 0  # bytes of buf already searched for a newline
    number = 0
    keep = 1 if keep_newline else 0
    async for chunk in chunks:
        buf += chunk
        start = 0
        while (end := buf.find(b"\n", max(start, scanned))) >= 0:
            number += 1
            if end - start > max_line:
                raise _too_long(number, max_line)
            yield bytes(buf[start : end + keep])
            start = end + 1
        del buf[:start]
        scanned = len(buf)
        if len(buf) > max_line:
            raise _too_long(number + 1, max_line)
    if buf:
        yield bytes(buf)


def _too_long(number: int, max_line: int) -> ValueError:
    return ValueError(
        f"line {number} of stdin is over {max_line} bytes, the most one message takes"
    )
