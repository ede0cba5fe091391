"""The table of front ends: every protocol the broker serves, registered here once.

The broker opens, counts, limits and stops each of them from this tuple
(:mod:`fqbroker.server.listeners`); the settings read their tables, and fqd its flags,
from it (it registers itself with :func:`fqbroker.settings.broker.register`);
/frontends.json, /metrics and the web UI list them from it. Adding a front end is a
package and one line in :data:`FRONT_ENDS`; the steps are written above it.
"""

from __future__ import annotations

from typing import Any

from fqbroker.frontends.figg import frontend as figg
from fqbroker.frontends.fq import frontend as fq
from fqbroker.frontends.fyrehose import frontend as fyrehose
from fqbroker.frontends.http import frontend as http
from fqbroker.frontends.kit.component import FrontEnd, preambles
from fqbroker.frontends.lumberjack import frontend as lumberjack
from fqbroker.frontends.opencluster import frontend as opencluster
from fqbroker.settings.broker import register

__all__ = ["FRONT_ENDS", "sniff"]

# Adding a front end:
# 1. a package under fqbroker/frontends/ whose frontend.py declares one FrontEnd
#    (fqbroker.frontends.kit.component): its name, how it is reached (Sniffed preambles
#    on the main port, or OwnPort/Datagrams with the address read from the settings, None
#    while not configured), open, which returns the protocol that takes the connection
#    over and calls closed(transport) on its host when it ends, and its settings table
#    (a settings.py beside it), flags, limits and auth. A model:
#    fqbroker/frontends/figg/frontend.py; a toy one registered in a test alone:
#    tests/frontends/kit/test_component.py;
# 2. one line below;
# 3. the names of its fuzz entries (its fuzz field), each a scenario in
#    bench/frontends.py (tests/server/test_frontends.py asks).
FRONT_ENDS: tuple[FrontEnd[Any], ...] = (
    fq.COMMAND,
    fq.DATA,
    http.HTTP,
    lumberjack.LUMBERJACK,
    figg.FIGG,
    fyrehose.FYREHOSE,
    opencluster.OPENCLUSTER,
)

_CLAIMS = preambles(FRONT_ENDS)
register(FRONT_ENDS)  # the settings' default table: theirs is read without naming one


def sniff(first4: bytes) -> FrontEnd[Any] | None:
    """The front end of the table a main-port connection opening with ``first4`` is
    for (docs/fq-protocol.md §1.2), or None: such a connection is closed."""
    return _CLAIMS.get(first4)
