"""The table of front ends: every protocol the broker serves, registered here once.

The broker opens, counts, limits and stops each of them from this tuple
(:mod:`fqbroker.server.listeners`); stats, metrics and the web UI list them from it. A new
front end is a module declaring one :class:`~fqbroker.server.frontend.FrontEnd` (see
:mod:`fqbroker.frontends.http.frontend` for one on the main port, and tests/test_frontends.py
for TCP, TLS and UDP ones on ports of their own) plus one line below.
"""

from __future__ import annotations

from typing import Any

from fqbroker.frontends.fq import frontend as fq
from fqbroker.frontends.http import frontend as http
from fqbroker.server.frontend import FrontEnd, preambles

__all__ = ["FRONT_ENDS", "sniff"]

FRONT_ENDS: tuple[FrontEnd[Any], ...] = (
    fq.COMMAND,
    fq.DATA,
    http.HTTP,
)

_CLAIMS = preambles(FRONT_ENDS)


def sniff(first4: bytes) -> FrontEnd[Any] | None:
    """The front end of the table a main-port connection opening with ``first4`` is
    for (§1.2), or None: such a connection is closed."""
    return _CLAIMS.get(first4)
