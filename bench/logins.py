"""Logins per second with the login throttle: right passwords, then a guesser's wrong ones.

    python -m bench logins        (or python -m bench.logins [--seconds 3] [--parallel 8])

A broker child with ``auth = "password"`` and one user. From 127.0.0.1, ``--parallel``
clients at a time log in over fq's command socket for ``--seconds``: first with the right
password, the cache warm (a reconnect storm's case; the throttle lets every one through),
then with a wrong one (a guesser's case): how many were answered a second and how many of
those had their password checked at all, which the throttle holds to its burst and rate
(docs/security.md, "Failed logins and guessing"). Last, the right password from the
guesser's address is refused unchecked, and from another network logs in.
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

from fqbroker.protocols.fq import wire
from fqbroker.storage.configdb.users import Users

from .child import Broker

CMD_MAGIC = wire.Mode.CMD.to_bytes(4, "big")
_queues = iter(range(1 << 62))  # a queue each: two clients may not share a private one
USER, PASSWORD = b"bench", b"bench-password"


async def login(port: int, password: bytes, source: str = "127.0.0.1") -> str:
    """One login: "ok", or the error text it was refused with."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port, local_addr=(source, 0))
    try:
        writer.write(
            CMD_MAGIC + wire.encode(wire.AuthPlain(USER, b"q%d" % next(_queues), password))
        )
        replies = wire.ClientCommandDecoder()
        while (frame := replies.next_frame()) is None:
            chunk = await reader.read(65536)
            if not chunk:
                return "closed unanswered"
            replies.feed(chunk)
        if isinstance(frame, wire.AuthResponse):
            return "ok"
        return frame.text if isinstance(frame, wire.ErrorReply) else repr(frame)
    finally:
        writer.close()


async def storm(
    port: int, password: bytes, seconds: float, parallel: int
) -> tuple[float, Counter[str]]:
    """Logins with ``password`` for ``seconds``, ``parallel`` at a time: per second, and
    the answers."""
    answers: Counter[str] = Counter()
    deadline = time.monotonic() + seconds

    async def one_client() -> None:
        while time.monotonic() < deadline:
            answers[await login(port, password)] += 1

    start = time.monotonic()
    await asyncio.gather(*(one_client() for _ in range(parallel)))
    return answers.total() / (time.monotonic() - start), answers


async def measure(seconds: float, parallel: int) -> list[str]:
    state = Path(tempfile.mkdtemp(prefix="bench-logins-"))
    try:
        users = Users(state / "fqd.sqlite")
        users.add(USER.decode(), PASSWORD.decode())
        users.allow(USER.decode(), "queue", "*")
        users.close()
        broker = Broker(state, {"auth": '"password"'})
        await asyncio.to_thread(broker.start)
        try:
            assert await login(broker.port, PASSWORD) == "ok"  # the cache warm
            right, right_answers = await storm(broker.port, PASSWORD, seconds, parallel)
            wrong, wrong_answers = await storm(broker.port, b"guess", seconds, parallel)
            after = await login(broker.port, PASSWORD)
            elsewhere = await login(broker.port, PASSWORD, "127.0.1.5")
            tracebacks = broker.tracebacks()
        finally:
            await asyncio.to_thread(broker.stop)
    finally:
        shutil.rmtree(state, ignore_errors=True)
    checked = wrong_answers["authentication failed"]
    return [
        f"  right password, cache warm: {right:8,.0f} logins/s  ({parallel} at a time from"
        f" one address; answers {dict(right_answers)})",
        f"  wrong password:             {wrong:8,.0f} answered/s, {checked} of"
        f" {wrong_answers.total():,} checked in {seconds:g} s (answers {dict(wrong_answers)})",
        f"  then the right password: {after!r} from the guesser's address,"
        f" {elsewhere!r} from another network; tracebacks {tracebacks or 'none'}",
    ]


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m bench.logins", description=__doc__.split("\n")[0])
    p.add_argument("--seconds", type=float, default=3.0, help="per measurement")
    p.add_argument("--parallel", type=int, default=8, help="clients at a time")
    args = p.parse_args(argv if argv is not None else [])
    for line in asyncio.run(measure(args.seconds, args.parallel)):
        print(line, flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
