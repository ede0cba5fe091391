"""fqbroker: a Python (asyncio) message broker, wire-compatible with fq."""

from __future__ import annotations

__version__ = "0.1.0"
# What /stats.json reports as "version": the fq release whose behaviour we follow.
FQ_COMPAT_VERSION = "0.13.12"

from .client import Client
from .message import Message
from .server import Broker

__all__ = ["FQ_COMPAT_VERSION", "Broker", "Client", "Message", "__version__"]
