"""Reading ahead of a reader that is behind: the disk's wait in a worker thread, not the loop.

A consumer behind a disk queue's memory (``store.RECENT_BYTES``), and the replay reads of
``/queue/read``, read the segment file with :meth:`SegmentLog.read` in the event loop: the
log is not thread-safe, and it checks every record's crc as it goes. What a thread can take
off the loop is the wait for the disk: :class:`ReadAhead` reads the next stretch of the
segment into the page cache, so the log's next read costs what a warm one does
(bench/RESULTS.md, file reads, has the measurements).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import os
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

__all__ = ["WINDOW", "ReadAhead"]

WINDOW = 4 << 20  # how far ahead of a reader: a few of its reads (a read is at most 4 MiB)
# Threads of their own: the default executor runs the fsyncs that publishers' confirms
# wait for, and many readers far behind must not queue those behind their reads.
_THREADS = 2
_CHUNK = 1 << 20  # bytes per read: the thread holds no more than this at once


class ReadAhead:
    """Keeps up to :data:`WINDOW` bytes past a reader's position in the page cache.

    After each read from the file it reads the next stretch of the same segment in a
    worker thread and drops the bytes: the page cache keeps them for the log's next read
    (still in the loop, still checking). The read is one call in the thread, open to
    close (``aiofiles.os.wrap``), not aiofiles's file object: that takes a hand-off per
    open, seek, read and close, and a read cancelled (its store closed) between two of
    them leaves the file open. The price is one more read of each stretch, in a thread;
    readers that keep up never start one. One read at a time per reader, and only while
    it is behind: no task when nobody is.
    """

    def __init__(self) -> None:
        self._task: asyncio.Task[None] | None = None
        self._path: Path | None = None
        self._start = self._end = 0  # what was read ahead in _path: [_start, _end)

    def after_read(self, position: tuple[Path, int] | None) -> None:
        """A read from the file ended at ``position`` (segment file, offset); None: unknown."""
        if position is None or self._task is not None:
            return
        path, offset = position
        covered = path == self._path and self._start <= offset < self._end
        if covered and offset + WINDOW // 2 < self._end:
            return  # still well ahead of the reader
        start = self._end if covered else offset
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # used outside a loop (tools, tests): reads just wait
            return
        self._path, self._start, self._end = path, offset, offset + WINDOW
        self._task = loop.create_task(_read_into_cache(path, start, self._end - start))
        self._task.add_done_callback(self._done)

    def _done(self, task: asyncio.Task[None]) -> None:
        if self._task is task:
            self._task = None

    def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            self._task = None


@functools.cache
def _threads() -> ThreadPoolExecutor:
    return ThreadPoolExecutor(_THREADS, thread_name_prefix="fq-read-ahead")


async def _read_into_cache(path: Path, offset: int, size: int) -> None:
    # A segment trimmed or a disk failing meanwhile: the log's own read will say so.
    with contextlib.suppress(OSError):
        await _read_range()(path, offset, size, executor=_threads())


def _read_range_blocking(path: Path, offset: int, size: int) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        end = offset + size
        while offset < end:
            got = len(os.pread(fd, min(_CHUNK, end - offset), offset))
            if not got:
                return
            offset += got
    finally:
        os.close(fd)


@functools.cache
def _read_range() -> Any:
    # aiofiles is imported by the first read behind memory, not by every broker: an idle
    # one keeps its memory (bench/RESULTS.md, the idle row).
    import aiofiles.os

    return aiofiles.os.wrap(_read_range_blocking)
