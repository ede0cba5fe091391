"""fqbroker: a Python (asyncio) message broker, wire-compatible with fq."""

from __future__ import annotations

from typing import TYPE_CHECKING

# First: which implementation of the hot modules runs is settled before any of them is
# imported (fqbroker/accel.py; FQBROKER_PURE=1 forces pure Python).
from fqbroker.accel import ACCELERATED
from fqbroker.version import FQ_COMPAT_VERSION, __version__

if TYPE_CHECKING:
    from fqbroker.clients.fq.client import Client
    from fqbroker.core.message import Message
    from fqbroker.server.broker import Broker

__all__ = ["ACCELERATED", "FQ_COMPAT_VERSION", "Broker", "Client", "Message", "__version__"]

# Imported when first asked for: ``fqd`` and the tools each load only what they use, and
# a broker does not carry the client's modules.
_LAZY = {
    "Broker": ".server.broker",
    "Client": ".clients.fq.client",
    "Message": ".core.message",
}


def __getattr__(name: str) -> object:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name], __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
