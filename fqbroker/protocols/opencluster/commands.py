"""The OpenCluster binary protocol, Nov-2011 generation: its frames and commands
(:mod:`~fqbroker.protocols.opencluster.wire` encodes and decodes them).

Every frame is a 12-byte header (i16 command or reply id, i16 ``repcmd``, i32 user id, i32
payload length) and a payload; all integers are signed big-endian. docs/opencluster-protocol.md
has every frame's payload, from the 2011 C server and client where the seed leaves it out.
Hashes are the client's (FNV-1a, ``wire.fnv1a32``). The command ids are what the seed's
table names them; :data:`NEVER_SPECIFIED` are those no version of the protocol gives a payload.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

__all__ = [
    "ACK",
    "CAPABILITIES",
    "DATA_INT",
    "DATA_STR",
    "FAIL",
    "FAILINFO",
    "GET_INT",
    "GET_LONG",
    "GET_STRING",
    "GET_TYPE",
    "GOODBYE",
    "HASHMASK",
    "HASHMASKS",
    "HEADER_SIZE",
    "HELLO",
    "LOADLEVEL",
    "LOCK",
    "NEVER_SPECIFIED",
    "NEWSERVER",
    "PING",
    "PROTOCOL_NAMES",
    "SERVERHELLO",
    "SERVERLIST",
    "SET_INT",
    "SET_LONG",
    "SET_STRING",
    "SHUTTINGDOWN",
    "TRYELSEWHERE",
    "UNKNOWN",
    "UNLOCK",
    "Frame",
    "SetValue",
]

HEADER_SIZE: Final = 12
ACK, FAIL, FAILINFO, TRYELSEWHERE, UNKNOWN = 1, 2, 3, 4, 9
HELLO, CAPABILITIES, SHUTTINGDOWN, GOODBYE, PING, SERVERHELLO = 10, 11, 15, 20, 30, 50
SERVERLIST, HASHMASKS, HASHMASK, NEWSERVER, LOADLEVEL = 100, 110, 120, 130, 200
LOCK, UNLOCK = 1000, 1010
SET_INT, SET_LONG, SET_STRING = 2000, 2010, 2020
GET_INT, DATA_INT, GET_LONG, GET_STRING, DATA_STR, GET_TYPE = 2100, 2105, 2110, 2120, 2125, 2200

# Named in the seed's command table, but given a payload by no version of the protocol.
NEVER_SPECIFIED: Final = frozenset(
    {NEWSERVER, LOADLEVEL, LOCK, UNLOCK, SET_LONG, GET_LONG, GET_TYPE}
)

PROTOCOL_NAMES: Final = {
    ACK: "ack",
    FAIL: "fail",
    FAILINFO: "failinfo",
    TRYELSEWHERE: "tryelsewhere",
    UNKNOWN: "unknown",
    HELLO: "hello",
    CAPABILITIES: "capabilities",
    SHUTTINGDOWN: "shuttingdown",
    GOODBYE: "goodbye",
    PING: "ping",
    SERVERHELLO: "serverhello",
    SERVERLIST: "serverlist",
    HASHMASKS: "hashmasks",
    HASHMASK: "hashmask",
    NEWSERVER: "newserver",
    LOADLEVEL: "loadlevel",
    LOCK: "lock",
    UNLOCK: "unlock",
    SET_INT: "set_int",
    SET_LONG: "set_long",
    SET_STRING: "set_string",
    GET_INT: "get_int",
    DATA_INT: "data_int",
    GET_LONG: "get_long",
    GET_STRING: "get_string",
    DATA_STR: "data_str",
    GET_TYPE: "get_type",
}


@dataclass(frozen=True, slots=True)
class Frame:
    """One frame: a command (``repcmd`` 0) or a reply to ``repcmd``."""

    command: int
    repcmd: int
    userid: int
    payload: bytes


@dataclass(frozen=True, slots=True)
class SetValue:
    """A set_int (``value`` an int) or set_string (``value`` bytes) request."""

    map_hash: int
    key_hash: int
    expires: int
    full_wait: int
    name: bytes
    value: int | bytes
