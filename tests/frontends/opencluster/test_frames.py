"""A read's run of sets taken by the store in one call (``KVStore.put_frames``) and
journaled as one FRAMES record of the frames as read: what a restart replays is what
memory holds (expiry to the bit), a full store or a bad frame in the middle of a run is
answered in its turn, a failed write restores what the run changed, and journals of
the format before (one record a set) are still read."""

from __future__ import annotations

import asyncio
import shutil
import struct
import tempfile
import zlib
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fqbroker.frontends.opencluster.machine import Limits, Machine
from fqbroker.protocols.opencluster import wire
from fqbroker.storage.kv.journal import (
    MAGIC,
    MAGIC_V1,
    RECORD,
    journal_path,
    journals,
    replay,
    set_payload,
)
from fqbroker.storage.kv.store import INT, STRING, KVStore, key_of
from tests.conftest import wait_for

LIMITS = Limits(16, 64, 2048, 1024)
NAMES = [b"a", b"bb", b"\xffc", b"name-7"]

a_set = st.one_of(
    st.tuples(
        st.just(wire.SET_STRING),
        st.sampled_from(NAMES),
        st.binary(max_size=40),
        st.sampled_from([0, 0, -5, 3600, 86_400]),
    ),
    st.tuples(
        st.just(wire.SET_INT),
        st.sampled_from(NAMES),
        st.integers(-(2**31), 2**31 - 1),
        st.sampled_from([0, 3600]),
    ),
)


def encode(userid: int, op: tuple[int, bytes, int | bytes, int]) -> bytes:
    command, name, value, expires = op
    if command == wire.SET_STRING:
        assert isinstance(value, bytes)
        return wire.set_string(userid, name, value, expires=expires)
    assert isinstance(value, int)
    return wire.set_int(userid, name, value, expires=expires)


async def settle(machine: Machine, out: list[bytes]) -> None:
    while (batch := machine.waiting) is not None:
        if not batch.done:
            done = asyncio.Event()
            batch.waiters.append(done.set)
            async with asyncio.timeout(10):
                await done.wait()
        out.append(machine.committed())


async def feed(machine: Machine, data: bytes, cuts: list[int]) -> bytes:
    out: list[bytes] = []
    at = 0
    for cut in [*sorted(set(cuts)), len(data)]:
        out.append(machine.receive(data[at:cut]))
        at = cut
        if machine.full:
            await settle(machine, out)
    await settle(machine, out)
    return b"".join(out)


def replayed(path: Path) -> dict[int, tuple[int, int | bytes, float, bytes]]:
    values: dict[int, tuple[int, int | bytes, float, bytes]] = {}
    for _, journal in journals(path):
        for map_hash, key_hash, kind, value, expires, name in replay(journal):
            values[key_of(map_hash, key_hash)] = (kind, value, expires, name)
    return values


@settings(max_examples=60, deadline=None)
@given(
    ops=st.lists(a_set, max_size=40),
    cuts=st.lists(st.integers(0, 2000), max_size=6),
    max_inflight=st.integers(1, 40),
)
def test_what_a_restart_replays_is_what_memory_holds(
    ops: list[tuple[int, bytes, int | bytes, int]], cuts: list[int], max_inflight: int
) -> None:
    data = b"".join(encode(userid, op) for userid, op in enumerate(ops))

    async def run(tmp: Path) -> None:
        path = tmp / "kv.sqlite3"
        store = KVStore(path, sync="normal", fold_bytes=1 << 40)
        try:
            limits = Limits(16, 64, 2048, max_inflight)
            out = await feed(Machine(store, limits), data, [c for c in cuts if c < len(data)])
            acks = [wire.ack(op[0], userid) for userid, op in enumerate(ops)]
            assert out == b"".join(acks)
            assert store.sets == len(ops) and store.keys == len({op[1] for op in ops})
            assert replayed(path) == store._values  # the expiry times too, to the bit
            last = {op[1]: op for op in ops}
            for name, (command, _, value, expires) in last.items():
                entry = store._values[key_of(0, wire.fnv1a32(name))]
                assert entry[::3] == (STRING if command == wire.SET_STRING else INT, name)
                assert entry[1] == value
                assert (entry[2] > 0) == (expires > 0)
            held = dict(store._values)
            copy = Path(shutil.copytree(tmp, tmp / "crash")) / "kv.sqlite3"
        finally:
            await store.close()
        again = KVStore(copy)  # what kill -9 left: the journal alone
        try:
            assert again._values == held
        finally:
            await again.close()

    with tempfile.TemporaryDirectory() as tmp:
        asyncio.run(run(Path(tmp)))


async def test_a_full_store_refuses_the_new_key_in_the_middle_of_a_run(tmp_path: Path) -> None:
    store = KVStore(tmp_path / "kv.sqlite3", sync="normal", max_keys=2)
    try:
        machine = Machine(store, LIMITS)
        names = [b"a", b"b", b"c", b"a"]
        data = b"".join(wire.set_string(i, n, b"v%d" % i) for i, n in enumerate(names))
        out = await feed(machine, data, [])
        assert out == (
            wire.ack(wire.SET_STRING, 0)
            + wire.ack(wire.SET_STRING, 1)
            + wire.failinfo(wire.SET_STRING, 2, 3, b"store full")
            + wire.ack(wire.SET_STRING, 3)
        )
        assert store.sets == 3 and store.keys == 2
        assert store.get(key_of(0, wire.fnv1a32(b"a")))[:2] == (STRING, b"v3")  # type: ignore[index]
        assert len(replayed(tmp_path / "kv.sqlite3")) == 2
    finally:
        await store.close()


async def test_a_bad_frame_ends_the_run_after_the_sets_before_it(tmp_path: Path) -> None:
    store = KVStore(tmp_path / "kv.sqlite3", sync="normal")
    try:
        machine = Machine(store, LIMITS)
        good = wire.set_string(1, b"a", b"x") + wire.set_int(2, b"b", 7)
        too_long = wire.set_string(3, b"n" * (LIMITS.max_name + 1), b"y")
        out = await feed(machine, good + too_long + wire.set_int(4, b"c", 1), [])
        assert out == wire.ack(wire.SET_STRING, 1) + wire.ack(wire.SET_INT, 2)
        assert machine.error is not None and "name of 17 bytes" in str(machine.error)
        assert store.keys == 2 and len(replayed(tmp_path / "kv.sqlite3")) == 2
    finally:
        await store.close()


async def test_every_user_id_comes_back_in_its_ack_as_sent(tmp_path: Path) -> None:
    store = KVStore(tmp_path / "kv.sqlite3", sync="normal")
    try:
        machine = Machine(store, LIMITS)
        userids = [0, 1, -1, 2**31 - 1, -(2**31), 65_535, -65_536]
        data = b"".join(wire.set_string(u, b"k%d" % i, b"v") for i, u in enumerate(userids))
        data += b"".join(wire.set_int(u, b"i%d" % i, -7) for i, u in enumerate(userids))
        out = await feed(machine, data, [])
        assert out == b"".join(wire.ack(wire.SET_STRING, u) for u in userids) + b"".join(
            wire.ack(wire.SET_INT, u) for u in userids
        )
        assert store.get(key_of(0, wire.fnv1a32(b"i2")))[:2] == (INT, -7)  # type: ignore[index]
    finally:
        await store.close()


@pytest.mark.parametrize("sets", [1, 2, 31, 32, 33, 64, 100])
async def test_a_run_of_any_length_is_acked_one_header_each_in_order(
    tmp_path: Path, sets: int
) -> None:
    store = KVStore(tmp_path / "kv.sqlite3", sync="normal")
    try:
        machine = Machine(store, LIMITS)
        userids = [(i * 7919 - 50) * (-1) ** i for i in range(sets)]
        data = b"".join(wire.set_int(u, b"k%d" % (i % 5), i) for i, u in enumerate(userids))
        out = await feed(machine, data, [])
        assert out == b"".join(wire.ack(wire.SET_INT, u) for u in userids)
    finally:
        await store.close()


@pytest.mark.parametrize("length", [2, 4, -1, 2**31 + 3, 2**32 - 3, 3 + (1 << 8), 3 + (1 << 24)])
async def test_a_string_set_whose_length_field_is_not_its_values_ends_the_run(
    tmp_path: Path, length: int
) -> None:
    store = KVStore(tmp_path / "kv.sqlite3", sync="normal")
    try:
        machine = Machine(store, LIMITS)
        good = wire.set_string(1, b"a", b"x")
        frame = bytearray(wire.set_string(2, b"b", b"yyy"))
        at = wire.HEADER_SIZE + 20 + 1  # the value's length field, after the name "b"
        assert frame[at : at + 4] == struct.pack(">i", 3)
        frame[at : at + 4] = (length & 0xFFFFFFFF).to_bytes(4, "big")
        out = await feed(machine, good + bytes(frame) + wire.set_int(3, b"c", 1), [])
        assert out == wire.ack(wire.SET_STRING, 1)
        assert machine.error is not None
        assert store.keys == 1 and len(replayed(tmp_path / "kv.sqlite3")) == 1
    finally:
        await store.close()


async def test_a_failed_write_of_a_run_restores_memory_and_says_not_stored(
    tmp_path: Path,
) -> None:
    path = tmp_path / "kv.sqlite3"
    store = KVStore(path, sync="normal", fold_bytes=1)  # a fold after each write
    try:
        machine = Machine(store, LIMITS)
        assert await feed(machine, wire.set_string(0, b"a", b"kept"), []) == wire.ack(
            wire.SET_STRING, 0
        )
        await wait_for(lambda: store._folding is None and store.folds > 0)
        gen = store._journal.gen
        journal_path(path, gen).symlink_to("/dev/full")
        data = wire.set_string(1, b"a", b"lost") + wire.set_string(2, b"new", b"lost")
        out = await feed(machine, data, [])
        text = b"not stored: [Errno 28] No space left on device"
        assert out == wire.failinfo(wire.SET_STRING, 1, 2, text) + wire.failinfo(
            wire.SET_STRING, 2, 2, text
        )
        assert store.get(key_of(0, wire.fnv1a32(b"a")))[:2] == (STRING, b"kept")  # type: ignore[index]
        assert store.get(key_of(0, wire.fnv1a32(b"new"))) is None and store.keys == 1
    finally:
        await store.close()


def test_a_journal_of_the_format_before_is_replayed(tmp_path: Path) -> None:
    payload = set_payload(1, 2, b"old", STRING, b"value")
    body = RECORD.pack(STRING, 0.0, len(payload)) + payload
    journal = journal_path(tmp_path / "kv.sqlite3", 1)
    journal.write_bytes(MAGIC_V1 + struct.pack(">II", len(body), zlib.crc32(body)) + body)
    assert MAGIC != MAGIC_V1
    assert list(replay(journal)) == [(1, 2, STRING, b"value", 0.0, b"old")]
