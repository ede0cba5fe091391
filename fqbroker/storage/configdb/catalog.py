"""The broker's queues and bindings, kept in step with the config store (fqd_config.c).

Every change of a queue's or a binding's permanence goes through here, so what sqlite holds
is always what a restart should bring back: permanent queues with their attributes, and
permanent bindings into permanent queues (docs/fq-protocol.md §2.5, §3.2, §3.5).
"""

from __future__ import annotations

import dataclasses
import logging
from typing import TYPE_CHECKING

from fqbroker.core.bindflags import BIND_ILLEGAL, BindFlags
from fqbroker.core.budget import MemoryBudget
from fqbroker.core.loglines import LogLimiter
from fqbroker.core.queue import Queue
from fqbroker.core.queuespec import UNLIMITED_BYTES, QueueKind, QueueSpec
from fqbroker.core.router import Binding, Router
from fqbroker.errors import FqError, ProgramError, QueueError
from fqbroker.storage.configdb.state import ConfigStore, StoredBinding
from fqbroker.storage.segments.log import LogFormatError
from fqbroker.storage.store import DiskStore, open_disk_store

if TYPE_CHECKING:
    from fqbroker.settings.broker import Settings
    from fqbroker.storage.diskalarm import DiskAlarm

__all__ = ["Catalog"]

log = logging.getLogger(__name__)
# A full disk fails every publisher's every write: one line, then one each period at most,
# saying how many were held back.
WRITE_FAILED_LINES, WRITE_FAILED_SECONDS = 1, 10.0


class Catalog:
    def __init__(
        self,
        settings: Settings,
        router: Router,
        config: ConfigStore,
        alarm: DiskAlarm | None = None,
    ) -> None:
        self.settings = settings
        self.alarm = alarm  # disk stores refuse writes while it is raised
        self.router = router
        self.config = config
        self.queues: dict[bytes, Queue] = {}
        # Disk stores with appended, unwritten messages; publishers flush them.
        self.dirty: set[DiskStore] = set()
        # What memory queues and reads in flight hold, against the broker's limit.
        limit = settings.memory_budget if settings.memory_budget > 0 else UNLIMITED_BYTES
        self.budget = MemoryBudget(limit, *settings.reservation_caps(limit))
        self._write_failed = LogLimiter(log, WRITE_FAILED_LINES, WRITE_FAILED_SECONDS)

    # --- start-up -------------------------------------------------------------------------

    def restore(self) -> tuple[int, int, int]:
        """Recreate permanent queues, then their bindings; (exchanges, queues, bindings)."""
        for row in self.config.queues():
            try:
                spec = row.spec()
                self.queues[spec.name] = self._make_queue(spec)
            except FqError as exc:
                log.error("cannot restore queue %r: %s", row.name, exc)
        restored = 0
        for b in self.config.bindings():
            queue = self.queues.get(b.queue)
            if queue is None:
                log.warning(
                    "skipping binding %r on %r: no queue %r", b.program, b.exchange, b.queue
                )
                continue
            flags = BindFlags.PERM | (BindFlags.PEER if b.peermode else 0)
            try:
                self.router.bind(b.exchange, b.program, queue, flags)
            except ProgramError as exc:
                log.error("cannot restore binding %r on %r: %s", b.program, b.exchange, exc)
                continue
            restored += 1
        return len(self.router.exchanges), len(self.queues), restored

    def _make_queue(self, spec: QueueSpec) -> Queue:
        if spec.backlog is None:
            spec = dataclasses.replace(spec, backlog=self.settings.default_backlog)
        if spec.kind is QueueKind.DISK:
            try:
                store = open_disk_store(
                    self.settings, spec.name, spec.fsync, self.dirty, self.budget, self.alarm
                )
            except (OSError, LogFormatError) as exc:
                # One line, and the client is told: no traceback for a directory we cannot
                # read (docs/disk-format.md, "Versioning"); its config row stays.
                log.error("disk queue %r: %s", spec.name, exc)
                raise QueueError("initialization of disk queue failed") from exc
            return Queue(spec, store)
        return Queue(spec, budget=self.budget, default_bytes=self.settings.backlog_bytes)

    # --- queues ---------------------------------------------------------------------------

    def attach(self, spec: QueueSpec, client: object) -> Queue:
        """Find or create the queue a client asked for and add the client
        (docs/fq-protocol.md §3.2)."""
        queue = self.queues.get(spec.name)
        if queue is None:
            queue = self._make_queue(spec)
            self.queues[spec.name] = queue
            if queue.permanent:
                self.config.save_queue(queue.spec)
        else:
            queue.check_attach(spec)
            if spec.permanent is not None and spec.permanent != queue.permanent:
                self.set_permanent(queue, spec.permanent)
        try:
            queue.attach(client)
        except QueueError:
            self.forget_if_unused(queue)
            raise
        return queue

    def create(self, spec: QueueSpec) -> Queue:
        """Make a queue no client asked for (the admin API); QueueError if it exists.

        A permanent one is stored as an attach would store it. A transient one lives until
        it is removed, or until a client that attached to it leaves
        (docs/fq-protocol.md §3.5)."""
        if spec.name in self.queues:
            raise QueueError(f"queue {spec.name.decode(errors='replace')!r} exists")
        queue = self._make_queue(spec)
        self.queues[spec.name] = queue
        if queue.permanent:
            self.config.save_queue(queue.spec)
        return queue

    def remove(self, queue: Queue) -> None:
        """Forget a queue, its stored rows, its bindings and its messages, as a transient
        queue goes with its last client; with clients still attached it goes when they
        leave (the caller closes them)."""
        if queue.permanent:
            self.set_permanent(queue, False)
        self.forget_if_unused(queue)

    def set_permanent(self, queue: Queue, permanent: bool) -> None:
        queue.permanent = permanent
        if permanent:
            self.config.save_queue(queue.spec)
            for binding in self.router.bindings():
                if binding.queue is queue and binding.permanent:
                    self.config.save_binding(self._stored(binding))
        else:
            self.config.delete_queue(queue.name)

    def detach(self, queue: Queue, client: object) -> None:
        queue.detach(client)
        self.forget_if_unused(queue)

    def forget_if_unused(self, queue: Queue) -> None:
        # A transient queue goes with its last client, bindings and messages too
        # (docs/fq-protocol.md §3.5).
        if queue.clients or queue.permanent:
            return
        if self.queues.get(queue.name) is queue:
            del self.queues[queue.name]
        self.router.unbind_queue(queue)
        queue.close(destroy=True)

    def flush_dirty(self) -> tuple[list[DiskStore], int, int]:
        """Write every disk store's appended messages: (stores written, messages lost, the
        errno of the first failed write or 0), the errno telling a full disk from others.

        Every publisher calls this before it next awaits, so what it finds is its own:
        its :class:`~fqbroker.core.publisher.Publisher` counts the lost messages as drops,
        in the aggregate and for itself, so status shows them to any fq client.
        """
        written: list[DiskStore] = []
        lost = error = 0
        while self.dirty:
            store = self.dirty.pop()
            pending = store.pending
            try:
                store.flush()
            except OSError as exc:
                self._write_failed.log(
                    logging.ERROR,
                    "write",
                    "disk queue write failed in %s, %d messages dropped: %s",
                    store.log.directory,
                    pending,
                    exc,
                )
                lost += pending
                error = error or exc.errno or 0
            else:
                written.append(store)
        return written, lost, error

    def close(self) -> None:
        for queue in self.queues.values():
            queue.close(destroy=not queue.permanent)
        self.config.close()

    # --- bindings -------------------------------------------------------------------------

    def bind(self, exchange: bytes, program: bytes, queue: Queue, flags: int) -> int:
        try:
            binding = self.router.bind(exchange, program, queue, flags)
        except ProgramError as exc:
            log.debug("bind of %r on %r refused: %s", program, exchange, exc)
            return BIND_ILLEGAL
        if flags & BindFlags.PERM == BindFlags.PERM:
            if queue.permanent and not self.config.save_binding(self._stored(binding)):
                log.warning("binding %d could not be persisted", binding.route_id)
        elif flags & BindFlags.PERM == BindFlags.TRANS:
            self.config.delete_binding(self._stored(binding))
        return binding.route_id

    def unbind(self, exchange: bytes, route_id: int, queue: Queue) -> bool:
        binding = self.router.unbind(exchange, route_id, queue)
        if binding is None:
            return False
        if binding.permanent:
            self.config.delete_binding(self._stored(binding))
        return True

    @staticmethod
    def _stored(binding: Binding) -> StoredBinding:
        queue = binding.queue
        assert isinstance(queue, Queue)
        return StoredBinding(binding.exchange.name, queue.name, binding.peer, binding.program.text)
