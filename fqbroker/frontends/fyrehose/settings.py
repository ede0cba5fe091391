"""The ``[fyrehose]`` table: the fyrehose backbone's settings (docs/fyrehose.md).

Declared here, beside the listener, and read by the shared parser
(:mod:`fqbroker.settings.section`).
"""

from __future__ import annotations

from dataclasses import dataclass

from fqbroker.settings.section import Section, setting

__all__ = ["Fyrehose"]

_LISTEN = """\
The UDP address subscribers and publishers send to: "HOST:PORT" or "PORT" on the address of
`bind`; 0 picks a free port. IPv4 only. Empty: off. `fqd --fyrehose ADDR:PORT` sets it too.
The protocol has no authentication: bind it to loopback or a private network."""
_EXCHANGE = """\
The fq exchange the stream is: a PUSH is published there with `route`, and every message
on the exchange (PUSHed, or published by fq clients and peers) gets the next sequence
number and goes to every subscriber."""
_WINDOW = """\
The retained window, in memory: the last window_messages messages, at most window_bytes of
data. REQUESTs are answered from it; older ranges are FORWARDed to a journaling subscriber."""
_REQUEST_LIMIT = """\
Messages one REQUEST may ask for (a 19-byte REQUEST from a spoofed address must not buy
unbounded traffic toward it); subscribers ask again for the rest."""
_ALLOW_REMOTE = """\
fyrehose is UDP and cannot tell who sends a datagram: fqd refuses to start it on an address
beyond loopback unless this is true (then keep the port on a network you trust)."""
_ELSEWHERE = """\
A KEEPALIVE or REQUEST names the address to send to. false: only an address on the host
the datagram came from (any port) is served, so that a forged 19-byte REQUEST cannot aim
thousands of DELIVERs at a third party; true: any address, as the protocol's text has it."""
_ANONYMOUS = """\
fyrehose carries no credentials: under auth = "password" fqd refuses to start it unless
this is true, saying that anyone who reaches the port may publish and subscribe."""
_MAX_SUBSCRIBERS = (
    "Addresses subscribed at once; past it a KEEPALIVE is answered but not subscribed."
)


@dataclass(frozen=True, slots=True)
class Fyrehose(Section):
    """The ``[fyrehose]`` table: the fyrehose backbone's UDP listener (docs/fyrehose.md).

    Off while ``listen`` is None (or empty in the TOML file). Every message on ``exchange``
    gets the next sequence number and goes to every subscriber; the last
    ``window_messages`` (at most ``window_bytes`` of data) are kept in memory to answer
    REQUESTs, at most ``request_limit`` messages per REQUEST.
    """

    NAME = "fyrehose"
    TITLE = "The fyrehose backbone: sequenced UDP pub/sub (docs/fyrehose.md)"
    PORT = 2323  # the fyrehose seed's example port, for a ``listen`` naming a host only

    listen: str | None = setting(
        None, "UDP HOST:PORT or PORT (on `bind`), IPv4 only; empty: off", comment=_LISTEN
    )
    exchange: str = setting("fyrehose", "the fq exchange the stream is", comment=_EXCHANGE)
    route: str = setting("fyrehose", "the route PUSHed messages are published with", comment="")
    window_messages: int = setting(
        65536, "messages kept in memory to answer REQUESTs", comment=_WINDOW, positive=True
    )
    window_bytes: int = setting(
        32 << 20, "and at most this much of their data", comment="", positive=True
    )
    request_limit: int = setting(
        4096, "messages one REQUEST may ask for", comment=_REQUEST_LIMIT, positive=True
    )
    max_subscribers: int = setting(
        1024, "past it, KEEPALIVEs are answered but not subscribed", comment=_MAX_SUBSCRIBERS,
        positive=True,
    )  # fmt: skip
    allow_remote: bool = setting(
        False, "may listen beyond loopback (no authentication)", comment=_ALLOW_REMOTE
    )
    send_elsewhere: bool = setting(
        False, "serve KEEPALIVEs and REQUESTs naming another host", comment=_ELSEWHERE
    )
    anonymous: bool = setting(
        False, 'under auth = "password": serve anyone who reaches it', comment=_ANONYMOUS
    )

    def check(self) -> None:
        for name in ("exchange", "route"):
            if not 0 < len(getattr(self, name).encode()) <= 127:
                raise ValueError(f"fyrehose {name} must be a string of 1 to 127 bytes")
        if self.listen:
            host, _ = self.address("127.0.0.1") or ("", 0)
            if host.startswith("[") or ":" in host:
                raise ValueError(f"fyrehose listen {self.listen!r}: the protocol is IPv4 only")
        Section.check(self)
