"""Loopback relays to a broker that break it once enough bytes went its way: the broker
dies in the middle of a write at the same point, whatever the machine's speed."""

from __future__ import annotations

import contextlib
import socket
import threading
from collections.abc import Callable


class Relay:
    """Forwards connections to the broker on ``target``; once ``after`` bytes went toward
    it, sets ``tripped`` and calls ``_trip`` (once)."""

    def __init__(self, target: int, after: int) -> None:
        self.target = target
        self.after = after
        self.sent = 0
        self.tripped = threading.Event()
        self._lock = threading.Lock()
        self._socks: list[socket.socket] = []
        self._server = socket.create_server(("127.0.0.1", 0))
        self.port = self._server.getsockname()[1]
        threading.Thread(target=self._accept, daemon=True).start()

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self._server.shutdown(socket.SHUT_RDWR)
        self._server.close()
        self._cut()

    def _trip(self) -> None:
        raise NotImplementedError

    def _cut(self) -> None:
        with self._lock:
            socks, self._socks = self._socks, []
        for sock in socks:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            sock.close()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._server.accept()
            except OSError:
                return
            self._take(client)

    def _take(self, client: socket.socket) -> None:
        self._join(client, socket.create_connection(("127.0.0.1", self.target)))

    def _join(self, client: socket.socket, upstream: socket.socket) -> None:
        with self._lock:
            self._socks += [client, upstream]
        for src, dst, toward in ((client, upstream, True), (upstream, client, False)):
            threading.Thread(target=self._pump, args=(src, dst, toward), daemon=True).start()

    def _counted(self, n: int) -> bool:
        """Counts ``n`` bytes going toward the broker, tripping past ``after``; whether the
        pump that read them forwards nothing more."""
        with self._lock:
            self.sent += n
            trip = self.sent >= self.after and not self.tripped.is_set()
            if trip:
                self.tripped.set()
        if trip:
            self._trip()
        return trip

    def _pump(self, src: socket.socket, dst: socket.socket, toward_broker: bool) -> None:
        with contextlib.suppress(OSError):
            while data := src.recv(65536):
                if toward_broker and self._counted(len(data)):
                    return
                dst.sendall(data)
        with contextlib.suppress(OSError):
            dst.shutdown(socket.SHUT_WR)


class CuttingRelay(Relay):
    """Once tripped, forwards nothing more, calls ``trip`` (which kills the broker), cuts
    every connection and refuses new ones."""

    def __init__(self, target: int, after: int, trip: Callable[[], None]) -> None:
        self.trip = trip
        super().__init__(target, after)

    def _trip(self) -> None:
        self.trip()
        self._cut()

    def _take(self, client: socket.socket) -> None:
        if self.tripped.is_set():
            client.close()
        else:
            super()._take(client)

    def _counted(self, n: int) -> bool:
        return super()._counted(n) or self.tripped.is_set()


class RestartingRelay(Relay):
    """Once tripped, cuts every connection and calls ``restart`` (which kills the broker
    and starts a new one) for the new broker's port; connections that come meanwhile wait
    for it (``up``)."""

    def __init__(self, target: int, after: int, restart: Callable[[], int]) -> None:
        self.restart = restart
        self.up = threading.Event()
        self.up.set()
        super().__init__(target, after)

    def _trip(self) -> None:
        self.up.clear()
        self._cut()
        self.target = self.restart()
        self.up.set()

    def _take(self, client: socket.socket) -> None:
        threading.Thread(target=self._connect, args=(client,), daemon=True).start()

    def _connect(self, client: socket.socket) -> None:
        self.up.wait()
        try:
            upstream = socket.create_connection(("127.0.0.1", self.target))
        except OSError:
            client.close()
            return
        self._join(client, upstream)
