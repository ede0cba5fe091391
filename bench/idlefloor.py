"""The floor under the idle row: RSS of a do-nothing server holding 10,000 idle connections.

    python -m bench idle-floor        (or python -m bench.idlefloor [CONNECTIONS])

A server that imports what any asyncio broker here imports and keeps its connections'
transports, doing nothing else, for uvloop and for asyncio's own loop. What the idle row
measures above it is fqbroker: its code and its state per connection (docs/bench.md).
"""

from __future__ import annotations

import asyncio
import os
import resource
import socket
import sqlite3
import subprocess
import sys
import time

CONNECTIONS = 10_000


def _rss_mib(field: str = "VmRSS") -> float:
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith(field + ":"):
                return int(line.split()[1]) / 1024
    raise RuntimeError(f"no {field}")


def _split() -> str:
    """Anonymous memory (the heap) and file pages (code), as the idle row says them."""
    return f"anonymous {_rss_mib('RssAnon'):.1f}, file pages {_rss_mib('RssFile'):.1f} MiB"


class _Idle(asyncio.Protocol):
    accepted = 0
    all_in = asyncio.Event()
    wanted = CONNECTIONS

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport
        _Idle.accepted += 1
        if _Idle.accepted >= _Idle.wanted:
            _Idle.all_in.set()


def _hold(port: int, connections: int) -> int:
    """A child process that opens the connections, holds them a while and exits."""
    pid = os.fork()
    if pid == 0:
        held = [socket.create_connection(("127.0.0.1", port)) for _ in range(connections)]
        time.sleep(3 + connections / 5000)
        os._exit(0 if held else 1)
    return pid


async def _serve(connections: int) -> tuple[float, float, int, str, str]:
    _Idle.wanted = connections
    server = await asyncio.get_running_loop().create_server(_Idle, "127.0.0.1", 0, backlog=4096)
    empty, empty_split = _rss_mib(), _split()
    pid = _hold(server.sockets[0].getsockname()[1], connections)
    await _Idle.all_in.wait()  # every connection accepted, its transport made
    await asyncio.sleep(1)
    return empty, _rss_mib(), pid, empty_split, _split()


def _one(loop: str, connections: int) -> None:
    assert sqlite3.sqlite_version  # imported, as the broker does
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    if loop == "uvloop":
        import uvloop

        empty, loaded, pid, empty_split, loaded_split = uvloop.run(_serve(connections))
    else:
        empty, loaded, pid, empty_split, loaded_split = asyncio.run(_serve(connections))
    os.waitpid(pid, 0)
    per = (loaded - empty) * 1024 / connections
    print(
        f"  {loop:8s} empty {empty:5.1f} MiB, {connections:,} idle connections"
        f" {loaded:5.1f} MiB ({loaded * 1.048576:.1f} MB): {per:.2f} KiB per connection\n"
        f"           empty: {empty_split}; with them: {loaded_split}",
        flush=True,
    )


def main(connections: int = CONNECTIONS) -> None:
    """Each loop in a fresh interpreter: nothing of the bench's own imports in its RSS."""
    for loop in ("uvloop", "asyncio"):
        command = [sys.executable, "-m", "bench.idlefloor", "--loop", loop, str(connections)]
        subprocess.run(command, check=True, timeout=300)


if __name__ == "__main__":
    if len(sys.argv) > 2 and sys.argv[1] == "--loop":
        _one(sys.argv[2], int(sys.argv[3]) if len(sys.argv) > 3 else CONNECTIONS)
    else:
        main(int(sys.argv[1]) if len(sys.argv) > 1 else CONNECTIONS)
