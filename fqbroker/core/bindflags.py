"""What a bind request's flags mean, and the route id that says a bind failed (fq.h,
docs/fq-protocol.md §2.5).

They are binding semantics, so they belong to the routing core: the router and the
catalog of permanent bindings read them, and every front end that binds (fq's command
channel today) answers with them.
"""

from __future__ import annotations

from typing import Final

__all__ = ["BIND_ILLEGAL", "BindFlags"]

# The route id of a bind that failed; ids run 1 .. 0xfffffffe, then wrap.
BIND_ILLEGAL: Final = 0xFFFFFFFF


class BindFlags:
    """Bind flag bits (``FQ_BIND_*``); PERM and TRANS share bit 0x0100."""

    PEER: Final = 0x0001
    PERM: Final = 0x0110
    TRANS: Final = 0x0100
