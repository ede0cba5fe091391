"""Byte-exact fq frames, transcribed from the protocol reference (docs/fq-protocol.md §1).

Each entry pairs a frame with the hex of its bytes on the wire. Spaces in the hex only
group fields as the reference's tables do.
"""

from __future__ import annotations

from fqbroker.core.message import Message
from fqbroker.protocols.fq import wire

KEY = bytes(range(127))

# The status reply's keys in fq's order (docs/fq-protocol.md §1.6).
STATUS_KEYS = [
    "dropped_in",
    "no_exchange",
    "no_route",
    "routed",
    "dropped",
    "size_dropped",
    "msgs_in",
    "msgs_out",
    "octets_in",
    "octets_out",
]
# fqbroker's announcements of publisher confirms and de-duplication follow them, last.
BROKER_STATUS_KEYS = [*STATUS_KEYS, wire.CONFIRM_STATUS_KEY, wire.DEDUP_STATUS_KEY]


def h(text: str) -> bytes:
    return bytes.fromhex(text.replace(" ", ""))


# Frames a client sends on the command channel (after the 4-byte magic).
CLIENT_COMMANDS: list[tuple[str, wire.Frame, bytes]] = [
    (
        # fq_rcvr -u tuser/tq/mem:public -P secret, as observed on the wire
        # (docs/fq-protocol.md §1.3).
        "auth_fq_rcvr",
        wire.AuthPlain(b"tuser", b"tq\x00mem:public", b"secret"),
        h("aaaa 0000 0005 7475736572 000d 7471 00 6d656d3a7075626c6963 0006 736563726574"),
    ),
    ("auth_empty", wire.AuthPlain(b"", b"", b""), h("aaaa 0000 0000 0000 0000")),
    ("heartbeat", wire.Heartbeat(), h("bea7")),
    ("heartbeat_request", wire.HeartbeatRequest(200), h("4848 00c8")),
    ("heartbeat_off", wire.HeartbeatRequest(0), h("4848 0000")),
    ("status_request", wire.StatusRequest(), h("c7a7")),
    (
        "bind_trans",
        wire.BindRequest(0x0100, b"maryland", b'prefix:"test."'),
        h("b170 0100 0008 6d6172796c616e64 000e 7072656669783a22746573742e22"),
    ),
    (
        "bind_perm_empty",
        wire.BindRequest(0x0110, b"", b"prefix:"),
        h("b170 0110 0000 0007") + b"prefix:",
    ),
    ("unbind", wire.UnbindRequest(7, b"ex"), h("071b 00000007 0002 6578")),
    ("dedup", wire.DedupRequest(), h("c0f4")),
]

# Frames the broker sends on the command channel.
SERVER_REPLIES: list[tuple[str, wire.Frame, bytes]] = [
    ("auth_response", wire.AuthResponse(KEY), h("aa00 007f") + KEY),
    ("heartbeat", wire.Heartbeat(), h("bea7")),
    ("bind_response", wire.BindResponse(1), h("b171 00000001")),
    ("bind_illegal", wire.BindResponse(0xFFFFFFFF), h("b171 ffffffff")),
    ("unbind_response", wire.UnbindResponse(3), h("171b 00000003")),
    ("unbind_illegal", wire.UnbindResponse(0xFFFFFFFF), h("171b ffffffff")),
    ("dedup_on", wire.DedupOn(), h("c0f5")),
    (
        "status_no_data",
        wire.Status((("dropped_in", 4),)),
        h("57a7 000a") + b"dropped_in" + h("00000004 0000"),
    ),
    (
        "error",
        wire.ErrorReply("client heartbeat failed"),
        h("eeee 0017") + b"client heartbeat failed",
    ),
]

# Every error text fqd can send (docs/fq-protocol.md §1.8), exactly.
ERROR_TEXTS = [
    "auth command expected",
    "auth method read failed",
    "unsupported auth method",
    "user name is too long",
    "queue detail is too long",
    "queue name is too long",
    "pass field is too long",
    "invalid queue type: ",
    "invalid queue type: bogus",
    "invalid queue param:  drop",
    "memory exhaustion",
    "requested queue is private and in use\n",
    "requested type disk, queue is mem",
    "requested private, queue is public",
    "requested public, queue is private",
    "request block, queue is drop",
    "request drop, queue is block",
    "initialization of disk queue failed",
    "can't generate random key",
    "can't add you to queue",
    "client heartbeat failed",
]

# docs/fq-protocol.md §1.10: "ex", "a.b", id 00..0f, sender "carol", hops 10.254.254.1 and
# 127.0.0.1, "hello".
PEER_MESSAGE = Message(
    b"ex",
    b"a.b",
    b"hello",
    msgid=bytes(range(16)),
    sender=b"carol",
    hops=h("0afefe01 7f000001"),
)
PEER_MESSAGE_BYTES = h(
    "02 6578 03 612e62 000102030405060708090a0b0c0d0e0f 05 6361726f6c"
    " 02 0afefe01 7f000001 00000005 68656c6c6f"
)
PUBLISH_MESSAGE_BYTES = h("02 6578 03 612e62 000102030405060708090a0b0c0d0e0f 00000005 68656c6c6f")

SNIFF = [
    (h("cc50cafe"), wire.Mode.CMD),
    (h("cc50face"), wire.Mode.DATA),
    (h("cc50feed"), wire.Mode.PEER),
    (h("cc50fade"), wire.Mode.OLD_PEER),
    (b"GET ", "http"),
    (b"PUT ", "http"),
    (b"POST", "http"),
    (b"HEAD", "http"),
    (b"OPTI", None),
    (b"get ", None),
    (h("00000000"), None),
    (h("cafecc50"), None),
]
