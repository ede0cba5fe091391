"""The ``[lumberjack]`` table: the Lumberjack/Beats listener's settings (docs/lumberjack.md).

Declared here, beside the listener, and read by the shared parser
(:mod:`fqbroker.settings.section`):
the front end (:mod:`.frontend`) names this class as its section.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from fqbroker.settings.section import Section, setting

__all__ = ["Lumberjack"]

_LISTEN = """\
Where log shippers (Filebeat and the other Beats, logstash-forwarder, pylogbeat) connect:
"HOST:PORT", "[IPV6]:PORT", or "PORT" on the address of `bind`; 5044 is the Beats
convention, 0 picks a free port. Empty: off. `fqd --lumberjack ADDR:PORT` sets it too."""
_ROUTE = """\
The route template: text and {a|b|'constant'} fallback chains over the event's fields
(dotted paths into the JSON; a v1 event's pairs). Empty: the default,
{@metadata.beat|event.dataset|fields.type|type|'lumberjack'}. Cut to 127 bytes."""
_LIMITS = """\
Limits; exceeding one closes that connection (fq_bad_input_total{frontend="lumberjack"}).
Events a W frame may announce (an operator's cap: any u32 by default, as Logstash; the
memory budget bounds what a window holds); bytes of one JSON event, D frame or C frame as
sent; bytes inflated out of one C frame and those nested in it (a zip bomb stops here);
pairs in one v1 D frame."""
_TLS = "TLS: a PEM certificate chain, and its key (unset: the key is in the certificate's file)."
_ACK_IDLE = """\
Input idle this long with events unacknowledged: acknowledge them (a shipper that sent
one window and streams, such as lumberjack-protocol, would wait for the window otherwise)."""
_KEEPALIVE = """\
While the broker holds a connection back (a full block-policy queue, the memory budget,
the disk alarm, an fsync its ACK waits for), a v2 shipper gets ACK(0) this often: "still
working" (v1 has no keepalive)."""

_ANONYMOUS = """\
Under auth = "password" clients log in with TLS client certificates (tls_cert here, the
broker's tls_client_ca; the subject CN is the user). true: serve anyone who reaches the
port, no login, every right (fqd refuses to start otherwise when it cannot log them in)."""


@dataclass(frozen=True, slots=True)
class Lumberjack(Section):
    """The ``[lumberjack]`` table: the Lumberjack/Beats listener (docs/lumberjack.md).

    Off while ``listen`` is empty. The limits bear the names of the protocol's ``Limits``
    (fqbroker/protocols/lumberjack/wire.py) and its defaults; exceeding one closes that
    connection only.
    """

    NAME = "lumberjack"
    TITLE = "The Lumberjack/Beats listener (docs/lumberjack.md)"
    PORT = 5044  # the Beats convention, for a ``listen`` that names a host only

    listen: str = setting(
        "", "HOST:PORT, [V6]:PORT or PORT (on `bind`); empty: off", comment=_LISTEN
    )
    exchange: str = setting("logging", "the exchange every event is published to")
    route: str = setting("", "the route template; empty: the default", comment=_ROUTE)
    max_window: int = setting(
        0xFFFFFFFF, "events one W frame may announce (default: any)", comment=_LIMITS,
        positive=True,
    )  # fmt: skip
    max_frame: int = setting(
        16 << 20, "bytes of a JSON event, D frame or C frame as sent", comment="", positive=True
    )
    max_decompressed: int = setting(
        64 << 20, "bytes inflated out of one C frame", comment="", positive=True
    )
    max_fields: int = setting(1024, "pairs in one v1 D frame", comment="", positive=True)
    tls_cert: Path | None = setting(  # noqa: RUF009 (a field, as dataclasses.field)
        None, "PEM certificate chain: TLS when set", comment=_TLS,
        example="/etc/fqd/lumberjack.crt",
    )  # fmt: skip
    tls_key: Path | None = setting(  # noqa: RUF009 (a field, as dataclasses.field)
        None, "PEM private key; unset: in tls_cert's file", comment="",
        example="/etc/fqd/lumberjack.key",
    )  # fmt: skip
    anonymous: bool = setting(
        False, 'under auth = "password": no login, anyone who reaches it', comment=_ANONYMOUS
    )
    ack_idle_ms: float = setting(
        100.0, "input idle this long with events unacknowledged: ACK them", comment=_ACK_IDLE,
        positive=True,
    )  # fmt: skip
    keepalive_seconds: float = setting(
        1.0, "ACK(0) to a held-back v2 shipper this often", comment=_KEEPALIVE, positive=True
    )

    def check(self) -> None:
        if not 0 < len(self.exchange.encode()) <= 127:
            raise ValueError("lumberjack exchange must be 1 to 127 bytes")
        Section.check(self)
