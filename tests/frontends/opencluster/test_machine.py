"""The OpenCluster machine's hot path (frames walked where they lie in the read buffer)
against a model: any mix of commands, fed in any split, with any ``max_inflight``, is
answered as a plain dict would answer it, in request order; a bad frame after them ends
the connection once they are answered."""

from __future__ import annotations

import asyncio
import struct
import tempfile
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from fqbroker.frontends.opencluster.machine import Limits, Machine, _Acks
from fqbroker.protocols.opencluster import wire
from fqbroker.storage.kv.store import Batch, KVStore
from tests.frontends.opencluster.test_frames import feed

NAMES = [b"a", b"bb", b"\xffc", b"name-%d" % 7]

command = st.one_of(
    st.tuples(st.just("set_string"), st.sampled_from(NAMES), st.binary(max_size=40)),
    st.tuples(st.just("set_int"), st.sampled_from(NAMES), st.integers(-(2**31), 2**31 - 1)),
    st.tuples(st.just("get_string"), st.sampled_from(NAMES)),
    st.tuples(st.just("get_int"), st.sampled_from(NAMES)),
    st.tuples(st.just("ping")),
    st.tuples(st.just("reply")),  # the client's ack of a push: no answer
    st.tuples(st.just("lock")),  # never specified: answered unknown
)


def encode(userid: int, op: tuple[object, ...]) -> bytes:
    kind = op[0]
    if kind == "set_string":
        return wire.set_string(userid, op[1], op[2])  # type: ignore[arg-type]
    if kind == "set_int":
        return wire.set_int(userid, op[1], op[2])  # type: ignore[arg-type]
    if kind == "get_string":
        return wire.get_string(userid, op[1])  # type: ignore[arg-type]
    if kind == "get_int":
        return wire.get_int(userid, op[1])  # type: ignore[arg-type]
    if kind == "ping":
        return wire.ping(userid)
    if kind == "reply":
        return wire.ack(wire.SERVERLIST, userid)
    return wire.encode_frame(wire.LOCK, 0, userid)


def model(ops: list[tuple[object, ...]]) -> bytes:
    """What the replies must be: a dict of name to value, answered in order."""
    values: dict[bytes, int | bytes] = {}
    out = []
    for userid, op in enumerate(ops):
        kind = op[0]
        if kind in ("set_string", "set_int"):
            values[op[1]] = op[2]  # type: ignore[index]
            cmd = wire.SET_STRING if kind == "set_string" else wire.SET_INT
            out.append(wire.ack(cmd, userid))
        elif kind in ("get_string", "get_int"):
            name: bytes = op[1]  # type: ignore[assignment]
            cmd = wire.GET_STRING if kind == "get_string" else wire.GET_INT
            value = values.get(name)
            if value is None:
                out.append(wire.fail(cmd, userid))
            elif isinstance(value, bytes) and cmd == wire.GET_STRING:
                out.append(wire.data_str(userid, 0, wire.fnv1a32(name), value))
            elif isinstance(value, int) and cmd == wire.GET_INT:
                out.append(wire.data_int(userid, 0, wire.fnv1a32(name), value))
            else:
                held = b"int" if isinstance(value, int) else b"string"
                asked = b"int" if cmd == wire.GET_INT else b"string"
                text = b"wrong type: " + held + b" value, " + asked + b" asked"
                out.append(wire.failinfo(cmd, userid, 1, text))
        elif kind == "ping":
            out.append(wire.ack(wire.PING, userid))
        elif kind == "lock":
            out.append(wire.unknown(wire.LOCK, userid))
    return b"".join(out)


async def answers(data: bytes, cuts: list[int], max_inflight: int) -> tuple[bytes, Machine]:
    with tempfile.TemporaryDirectory() as tmp:
        store = KVStore(Path(tmp) / "kv.sqlite3", sync="normal")
        try:
            machine = Machine(store, Limits(64, 1024, 2048, max_inflight))
            # feed stops reading while the machine is full, as the shell does.
            return await feed(machine, data, cuts), machine
        finally:
            await store.close()


@settings(max_examples=60, deadline=None)
@given(
    ops=st.lists(command, max_size=40),
    cuts=st.lists(st.integers(0, 2000), max_size=8),
    max_inflight=st.integers(1, 6),
    bad=st.booleans(),
)
def test_the_machine_answers_as_a_dict_in_any_split(
    ops: list[tuple[object, ...]], cuts: list[int], max_inflight: int, bad: bool
) -> None:
    data = b"".join(encode(userid, op) for userid, op in enumerate(ops))
    if bad:  # a negative payload length: the connection ends after the frames before it
        data += struct.pack(">hhii", wire.SET_STRING, 0, 99, -1)
    cuts = [c for c in cuts if c < len(data)]
    out, machine = asyncio.run(answers(data, cuts, max_inflight))
    assert out == model(ops)
    assert (machine.error is not None) == bad
    assert machine.inflight == 0 and not machine.queue


@given(
    userids=st.lists(st.integers(-(2**31), 2**31 - 1), min_size=1, max_size=50),
    command=st.sampled_from([wire.SET_INT, wire.SET_STRING]),
)
def test_a_run_of_acks_is_the_acks_one_by_one(userids: list[int], command: int) -> None:
    run = _Acks(Batch(), command, [userids[0]])
    run.userids += userids[1:]
    assert run.encode() == b"".join(wire.ack(command, u) for u in userids)
