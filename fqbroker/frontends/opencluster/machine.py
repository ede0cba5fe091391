"""One OpenCluster connection's rules, sans I/O: bytes in, reply bytes out, the store
called in between (docs/opencluster.md).

:meth:`Machine.receive` takes what a read brought and returns the bytes to write for it,
in request order, as one object the shell writes at once. Each command is acted on when it
is read; a set's ack, and every reply behind it, waits for the set's group commit, which
the shell reports with :meth:`Machine.committed`. :class:`Machine` says how each command
is answered, and what bounds a connection.
"""

from __future__ import annotations

import struct
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final

from fqbroker.errors import OpenClusterProtocolError
from fqbroker.protocols.opencluster import wire
from fqbroker.storage.kv.store import INT, STRING

if TYPE_CHECKING:
    from fqbroker.storage.kv.store import Batch, KVStore

__all__ = ["DENIED_CODE", "IMPLEMENTED", "Limits", "Machine"]

# What capabilities answers ack for; fail for anything else.
IMPLEMENTED = frozenset(
    {
        wire.HELLO,
        wire.CAPABILITIES,
        wire.SHUTTINGDOWN,
        wire.GOODBYE,
        wire.PING,
        wire.SERVERHELLO,
        wire.SET_INT,
        wire.SET_STRING,
        wire.GET_INT,
        wire.GET_STRING,
    }
)
# Replies a client sends (to our pushes): accepted and ignored.
_REPLIES = frozenset({wire.ACK, wire.FAIL, wire.FAILINFO, wire.TRYELSEWHERE, wire.UNKNOWN})

# A single node holds every bucket of the 2011 generation's 16 (mask 0x0F), as primary.
MASK = 0x0F
_BUCKETS = [(bucket, 0) for bucket in range(MASK + 1)]

_KIND_NAMES = {INT: b"int", STRING: b"string"}
_NOT_STORED = b"not stored: "
_STORE_FULL = b"store full"
_DENIED = b"permission denied"
DENIED_CODE = 4  # failinfo's code for a command the user has no right to

_SET_INT, _SET_STRING = wire.SET_INT, wire.SET_STRING
_GET_INT, _GET_STRING = wire.GET_INT, wire.GET_STRING
_SETS = frozenset({_SET_INT, _SET_STRING})
_GETS = frozenset({_GET_INT, _GET_STRING})
_ACK, _FAIL, _FAILINFO, _UNKNOWN = wire.ACK, wire.FAIL, wire.FAILINFO, wire.UNKNOWN
_ack, _fail, _failinfo = wire.ack, wire.fail, wire.failinfo
_data_int, _data_str = wire.data_int, wire.data_str
_decode_get, _decode_set = wire.decode_get, wire.decode_set
# The hot path's own structs (wire.py's layouts, in one pack or unpack each).
_set_head_from = struct.Struct(">IIiii").unpack_from  # hashes, expires, full_wait, name length
_i32_from = struct.Struct(">i").unpack_from
_hashes_from = struct.Struct(">II").unpack
_pack_header = struct.Struct(">hhii").pack
_unpack_header = struct.Struct(">hhii").unpack_from
_pack_data_int = struct.Struct(">hhiiIIi").pack  # header, hashes, value
_pack_data_str = struct.Struct(">hhiiIIi").pack  # header, hashes, the value's length
_DATA_INT, _DATA_STR = wire.DATA_INT, wire.DATA_STR
_HEADER_SIZE = wire.HEADER_SIZE

# In the queue: goodbye's ack is written, close now.
_CLOSE = None


@dataclass(frozen=True, slots=True)
class Limits:
    """What every connection of one listener allows (the ``[opencluster]`` table's)."""

    max_name: int
    max_value: int
    max_payload: int
    max_inflight: int


class _Acks:
    """The acks of consecutive sets (of one command) of one batch, waiting for its
    commit: one queue entry for a pipelined run of sets, not one each. A set adds its
    user id to a list; the acks' bytes are made at once when the batch is done."""

    __slots__ = ("batch", "command", "userids")

    def __init__(self, batch: Batch, command: int, userids: list[int]) -> None:
        self.batch = batch
        self.command = command
        self.userids = userids

    def encode(self) -> bytes:
        """The acks, one header each, :data:`_ACK_RUN` at most packed by one struct
        call: its arguments the header's head and a user id, by turns (a list made by
        one repetition and one slice assignment: no per-ack Python)."""
        userids = self.userids
        n = len(userids)
        head = _pack_ack_head(_ACK, self.command)
        if n <= _ACK_RUN:
            return _acks(head, userids)
        return b"".join([_acks(head, userids[i : i + _ACK_RUN]) for i in range(0, n, _ACK_RUN)])


# An ack is its command and repcmd (the head, the same for a run), the user id and a
# payload length of 0. A run of n acks is packed by one Struct of n of them: made the
# first time, up to _ACK_RUN (a Struct holds each of its fields: a longer run is split).
_ACK_RUN: Final = 32
_pack_ack_head = struct.Struct(">hh").pack
_ACK_PACKS: Final[dict[int, Callable[..., bytes]]] = {}


def _acks(head: bytes, userids: list[int]) -> bytes:
    n = len(userids)
    pack = _ACK_PACKS.get(n)
    if pack is None:
        pack = _ACK_PACKS[n] = struct.Struct(">" + "4si4x" * n).pack
    args: list[object] = [head] * (2 * n)
    args[1::2] = userids
    return pack(*args)


# A reply waiting in the queue: its bytes, the acks of a run of sets, or _CLOSE.
_Pending = bytes | _Acks | None


class Machine:
    """One connection's commands, answered in order.

    * a set changes the store's memory at once and joins its open group-commit batch
      (:class:`~fqbroker.storage.kv.store.Batch`); its ack may only be written once that
      batch is committed, so its reply, and every reply behind it on this connection,
      waits in ``queue``. The shell calls :meth:`committed` when :attr:`waiting` (the batch
      the first waiting reply needs) is done, and writes what it returns;
    * a get reads the store when it is read: it sees every earlier set of this connection
      (they are in memory already) and none of the later ones, which is what request
      order means. Its reply waits its turn like the others. (After a commit that fails, a
      get read behind one of its sets may have seen the value that was not stored.)
    * hello's ack and the serverlist and hashmasks pushes are one bytes object: the 2011
      C client needs them in one read. Pushes carry this connection's own counter as user
      id, from 0;
    * goodbye is answered, and :attr:`finished` says to close once that is written;
    * replies the client sends (its acks of our pushes, whatever their repcmd) are
      ignored; any other command without an implementation is answered unknown (9).

    At most ``max_inflight`` commands are read and not answered: past it the machine takes
    no frame from its decoder until :meth:`committed` empties the queue (:attr:`full` tells
    the shell to stop reading meanwhile). A malformed frame (bad framing, fields that do
    not add up, a name or value over its limit) ends the connection: :attr:`error` says
    why, after the replies to the frames before it.
    """

    __slots__ = (
        "_bounds",
        "_bye",
        "_held",
        "decoder",
        "error",
        "finished",
        "limits",
        "may_get",
        "may_set",
        "pushes",
        "queue",
        "store",
    )

    def __init__(
        self, store: KVStore, limits: Limits, may_get: bool = True, may_set: bool = True
    ) -> None:
        self.store = store
        self.limits = limits
        # The connection's user's rights (auth = "password"): a get or set it lacks the
        # right for is answered failinfo (DENIED_CODE), the store untouched.
        self.may_get = may_get
        self.may_set = may_set
        self.decoder = wire.FrameDecoder(limits.max_payload)
        self.queue: deque[_Pending] = deque()  # replies that wait for a set's commit
        self.pushes = 0  # user id of our next push
        self.finished = False  # goodbye answered: close once written
        self.error: OpenClusterProtocolError | None = None
        self._bye = False  # goodbye read: nothing after it is
        self._held = 0  # commands whose replies are in the queue
        self._bounds = (limits.max_payload, limits.max_name, limits.max_value)

    @property
    def inflight(self) -> int:
        """Commands read and not yet answered."""
        return self._held

    @property
    def full(self) -> bool:
        """Whether reading should stop until :meth:`committed`."""
        return self._held >= self.limits.max_inflight

    @property
    def waiting(self) -> Batch | None:
        """The batch the first waiting reply needs committed, if any."""
        queue = self.queue
        if queue:
            head = queue[0]
            if type(head) is _Acks:
                return head.batch
        return None

    def receive(self, data: bytes) -> bytes:
        """Bytes read: the replies now due, in order (b"" when none)."""
        self.decoder.receive_data(data)
        return self._pump() if not (self._bye or self.error) else b""

    def committed(self) -> bytes:
        """The batch :attr:`waiting` for is done: the replies now due, including those
        to frames held back while the queue was full."""
        out: list[bytes] = []
        self._drain(out)
        if not (self._bye or self.error):
            more = self._pump()
            if more:
                out.append(more)
        return b"".join(out)

    # --- in -------------------------------------------------------------------------------

    def _pump(self) -> bytes:
        out: list[bytes] = []
        decoder = self.decoder
        max_inflight = self.limits.max_inflight
        while not self._bye and self.error is None:
            room = max_inflight - self._held
            if room <= 0:
                break
            try:
                window = decoder.window()
            except OpenClusterProtocolError as exc:
                self.error = exc
                break
            if window is None or self._answer(window[0], window[1], room, out) < room:
                break  # fewer than asked for: no whole frame is left
        return b"".join(out)

    def _answer(self, buf: bytes, pos: int, room: int, out: list[bytes]) -> int:
        """Act on up to ``room`` frames of ``buf`` from ``pos``, in order, walked where
        they lie (the hot path: no object per frame); a reply goes to ``out``, or to the
        queue behind a set. A run of sets goes to the store in one call
        (:meth:`~fqbroker.storage.kv.store.KVStore.put_frames`), its acks to one queue
        entry. How many frames were taken."""
        decoder = self.decoder
        max_payload = decoder.max_payload
        have = len(buf)
        store = self.store
        put_frames = store.put_frames
        queue = self.queue
        bounds = self._bounds
        may_get, may_set = self.may_get, self.may_set
        tail = queue[-1] if queue else None
        run = tail if type(tail) is _Acks else None  # the queue's tail, if acks
        held = 0  # replies queued here (self._held, once at the end)
        count = 0
        try:
            while count < room and have - pos >= _HEADER_SIZE:
                command, _repcmd, userid, size = _unpack_header(buf, pos)
                if command in _SETS and may_set:
                    got: list[int] = []
                    after = put_frames(buf, pos, have, room - count, command, bounds, got)
                    if got:
                        batch = store.open_batch
                        if run is not None and run.batch is batch and run.command == command:
                            run.userids += got
                        else:
                            run = _Acks(batch, command, got)  # type: ignore[arg-type]
                            queue.append(run)
                        taken = len(got)
                        held += taken
                        count += taken
                        pos = after
                        continue
                    # Not whole, not valid, or a new key in a full store: alone, below.
                if size < 0 or size > max_payload:
                    self.error = decoder.bad_header(pos, command, size)
                    return count
                start = pos + _HEADER_SIZE
                end = start + size
                if end > have:
                    break
                pos = end
                count += 1
                if command in _GETS:
                    if may_get:
                        reply = self._get(command, userid, buf[start:end])
                    else:
                        reply = _failinfo(command, userid, DENIED_CODE, _DENIED)
                elif command in _SETS and not may_set:
                    reply = _failinfo(command, userid, DENIED_CODE, _DENIED)
                elif command in _SETS:
                    batch = self._set(command, buf[start:end])  # raises, saying why
                    if batch is not None:  # put_frames refuses what this takes
                        if run is not None and run.batch is batch and run.command == command:
                            run.userids.append(userid)
                        else:
                            run = _Acks(batch, command, [userid])
                            queue.append(run)
                        held += 1
                        continue
                    reply = _failinfo(command, userid, 3, _STORE_FULL)
                elif command in _REPLIES:
                    continue  # the client's ack of a push
                else:
                    reply = self._control(command, userid, buf[start:end])
                if queue:
                    queue.append(reply)
                    run = None
                    held += 1
                else:
                    out.append(reply)
                if self._bye:
                    if queue:
                        queue.append(_CLOSE)
                    else:
                        self.finished = True
                    return count
        except OpenClusterProtocolError as exc:
            self.error = exc
        finally:
            self._held += held
            decoder.consumed(pos)
        return count

    def _get(self, command: int, userid: int, payload: bytes) -> bytes:
        if len(payload) != 8:
            _decode_get(payload)  # raises, saying why
        map_hash, key_hash = _hashes_from(payload)
        entry = self.store.get((map_hash << 32) | key_hash)
        if entry is None:
            return _pack_header(_FAIL, command, userid, 0)
        if command == _GET_STRING:
            if entry[0] == STRING:
                value: bytes = entry[1]  # type: ignore[assignment]
                size = len(value)
                head = _pack_data_str(
                    _DATA_STR, _GET_STRING, userid, 12 + size, map_hash, key_hash, size
                )
                return head + value
            return _wrong_type(command, userid, entry[0])
        if entry[0] == INT:
            return _pack_data_int(_DATA_INT, _GET_INT, userid, 12, map_hash, key_hash, entry[1])
        return _wrong_type(command, userid, entry[0])

    def _set(self, command: int, payload: bytes) -> Batch | None:
        # wire.decode_set's checks, without its SetValue: every set of a pipelined load
        # comes through here. Anything it does not accept goes to decode_set, which says why.
        size = len(payload)
        limits = self.limits
        if size >= 24:
            map_hash, key_hash, expires, _full_wait, n = _set_head_from(payload, 0)
            end = 20 + n
            if 0 <= n <= limits.max_name and end + 4 <= size:
                name = payload[20:end]
                if command == _SET_STRING:
                    length = _i32_from(payload, end)[0]
                    if end + 4 + length == size and 0 <= length <= limits.max_value:
                        return self.store.put(
                            (map_hash << 32) | key_hash, name, STRING, payload[end + 4 :],
                            expires, payload,
                        )  # fmt: skip
                elif end + 4 == size:
                    value = _i32_from(payload, end)[0]
                    key = (map_hash << 32) | key_hash
                    return self.store.put(key, name, INT, value, expires, payload)
        raise self._bad_set(command, payload)

    def _bad_set(self, command: int, payload: bytes) -> OpenClusterProtocolError:
        """Why a set was refused: wire.decode_set's reason, or the limit it is over."""
        try:
            value = _decode_set(command, payload)
        except OpenClusterProtocolError as exc:
            return exc
        limits = self.limits
        if len(value.name) > limits.max_name:
            return OpenClusterProtocolError(
                f"a name of {len(value.name)} bytes is over the limit of {limits.max_name}"
            )
        size = len(value.value) if isinstance(value.value, bytes) else 0
        return OpenClusterProtocolError(
            f"a value of {size} bytes is over the limit of {limits.max_value}"
        )

    def _control(self, command: int, userid: int, payload: bytes) -> bytes:
        if command == wire.HELLO:
            _empty(command, payload)
            first = self.pushes
            self.pushes += 2
            return (
                _ack(command, userid)
                + wire.serverlist(first, [])
                + wire.hashmasks(first + 1, MASK, _BUCKETS)
            )
        if command in (wire.PING, wire.SHUTTINGDOWN):
            _empty(command, payload)
            return _ack(command, userid)
        if command == wire.GOODBYE:
            _empty(command, payload)
            self._bye = True
            return _ack(command, userid)
        if command == wire.CAPABILITIES:
            asked = wire.decode_capabilities(payload)
            return (_ack if asked in IMPLEMENTED else _fail)(command, userid)
        if command == wire.SERVERHELLO:
            wire.decode_serverhello(payload)
            return _ack(command, userid)
        return wire.unknown(command, userid)

    # --- out ------------------------------------------------------------------------------

    def _drain(self, out: list[bytes]) -> None:
        """Move the replies now due from the queue to ``out``."""
        queue = self.queue
        while queue:
            head = queue[0]
            if head is _CLOSE:
                self.finished = True
                queue.clear()
                self._held = 0
                return
            if type(head) is _Acks:
                batch = head.batch
                if not batch.done:
                    return
                self._held -= len(head.userids)
                if batch.error is None:
                    out.append(head.encode())
                else:
                    text = _NOT_STORED + batch.error.encode("utf-8", "replace")
                    command = head.command
                    for userid in head.userids:
                        out.append(_failinfo(command, userid, 2, text))
            else:
                out.append(head)  # type: ignore[arg-type]  # bytes: _CLOSE and _Acks are out
                self._held -= 1
            queue.popleft()


def _wrong_type(command: int, userid: int, kind: int) -> bytes:
    wanted = b"int" if command == _GET_INT else b"string"
    text = b"wrong type: " + _KIND_NAMES.get(kind, b"?") + b" value, " + wanted + b" asked"
    return _failinfo(command, userid, 1, text)


def _empty(command: int, payload: bytes) -> None:
    if payload:
        name = wire.PROTOCOL_NAMES.get(command, str(command))
        raise OpenClusterProtocolError(f"{name} with a payload of {len(payload)} bytes")
