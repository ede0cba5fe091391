"""HTTP on the broker's port (fqd_http.c). Placeholder until the HTTP front end lands."""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .server import Broker

__all__ = ["serve"]


async def serve(
    broker: Broker, first4: bytes, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
) -> None:
    writer.close()
