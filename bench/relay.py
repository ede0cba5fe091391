"""The Python-hop ceiling: a minimal fq relay that parses, routes by dict and forwards.

    python -m bench.relay --port P [--loop uvloop|asyncio]

It speaks just enough fq for the load generators, with no queues, counters or drops: as
little as a Python hop can do per message, so its rate bounds fqbroker's (docs/bench.md).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import struct
import sys

from fqbroker.protocols.fq import wire

_U32 = struct.Struct(">I")
NODE = bytes((10, 0, 0, 1))


class Relay:
    def __init__(self) -> None:
        self.keys: dict[bytes, Session] = {}
        self.routes: dict[bytes, list[Session]] = {}
        self.publishers: set[asyncio.Transport] = set()
        self.paused = 0


class Session:
    """One fq client: a command connection and, once paired, its data transport."""

    def __init__(self, user: bytes) -> None:
        self.user = user
        self.out: list[bytes] = []
        self.data: asyncio.Transport | None = None


class Conn(asyncio.Protocol):
    def __init__(self, relay: Relay) -> None:
        self.relay = relay
        self.buf = b""
        self.mode = 0
        self.session: Session | None = None
        self.transport: asyncio.Transport | None = None
        self.cmd = wire.ServerCommandDecoder()
        self.stamp = b""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  # uvloop's is no subclass

    def data_received(self, data: bytes) -> None:
        if self.mode == wire.Mode.DATA and self.stamp:
            self.messages(data)
            return
        self.buf += data
        if not self.mode:
            if len(self.buf) < 4:
                return
            self.mode = _U32.unpack_from(self.buf)[0]
            self.buf = self.buf[4:]
        if self.mode == wire.Mode.CMD:
            self.commands()
        elif self.mode == wire.Mode.DATA:
            self.hello()

    def commands(self) -> None:
        assert self.transport is not None
        self.cmd.feed(self.buf)
        self.buf = b""
        while (frame := self.cmd.next_frame()) is not None:
            if isinstance(frame, wire.AuthPlain):
                key = os.urandom(wire.KEY_LEN)
                self.session = Session(frame.user)
                self.relay.keys[key] = self.session
                self.transport.write(wire.encode(wire.AuthResponse(key)))
                self.transport.write(wire.encode(wire.Heartbeat()))
            elif isinstance(frame, wire.BindRequest):
                assert self.session is not None
                self.relay.routes.setdefault(frame.exchange, []).append(self.session)
                self.transport.write(wire.encode(wire.BindResponse(1)))

    def hello(self) -> None:
        assert self.transport is not None
        if len(self.buf) < 2 or len(self.buf) < 2 + int.from_bytes(self.buf[:2], "big"):
            return
        n = int.from_bytes(self.buf[:2], "big")
        session = self.relay.keys[self.buf[2 : 2 + n]]
        rest, self.buf = self.buf[2 + n :], b""
        session.data = self.transport
        self.session = session
        self.relay.publishers.add(self.transport)
        peer = self.transport.get_extra_info("peername")
        hop = bytes(int(x) for x in peer[0].split("."))
        user = session.user
        # sender and hops, inserted between the message id and the payload length
        self.stamp = bytes((len(user),)) + user + b"\x02" + NODE + hop
        if self.relay.paused:
            self.transport.pause_reading()
        if rest:
            self.messages(rest)

    def messages(self, data: bytes) -> None:
        buf = self.buf + data if self.buf else data
        n = len(buf)
        pos = 0
        routes = self.relay.routes
        stamp = self.stamp
        touched: list[Session] = []
        unpack_from = _U32.unpack_from
        while pos < n:
            p = pos + 1 + buf[pos]
            if p >= n:
                break
            q = p + 1 + buf[p] + 16  # the payload length field
            if q + 4 > n:
                break
            end = q + 4 + unpack_from(buf, q)[0]
            if end > n:
                break
            subs = routes.get(buf[pos + 1 : pos + 1 + buf[pos]])
            if subs:
                frame = buf[pos:q] + stamp + buf[q:end]
                for s in subs:
                    if not s.out:
                        touched.append(s)
                    s.out.append(frame)
            pos = end
        self.buf = buf[pos:]
        for s in touched:
            if s.data is not None:
                s.data.write(b"".join(s.out))
            s.out.clear()

    def pause_writing(self) -> None:
        relay = self.relay
        relay.paused += 1
        if relay.paused == 1:
            for t in relay.publishers:
                t.pause_reading()

    def resume_writing(self) -> None:
        relay = self.relay
        relay.paused -= 1
        if relay.paused == 0:
            for t in relay.publishers:
                if not t.is_closing():
                    t.resume_reading()

    def connection_lost(self, exc: Exception | None) -> None:
        if self.transport is not None:
            self.relay.publishers.discard(self.transport)


async def serve(port: int) -> None:
    relay = Relay()
    loop = asyncio.get_running_loop()
    server = await loop.create_server(lambda: Conn(relay), "127.0.0.1", port)
    print(f"Listening on port: {server.sockets[0].getsockname()[1]}", file=sys.stderr, flush=True)
    await server.serve_forever()


def main() -> None:
    p = argparse.ArgumentParser(prog="python -m bench.relay")
    p.add_argument("--port", type=int, default=0)
    p.add_argument("--loop", choices=("uvloop", "asyncio"), default="uvloop")
    args = p.parse_args()
    if args.loop == "uvloop":
        import uvloop

        runner = asyncio.Runner(loop_factory=uvloop.new_event_loop)
    else:
        runner = asyncio.Runner()
    with runner:
        runner.run(serve(args.port))


if __name__ == "__main__":
    main()
