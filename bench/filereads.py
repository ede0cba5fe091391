"""File reads in the event loop against aiofiles (a worker thread), for the broker's reads.

Static files, segment ranges and segment-log reads, warm and cold, in the loop and in a
worker thread; then a consumer far behind, without and with ``ReadAhead``. Per row, the
median time per read and the event loop's worst stall (docs/bench.md, "File reads").
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import statistics
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import aiofiles
import aiofiles.os

from fqbroker.storage.segments.coldread import ReadAhead
from fqbroker.storage.segments.log import SegmentLog
from fqbroker.storage.segments.records import Segment

RUNS = 5
READS = {"static 4 KiB": 200, "range 1 MiB": 40, "large range 16 MiB": 4, "log read 1 MiB": 20}
SMALL = 4 << 10
RANGE = 1 << 20
LARGE = 16 << 20  # a large replay read (/queue/read's max_bytes goes to 64 MiB)
FILE = 32 << 20  # a segment file: ranges are read at offsets spread over it
RECORD = 1 << 10
TICK = 0.001

Read = Callable[[], Awaitable[object]]


def _drop_cache(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def _write(path: Path, size: int) -> None:
    with open(path, "wb") as fh:
        for _ in range(size // RANGE or 1):
            fh.write(os.urandom(min(size, RANGE)))
        fh.flush()
        os.fsync(fh.fileno())  # clean pages: DONTNEED drops only those


class Ticker:
    """How late a task that sleeps ``TICK`` at a time wakes up: the loop's worst stall."""

    def __init__(self) -> None:
        self.worst = 0.0
        self._task: asyncio.Task[None] | None = None

    async def __aenter__(self) -> Ticker:
        self._task = asyncio.get_running_loop().create_task(self._run())
        await asyncio.sleep(0)
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._task is not None
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._task

    async def _run(self) -> None:
        while True:
            start = time.perf_counter()
            await asyncio.sleep(TICK)
            self.worst = max(self.worst, time.perf_counter() - start - TICK)


async def measure(read: Read, n: int, cold: Callable[[], None] | None) -> tuple[float, float]:
    """(median seconds per read, worst loop stall) over ``n`` reads."""
    times = []
    async with Ticker() as ticker:
        for _ in range(n):
            if cold is not None:
                cold()
            await asyncio.sleep(0.002)  # let the ticker see the loop free between reads
            start = time.perf_counter()
            await read()
            times.append(time.perf_counter() - start)
    return statistics.median(times), ticker.worst


def static_reads(path: Path) -> dict[str, Read]:
    async def sync() -> bytes:
        return path.read_bytes()  # noqa: ASYNC240 (the blocking read is what is measured)

    async def with_aiofiles() -> bytes:
        async with aiofiles.open(path, "rb") as fh:
            data: bytes = await fh.read()
            return data

    read_in_thread = aiofiles.os.wrap(path.read_bytes)

    async def wrapped() -> bytes:
        data: bytes = await read_in_thread()
        return data

    return {"sync": sync, "aiofiles": with_aiofiles, "aiofiles.wrap": wrapped}


def range_reads(fd: int, afh: object, size: int) -> dict[str, Read]:
    offsets = [(i * 7919 * size) % (FILE - size) for i in range(64)]
    at = iter(offsets * 1000)

    async def sync() -> bytes:
        return os.pread(fd, size, next(at))

    async def with_aiofiles() -> bytes:
        await afh.seek(next(at))  # type: ignore[attr-defined]
        data: bytes = await afh.read(size)  # type: ignore[attr-defined]
        return data

    pread_in_thread = aiofiles.os.wrap(os.pread)

    async def wrapped() -> bytes:
        data: bytes = await pread_in_thread(fd, size, next(at))
        return data

    return {"sync": sync, "aiofiles": with_aiofiles, "aiofiles.wrap": wrapped}


def log_reads(log: SegmentLog, count: int) -> dict[str, Read]:
    per_read = RANGE // (RECORD + 16)
    starts = [1 + (i * 7919 * per_read) % (count - per_read) for i in range(64)]
    at = iter(starts * 1000)

    async def sync() -> object:
        return log.read(next(at), per_read, RANGE)

    return {"sync": sync}


async def behind(
    log: SegmentLog, count: int, read_ahead: bool, kernel_readahead: bool
) -> tuple[float, float]:
    """A consumer reading the whole cold log in order: (median per read, worst stall)."""
    for seg in (log.directory).glob("*.seg"):
        _drop_cache(seg)
    # The log's read descriptors are its own: a bench may reach in to change their advice.
    advice = os.POSIX_FADV_NORMAL if kernel_readahead else os.POSIX_FADV_RANDOM
    for fd in log._rfds.values():
        os.posix_fadvise(fd, 0, 0, advice)
    opened = log._reader

    def reader(seg: Segment) -> int:
        fd = opened(seg)
        os.posix_fadvise(fd, 0, 0, advice)
        return fd

    if not kernel_readahead:  # advice on every read would reset the kernel's window
        log._reader = reader  # type: ignore[method-assign]
    ahead = ReadAhead()
    per_read = RANGE // (RECORD + 16)
    times = []
    seq = 1
    async with Ticker() as ticker:
        while seq <= count:
            start = time.perf_counter()
            got = log.read(seq, per_read, RANGE)
            times.append(time.perf_counter() - start)
            seq = got[-1][0] + 1
            if read_ahead:
                ahead.after_read(log.position(seq))
            await asyncio.sleep(0.002)
    ahead.close()
    vars(log).pop("_reader", None)  # the method again
    return statistics.median(times), ticker.worst


async def run_all() -> list[tuple[str, str, str, float, float]]:
    results: dict[tuple[str, str, str], list[tuple[float, float]]] = {}
    with tempfile.TemporaryDirectory(prefix="bench-filereads-", dir=_var()) as tmp:
        root = Path(tmp)
        small, big = root / "index.html", root / "segment"
        _write(small, SMALL)
        _write(big, FILE)
        log = SegmentLog(root / "log", segment_bytes=FILE)
        count = 0
        payload = os.urandom(RECORD)
        while log.size_bytes < 2 * FILE:  # two segments: a reader crosses into the next
            count = log.append([payload] * 1024)
        log.sync()
        fd = os.open(big, os.O_RDONLY)
        try:
            async with aiofiles.open(big, "rb") as afh:
                kinds = [
                    ("static 4 KiB", static_reads(small), [small]),
                    ("range 1 MiB", range_reads(fd, afh, RANGE), [big]),
                    ("large range 16 MiB", range_reads(fd, afh, LARGE), [big]),
                    ("log read 1 MiB", log_reads(log, count), list((root / "log").glob("*.seg"))),
                ]
                for _ in range(RUNS):  # interleaved: each way once per run
                    for kind, ways, files in kinds:
                        for cache in ("warm", "cold"):

                            def drop(files: list[Path] = files) -> None:
                                for f in files:
                                    _drop_cache(f)

                            for way, read in ways.items():
                                if cache == "warm":
                                    for f in files:
                                        f.read_bytes()
                                got = await measure(
                                    read, READS[kind], drop if cache == "cold" else None
                                )
                                results.setdefault((kind, cache, way), []).append(got)
                    for kernel in (True, False):
                        kind = "behind, in order" + ("" if kernel else ", no kernel readahead")
                        for way, on in (("sync", False), ("ReadAhead", True)):
                            got = await behind(log, count, on, kernel)
                            results.setdefault((kind, "cold", way), []).append(got)
        finally:
            os.close(fd)
            log.close()
    return [
        (
            kind,
            cache,
            way,
            statistics.median(t for t, _ in runs),
            statistics.median(s for _, s in runs),
        )
        for (kind, cache, way), runs in results.items()
    ]


def _var() -> Path:
    # Under ./var, not /tmp: /tmp may be tmpfs, where no read is cold.
    path = Path(__file__).resolve().parents[1] / "var" / "bench"
    path.mkdir(parents=True, exist_ok=True)
    return path


def _loop_factory() -> Callable[[], asyncio.AbstractEventLoop] | None:
    try:
        import uvloop
    except ImportError:
        return None
    factory: Callable[[], asyncio.AbstractEventLoop] = uvloop.new_event_loop
    return factory


def main() -> None:
    with asyncio.Runner(loop_factory=_loop_factory()) as runner:
        rows = runner.run(run_all())
    print(
        f"  {RUNS} runs, medians; stall: the loop's worst lateness on a {TICK * 1e3:.0f} ms timer"
    )
    print(f"  {'read':<38} {'cache':<5} {'way':<13} {'per read':>10} {'worst stall':>12}")
    for kind, cache, way, seconds, stall in rows:
        print(f"  {kind:<38} {cache:<5} {way:<13} {seconds * 1e6:>7.0f} us {stall * 1e3:>9.2f} ms")


if __name__ == "__main__":
    main()
