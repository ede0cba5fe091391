"""The client's side of an OpenCluster connection, sans I/O (docs/opencluster-client.md).

:class:`OCMachine` turns requests into bytes and bytes into answers, and does nothing else:
the asyncio shell (:mod:`fqbroker.clients.opencluster.client`) owns the socket. Requests return
the frame to write, under user ids counting up from 0; replies must echo the oldest
outstanding request (the server answers in order), and the handshake's pushes are acked
as the 2011 client did. :meth:`OCMachine.receive_data` returns the :class:`Answer` of each
request completed; every error is an :class:`~fqbroker.errors.OpenClusterProtocolError`.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from fqbroker.errors import OpenClusterProtocolError
from fqbroker.protocols.opencluster import wire

__all__ = ["MAX_REPLY", "Answer", "OCMachine", "as_name", "as_value"]

# A reply can carry a value of any size the server keeps; 64 MiB bounds what a broken or
# hostile server can make us buffer.
MAX_REPLY = 64 << 20
I32_MIN, I32_MAX = -(2**31), 2**31 - 1

_REPLIES = frozenset({wire.ACK, wire.FAIL, wire.FAILINFO, wire.TRYELSEWHERE, wire.UNKNOWN})
_DATA_FOR = {wire.GET_INT: wire.DATA_INT, wire.GET_STRING: wire.DATA_STR}


@dataclass(frozen=True, slots=True)
class Answer:
    """What the server said to one request: ``reply`` is ACK, FAIL, FAILINFO, TRYELSEWHERE,
    UNKNOWN, DATA_INT or DATA_STR; ``value`` is the data's value, ``code`` and ``text`` a
    failinfo's (the text is tryelsewhere's address too)."""

    request: int
    reply: int
    value: int | bytes | None = None
    code: int = 0
    text: bytes = b""


def as_name(name: str | bytes) -> bytes:
    return name.encode() if isinstance(name, str) else bytes(name)


def as_value(value: int | bytes | str) -> int | bytes:
    """An int (i32) or the bytes of a string value; anything else is a ValueError."""
    if isinstance(value, bool) or not isinstance(value, int | bytes | bytearray | str):
        raise ValueError(f"a value is an int, bytes or str, not {type(value).__name__}")
    if isinstance(value, int):
        if not I32_MIN <= value <= I32_MAX:
            raise ValueError(f"{value} does not fit a 32-bit signed int")
        return value
    return value.encode() if isinstance(value, str) else bytes(value)


class OCMachine:
    """One OpenCluster connection's client state; a new connection needs a new machine.

    * **Requests** (:meth:`set`, :meth:`get`, :meth:`ping`, :meth:`goodbye`) return the
      frame to write. Each takes the next user id, counting up from 0 (wrapping at 2**31),
      so replies can be checked against it; the 2011 C client reused id 0, which the
      server allows as well.
    * **Replies** are matched in order: the next reply must echo the oldest outstanding
      request's user id and command (``repcmd``), and be a reply that command can get
      (data_int only to get_int, data_str only to get_string). Anything else is a
      protocol error: the connection is out of step and cannot be trusted past it.
    * **Pushes** (``repcmd`` 0) are the handshake's serverlist and hashmasks, each acked
      with ``repcmd`` 100 as the 2011 client did (the server accepts whatever repcmd).
      Any other push is a protocol error, as it was an ``assert`` in the 2011 client.
      :attr:`ready` is true once hello's ack and the hashmasks have arrived.

    :meth:`data_to_send` returns the acks owed to pushes. Every error is final.
    """

    def __init__(self, max_reply: int = MAX_REPLY) -> None:
        self._decoder = wire.FrameDecoder(max_reply)
        self._pending: deque[tuple[int, int, int]] = deque()  # (userid, command, key_hash)
        self._next_id = 0
        self._out = bytearray()
        self._hello_acked = False
        self._hashmasks_seen = False
        self.ready = False
        self.mask = 0
        self.buckets: list[tuple[int, int]] = []
        self.servers: list[bytes] = []
        self._error: OpenClusterProtocolError | None = None

    @property
    def outstanding(self) -> int:
        """Requests sent and not yet answered."""
        return len(self._pending)

    def _request(self, command: int, key_hash: int = 0) -> int:
        userid = self._next_id
        self._next_id = 0 if userid == I32_MAX else userid + 1
        self._pending.append((userid, command, key_hash))
        return userid

    # --- requests: each returns the bytes to write ------------------------------------------

    def hello(self) -> bytes:
        return wire.hello(self._request(wire.HELLO))

    def set(self, name: bytes, value: int | bytes, *, expires: int = 0) -> bytes:
        if not 0 <= expires <= I32_MAX:
            raise ValueError(f"expires of {expires} s (0 to {I32_MAX}; 0 = never)")
        if isinstance(value, int):
            return wire.set_int(self._request(wire.SET_INT), name, value, expires=expires)
        return wire.set_string(self._request(wire.SET_STRING), name, value, expires=expires)

    def get(self, name: bytes, *, as_int: bool = False) -> bytes:
        command = wire.GET_INT if as_int else wire.GET_STRING
        userid = self._request(command, wire.fnv1a32(name))
        if as_int:
            return wire.get_int(userid, name)
        return wire.get_string(userid, name)

    def ping(self) -> bytes:
        return wire.ping(self._request(wire.PING))

    def goodbye(self) -> bytes:
        return wire.goodbye(self._request(wire.GOODBYE))

    # --- replies ------------------------------------------------------------------------------

    def data_to_send(self) -> bytes:
        """The acks owed to the server's pushes, once."""
        out = bytes(self._out)
        self._out.clear()
        return out

    def _fail(self, reason: str) -> OpenClusterProtocolError:
        self._error = OpenClusterProtocolError(reason)
        return self._error

    def receive_data(self, data: bytes) -> list[Answer]:
        """The answers the bytes complete, oldest request first."""
        if self._error is not None:
            raise self._error
        decoder = self._decoder
        decoder.receive_data(data)
        answers: list[Answer] = []
        frames: list[tuple[int, int, int, bytes]] = []
        try:
            decoder.take(frames)
        except OpenClusterProtocolError as exc:
            self._error = exc
            raise
        for command, repcmd, userid, payload in frames:
            if repcmd == 0:
                self._push(command, userid, payload)
            else:
                answers.append(self._reply(command, repcmd, userid, payload))
        return answers

    def _push(self, command: int, userid: int, payload: bytes) -> None:
        try:
            if command == wire.SERVERLIST:
                self.servers = wire.decode_serverlist(payload)
            elif command == wire.HASHMASKS:
                self.mask, self.buckets = wire.decode_hashmasks(payload)
            else:
                name = wire.PROTOCOL_NAMES.get(command, str(command))
                raise self._fail(f"the server pushed {name}; only serverlist and hashmasks")
        except OpenClusterProtocolError as exc:
            self._error = exc
            raise
        # The 2011 client acknowledged both pushes with repcmd 100 (SERVERLIST).
        self._out += wire.ack(wire.SERVERLIST, userid)
        if command == wire.HASHMASKS:
            self._hashmasks_seen = True
            self.ready = self._hello_acked

    def _reply(self, reply: int, repcmd: int, userid: int, payload: bytes) -> Answer:
        if not self._pending:
            raise self._fail(f"a reply {reply} to {repcmd} with nothing outstanding")
        want_id, command, key_hash = self._pending[0]
        if repcmd != command or userid != want_id:
            raise self._fail(
                f"reply to command {repcmd} user id {userid} out of order: expected"
                f" command {command} user id {want_id}"
            )
        self._pending.popleft()
        try:
            answer = self._answer(command, reply, payload, key_hash)
        except OpenClusterProtocolError as exc:
            self._error = exc
            raise
        if command == wire.HELLO and reply == wire.ACK:
            self._hello_acked = True
            self.ready = self._hashmasks_seen
        return answer

    def _answer(self, command: int, reply: int, payload: bytes, key_hash: int) -> Answer:
        if reply == _DATA_FOR.get(command):
            if reply == wire.DATA_INT:
                _map, key, number = wire.decode_data_int(payload)
                value: int | bytes = number
            else:
                _map, key, value = wire.decode_data_str(payload)
            if key != key_hash:
                raise OpenClusterProtocolError(f"data for key hash {key:#x}, asked {key_hash:#x}")
            return Answer(command, reply, value)
        if reply not in _REPLIES:
            name = wire.PROTOCOL_NAMES.get(command, str(command))
            raise OpenClusterProtocolError(f"reply {reply} is no answer to {name}")
        if reply == wire.FAILINFO:
            code, text = wire.decode_failinfo(payload)
            return Answer(command, reply, code=code, text=text)
        if reply == wire.TRYELSEWHERE:
            return Answer(command, reply, text=wire.decode_tryelsewhere(payload))
        if reply == wire.UNKNOWN:
            # The original server sent no payload, the seed an i16 command: both are fine.
            if len(payload) not in (0, 2):
                raise OpenClusterProtocolError(f"unknown reply of {len(payload)} bytes")
        elif payload:
            raise OpenClusterProtocolError(f"reply {reply} with a {len(payload)}-byte payload")
        return Answer(command, reply)
