"""Peering: keep the links to upstream brokers in step with the configuration
(fqd_peer.c, docs/fq-protocol.md §5; the links themselves: :mod:`fqbroker.peering.link`).

Every broker runs a :class:`Peering`, which reads the wanted rows again every
``peer_poll_seconds``; a broker with none never imports the links' code (its classes and
the peer client's are RSS of every idle broker otherwise, tests/test_idle_imports.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING

from fqbroker.settings.broker import Upstream

if TYPE_CHECKING:
    from fqbroker.core.publisher import Publisher
    from fqbroker.peering.link import PeerAddress, PeerLink, RecentIds
    from fqbroker.settings.broker import Settings

__all__ = ["Peering"]

log = logging.getLogger(__name__)


class Peering:
    """Every upstream this broker pulls from, kept in step with the configuration."""

    def __init__(
        self,
        settings: Settings,
        node_id: bytes,
        stored_upstreams: Callable[[], Iterable[Upstream]],
        make_publisher: Callable[[], Publisher],
    ) -> None:
        """``stored_upstreams``: the rows of the sqlite ``upstream`` table, read again at
        each poll; ``make_publisher``: a publisher into our router, one per link."""
        self.settings = settings
        self.node_id = node_id
        self._stored_upstreams = stored_upstreams
        self._make_publisher = make_publisher
        self.links: dict[PeerAddress, PeerLink] = {}
        self.dedupe: RecentIds | None = None
        if settings.peer_dedupe > 0:
            from fqbroker.peering.link import RecentIds

            self.dedupe = RecentIds(settings.peer_dedupe)
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self.refresh()
        self._task = asyncio.get_running_loop().create_task(self._poll())

    def wanted_rows(self) -> list[Upstream]:
        return [*self.settings.upstream, *self._stored_upstreams()]

    def refresh(self) -> list[PeerAddress]:
        """Apply the configuration now; returns the links that are no longer wanted."""
        rows = self.wanted_rows()
        if not rows and not self.links:
            return []  # nothing wanted, nothing to close: the links' code stays unloaded
        from fqbroker.peering.link import PeerLink, split_rows

        wanted = split_rows(rows)
        for address, bindings in wanted.items():
            link = self.links.get(address)
            if link is None:
                link = PeerLink(self.node_id, self._make_publisher(), address, self.dedupe)
                self.links[address] = link
                link.start()
                log.info("peer %s: added", address)
            link.want(bindings)
        return [address for address in self.links if address not in wanted]

    async def reconcile(self) -> None:
        """Apply the configuration now, closing the links no row wants any more (what each
        poll does; the admin API calls it after changing a row)."""
        for address in self.refresh():
            link = self.links.pop(address, None)
            if link is not None:
                log.info("peer %s: removed", address)
                await link.close(unbind=True)

    async def _poll(self) -> None:
        interval = self.settings.peer_poll_seconds
        while True:
            await asyncio.sleep(interval)
            try:
                await self.reconcile()
            except Exception:
                # A locked or damaged database must not end peering: keep what runs.
                log.exception("reading the upstream configuration failed")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        links, self.links = list(self.links.values()), {}
        for link in links:
            await link.close(unbind=False)
