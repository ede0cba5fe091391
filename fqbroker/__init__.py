"""fqbroker: a Python (asyncio) message broker, wire-compatible with fq."""

from __future__ import annotations

from .client import Client
from .message import Message
from .server import Broker
from .version import FQ_COMPAT_VERSION, __version__

__all__ = ["FQ_COMPAT_VERSION", "Broker", "Client", "Message", "__version__"]
