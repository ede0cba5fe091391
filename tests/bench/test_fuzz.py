"""The short fuzz run of ``make test``: bench/fuzz.py against one broker child.

20,000 generated and mutated frames over every front end of bench/frontends.py, a round
trip through each front end every 2,000 frames, RSS and descriptors flat, no traceback in
the broker's log. The seed is random and printed: a failure names the seed that replays it
(``python -m bench.fuzz --frames 20000 --check-every 2000 --seed N``). ``make fuzz`` is the
long run (docs/reliability.md).
"""

from __future__ import annotations

import asyncio
import json
import random
import struct
from collections import Counter
from pathlib import Path

from bench import child, fuzz
from bench.frontends import FRONT_ENDS, mutate_bytes
from fqbroker.protocols.fq import wire


async def test_short_fuzz_run_finds_nothing(tmp_path: Path) -> None:
    # RSS may grow 64 MiB, not 32: the retained topics' caches (8 MiB of frames each, the
    # fuzzer's Figg entry writes four topics) fill over a run this short and level off
    # after it (Figg alone, seed 7: 99 MiB at 20k frames, 102 at 60k, 107 at 150k), so the
    # warm-up sample at 2,000 frames is not yet the plateau. `make fuzz` keeps 32.
    args = fuzz.parser().parse_args(
        ["--frames", "20000", "--check-every", "2000", "--max-seconds", "120",
         "--rss-slack-mib", "64", "--state", str(tmp_path / "fuzz")]
    )  # fmt: skip
    result = await fuzz.run(args)
    fuzz.print_summary(result)
    assert result["frames"] >= 20_000
    assert set(result["round_trips"]) == {fe.name for fe in FRONT_ENDS}
    assert result["failures"] == [], json.dumps(result, indent=1)


def test_sessions_replay_byte_for_byte() -> None:
    """What makes a finding reproducible: a seed gives the same frames and mutations."""
    for fe in FRONT_ENDS:
        runs = []
        for _ in range(2):
            rng = random.Random(1234)
            runs.append([fe.mutate(rng, fe.frame(rng)) for _ in range(50)])
        assert runs[0] == runs[1], fe.name


def test_mutations_change_frames_and_stay_bounded() -> None:
    rng = random.Random(7)
    frame = bytes(range(64))
    outs = [mutate_bytes(rng, frame) for _ in range(1000)]
    assert sum(out != frame for out in outs) > 950
    assert max(map(len, outs)) <= 64 * 1024


async def test_submit_into_a_disk_queue_destroyed_meanwhile_is_answered(tmp_path: Path) -> None:
    """Found by the fuzzer (docs/reliability.md): a /submit routed into a transient disk
    queue whose last client leaves before the write is durable never got a reply, and its
    connection stayed open for good (CLOSE_WAIT), a descriptor leaked per request. A long
    fsync interval holds the submits in their wait for durability while the queue goes."""
    broker = child.Broker(tmp_path / "fqd", settings={"fsync_interval_ms": "1000"})
    await asyncio.to_thread(broker.start)
    try:
        before = child.fd_count(broker.pid)
        reader, writer = await asyncio.open_connection("127.0.0.1", broker.port)
        auth = wire.AuthPlain(b"u", b"dq\x00disk:public,drop", b"")
        writer.write(wire.encode_hello(wire.Mode.CMD, b"")[:4] + wire.encode(auth))
        writer.write(wire.encode(wire.BindRequest(wire.BindFlags.TRANS, b"dx", b"prefix:")))
        decoder = wire.ClientCommandDecoder()
        while not any(isinstance(f, wire.BindResponse) for f in _frames(decoder)):
            decoder.feed(await reader.read(4096))
        submits = [asyncio.create_task(_submit(broker.port)) for _ in range(5)]
        for _ in range(200):  # until the broker has routed all five into the queue
            if await _routed(broker.port, b"dx") == 5:
                break
            await asyncio.sleep(0.01)
        writer.close()  # the queue's only client leaves: the queue is destroyed
        replies = await asyncio.gather(*submits)
        assert all(r.startswith(b"HTTP/1.1 ") for r in replies), replies
        assert await _fds_back(broker, before), child.tcp_sockets(broker.pid)
    finally:
        await asyncio.to_thread(broker.stop)


async def _routed(port: int, exchange: bytes) -> int:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(b"GET /stats.json HTTP/1.1\r\nHost: t\r\n\r\n")
        _, body = await child.http_reply(reader)
    finally:
        writer.close()
    stats = json.loads(body)["exchanges"].get(exchange.decode(), {})
    return int(stats.get("routed", 0))


def _frames(decoder: wire.ClientCommandDecoder) -> list[wire.Frame]:
    out: list[wire.Frame] = []
    while (frame := decoder.next_frame()) is not None:
        out.append(frame)
    return out


async def _submit(port: int) -> bytes:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(
        b"POST /submit HTTP/1.1\r\nHost: t\r\nX-Fq-Exchange: dx\r\nX-Fq-Route: r\r\n"
        b"Content-Length: 1\r\n\r\nx"
    )
    try:
        # A bound, not a timing: the reply comes at once or, with the bug, never.
        async with asyncio.timeout(10):
            return await reader.readuntil(b"\r\n")
    except TimeoutError:
        return b"no reply"
    finally:
        writer.close()


async def _fds_back(broker: child.Broker, before: int) -> bool:
    for _ in range(100):
        if child.fd_count(broker.pid) <= before:
            return True
        await asyncio.sleep(0.1)
    return False


def test_fyrehose_datagrams_cover_every_kind_and_stay_on_this_machine() -> None:
    """The fyrehose entry sends every kind of datagram, mutated up to the largest UDP
    carries and no further, and never names an address off loopback: the broker sends
    DELIVERs wherever a KEEPALIVE or REQUEST says."""
    from bench.fyrehosefuzz import fyrehose_frame, mutate_fyrehose, sink_port
    from fqbroker.protocols.fyrehose import wire as fh

    rng = random.Random(11)
    kinds: set[str] = set()
    seed_forms = 0
    sizes = []
    for _ in range(5000):
        frame = fyrehose_frame(rng)
        d = fh.decode(frame)  # every unmutated frame is valid
        kinds.add(type(d).__name__)
        seed_forms += getattr(d, "seed", False)
        for out in (frame, mutate_fyrehose(rng, frame)):
            sizes.append(len(out))
            if len(out) >= 7 and out[0] in (fh.KEEPALIVE, fh.REQUEST, fh.FORWARD):
                assert out[1] == 127 or out[1:5] == bytes(4), out[:7].hex()
                assert int.from_bytes(out[5:7], "big") in (0, sink_port()), out[:7].hex()
    assert kinds == {"Push", "Keepalive", "Request", "Deliver", "Forward", "KeepaliveAck"}
    assert seed_forms > 100
    assert max(sizes) == fh.MAX_DATAGRAM


def test_opencluster_frames_cover_every_command_and_mutations_hit_the_limits() -> None:
    """The opencluster entry sends every command id the protocol names (the valid frames
    decode as they are), and its mutations give lengths negative, short and past
    max_payload, truncate, and make names and values one byte past their limits."""
    from bench.ocfuzz import MAX_NAME, MAX_PAYLOAD, MAX_VALUE, mutate_opencluster
    from bench.ocfuzz import opencluster_frame as frame
    from fqbroker.errors import OpenClusterProtocolError
    from fqbroker.protocols.opencluster import wire as oc

    rng = random.Random(5)
    commands: set[int] = set()
    lengths: set[int] = set()
    outcomes: Counter[str] = Counter()
    for _ in range(5000):
        decoder = oc.FrameDecoder(MAX_PAYLOAD)
        decoder.receive_data(frame(rng))
        while (f := decoder.next_frame()) is not None:
            commands.add(f.command)
        assert decoder.next_frame() is None  # nothing left over: whole, valid frames
        out = mutate_opencluster(rng, frame(rng))
        if len(out) >= oc.HEADER_SIZE:
            lengths.add(struct.unpack_from(">i", out, 8)[0])
        decoder = oc.FrameDecoder(MAX_PAYLOAD)
        decoder.receive_data(out)
        try:
            while decoder.next_frame() is not None:
                pass
            outcomes["incomplete or valid"] += 1
        except OpenClusterProtocolError:
            outcomes["malformed"] += 1
    named = {
        oc.HELLO, oc.CAPABILITIES, oc.SHUTTINGDOWN, oc.GOODBYE, oc.PING, oc.SERVERHELLO,
        oc.SET_INT, oc.SET_STRING, oc.GET_INT, oc.GET_STRING, oc.ACK, oc.FAIL,
        *oc.NEVER_SPECIFIED,
    }  # fmt: skip
    assert named <= commands, named - commands
    assert commands - named - {oc.SERVERLIST, oc.HASHMASKS, oc.DATA_INT, oc.DATA_STR}  # unknowns
    assert {-1, -0x80000000, 0, MAX_PAYLOAD + 1, 0x7FFFFFFF} <= lengths
    assert outcomes["malformed"] > 200 and outcomes["incomplete or valid"] > 200, outcomes
    rng = random.Random(6)
    oversize = [mutate_opencluster(rng, b"") for _ in range(3000)]
    assert any(len(o) > MAX_VALUE for o in oversize)
    assert any(b"N" * (MAX_NAME + 1) in o for o in oversize)
