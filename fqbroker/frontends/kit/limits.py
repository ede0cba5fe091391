"""What the network may cost the broker, and how each refusal is told (docs/limits.md).

fqd has no limits of its own: anyone who can connect can hold any number of connections,
create permanent disk queues (each holding a descriptor for good), and have every bad
input logged at length. This module holds the broker's answers: :class:`Limits`,
:class:`LogLimiter` and :func:`install_exception_handler`. Everything here is plain
bookkeeping: the server and the sessions call it, and it never touches a socket.
"""

from __future__ import annotations

import asyncio
import logging
import resource
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fqbroker.core.loglines import LogLimiter
from fqbroker.core.queuespec import QueueKind, QueueSpec
from fqbroker.errors import FqError, QueueError

if TYPE_CHECKING:
    from fqbroker.core.exchange import Binding
    from fqbroker.core.queue import Queue
    from fqbroker.core.router import Router
    from fqbroker.core.targets import Target
    from fqbroker.settings.broker import Settings

__all__ = [
    "DISK_QUEUE_RATE_TEXT",
    "QUEUES_PER_USER_TEXT",
    "Limits",
    "LogLimiter",
    "RateBucket",
    "connection_limit",
    "install_exception_handler",
    "raised_in_package",
]

log = logging.getLogger(__name__)

# Error-frame texts, lowercase and without names as fq's own (docs/limits.md).
QUEUES_PER_USER_TEXT = "too many queues for this user"
DISK_QUEUE_RATE_TEXT = "disk queue creation rate exceeded, try again later"

# The whole package (this module is in fqbroker/frontends/kit/): a bug in any of its
# modules is ours.
PACKAGE_DIR = str(Path(__file__).resolve().parents[2])


class RateBucket:
    """A token bucket: ``rate`` events a second on average, ``burst`` at once; 0: no limit."""

    def __init__(
        self, rate: float, burst: float, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.rate = rate
        self.burst = max(1.0, burst)
        self._clock = clock
        self._tokens = self.burst
        self._when = clock()

    def take(self) -> bool:
        if self.rate <= 0:
            return True
        now = self._clock()
        self._tokens = min(self.burst, self._tokens + (now - self._when) * self.rate)
        self._when = now
        if self._tokens < 1.0:
            return False
        self._tokens -= 1.0
        return True


def connection_limit(setting: int) -> int:
    """The broker-wide connection limit: ``setting``, or when 0 one from RLIMIT_NOFILE.

    Every connection is a descriptor; queue files, sqlite, peers and the listening
    socket need theirs too, so an eighth of the limit (at least 64) stays for them.
    """
    if setting > 0:
        return setting
    soft, _hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        soft = 1 << 20
    return max(16, soft - max(64, soft // 8))


class Limits:
    """One broker's limits, and the counters of what they refused.

    It holds the counters of bad input (by front end) and of refusals (by reason), the
    connection accounting (per source address and in total), the queues each user created
    that outlive a connection, the bindings made per queue and per user, and the rate at
    which disk queues are created.
    """

    def __init__(self, settings: Settings, queues: dict[bytes, Queue]) -> None:
        self.settings = settings
        self.queues = queues
        self.max_connections = connection_limit(settings.max_connections)
        self.max_per_address = settings.max_connections_per_address
        # Closes for bad input, by front end: preamble, command, data, http, tls, internal.
        self.bad_input: Counter[str] = Counter()
        # Refused work, by reason: connections, connections_per_address, queues_per_user,
        # disk_queue_rate, descriptors.
        self.refused: Counter[str] = Counter()
        self.log = LogLimiter(log, settings.log_lines_per_second)
        self.accept_log = LogLimiter(log, 1, 60.0)
        self.connections = 0
        self._per_address: dict[str, int] = {}
        self._owned: dict[bytes, list[Queue]] = {}  # the counted queues each user created
        self._charged = 0  # entries in _owned since the last sweep
        # The bindings made through fq's BIND and the admin API, per user and per queue
        # (by id: a queue that goes takes its bindings along, so its list only holds gone
        # ones, dropped as for _owned).
        self._user_bindings: dict[bytes, list[Binding]] = {}
        self._queue_bindings: dict[int, list[Binding]] = {}
        self._bindings_charged = 0  # since the last sweep
        self._bindings_kept = 0  # listed after the last sweep
        self._disk_rate = RateBucket(
            settings.disk_queues_per_second, settings.disk_queues_per_second
        )

    # --- bad input and refusals -----------------------------------------------------------

    def bad(self, kind: str, msg: str, *args: object) -> None:
        """A connection is closed for bad input: count it, and say so in one line at most."""
        self.bad_input[kind] += 1
        self.log.log(logging.INFO, kind, msg, *args)

    def bug(self, exc: BaseException, where: str) -> None:
        """An unexpected exception ended a connection or task: one ERROR line naming it
        and the place it was raised; the traceback at DEBUG only (docs/limits.md)."""
        self.bad_input["internal"] += 1
        self.log.log(
            logging.ERROR,
            "internal",
            "unexpected %s at %s: %s (%s; traceback at debug level)",
            type(exc).__name__,
            _origin(exc),
            exc,
            where,
        )
        log.debug("traceback of the unexpected %s", type(exc).__name__, exc_info=exc)

    def refuse(self, reason: str, msg: str, *args: object) -> None:
        """A limit refused work: count it, and warn in one line at most."""
        self.refused[reason] += 1
        self.log.log(logging.WARNING, reason, msg, *args)

    # --- connections ----------------------------------------------------------------------

    def connection_opened(self, address: str) -> str | None:
        """Count a new connection; the reason to refuse it, or None.

        A refused connection counts too until it is closed: it holds a descriptor.
        """
        self.connections += 1
        if self.max_per_address > 0:
            n = self._per_address.get(address, 0) + 1
            self._per_address[address] = n
            if n > self.max_per_address:
                return "connections_per_address"
        if self.connections > self.max_connections:
            return "connections"
        return None

    def connection_closed(self, address: str) -> None:
        self.connections -= 1
        if self.max_per_address > 0:
            n = self._per_address.get(address, 0) - 1
            if n > 0:
                self._per_address[address] = n
            else:
                self._per_address.pop(address, None)

    # --- queues ---------------------------------------------------------------------------

    def admit_queue(self, spec: QueueSpec, user: bytes) -> bool:
        """Whether the queue ``spec`` asks for counts against ``user``; QueueError when
        the user may not create it or make it permanent.

        Counted are the queues that cost past a connection's life: permanent ones, and
        disk ones (each holds a descriptor). A transient memory queue goes with its
        client, so the connection limits bound those already.
        """
        existing = self.queues.get(spec.name)
        if existing is None:
            counted = bool(spec.permanent) or spec.kind is QueueKind.DISK
        else:
            # Making someone's transient memory queue permanent keeps it for good too.
            counted = bool(spec.permanent) and not existing.permanent
            counted = counted and existing.kind is QueueKind.MEM
        if not counted:
            return False
        limit = self.settings.max_queues_per_user
        if limit > 0 and self.owned(user) >= limit:
            self.refuse(
                "queues_per_user",
                "refusing queue %r for user %r: it has %d queues",
                spec.name,
                user,
                limit,
            )
            raise QueueError(QUEUES_PER_USER_TEXT)
        if existing is None and spec.kind is QueueKind.DISK and not self._disk_rate.take():
            self.refuse(
                "disk_queue_rate",
                "refusing disk queue %r for user %r: over %s a second",
                spec.name,
                user,
                self.settings.disk_queues_per_second,
            )
            raise QueueError(DISK_QUEUE_RATE_TEXT)
        return True

    def charge(self, user: bytes, queue: Queue) -> None:
        """``queue`` was created or made permanent by ``user``."""
        if queue.permanent or queue.kind is QueueKind.DISK:
            owned = self._owned.setdefault(user, [])
            if not any(q is queue for q in owned):
                owned.append(queue)
                self._charged += 1
        if self._charged > 2 * len(self.queues) + 1024:
            # Users who never come back would keep their gone queues listed: sweep all
            # once the lists may hold more gone queues than live ones (amortized O(1)).
            for name in list(self._owned):
                self.owned(name)
            self._charged = sum(map(len, self._owned.values()))

    def owned(self, user: bytes) -> int:
        """How many counted queues ``user`` has now; forgets those gone or now transient."""
        owned = self._owned.get(user)
        if not owned:
            return 0
        owned[:] = [
            q
            for q in owned
            if self.queues.get(q.name) is q and (q.permanent or q.kind is QueueKind.DISK)
        ]
        if not owned:
            del self._owned[user]
        return len(owned)

    # --- bindings -------------------------------------------------------------------------

    @staticmethod
    def bound(router: Router, exchange: bytes, program: bytes, queue: Target) -> Binding | None:
        """The binding of ``program`` on ``exchange`` to ``queue`` if there is one: binding
        it again adds no route (docs/fq-protocol.md §2.5), so it is never refused nor
        counted again."""
        ex = router.exchanges.get(exchange)
        return None if ex is None else ex.find(queue, program.split(b"\0", 1)[0])

    def admit_binding(self, exchange: bytes, queue: Target, user: bytes) -> bool:
        """Whether ``user`` may add a binding on ``exchange`` to ``queue`` within
        ``max_bindings_per_queue`` and ``max_bindings_per_user``; a refusal is counted and
        logged here."""
        settings = self.settings
        per_queue, per_user = settings.max_bindings_per_queue, settings.max_bindings_per_user
        checks = (
            ("bindings_per_queue", per_queue, self._queue_bindings, id(queue)),
            ("bindings_per_user", per_user, self._user_bindings, user),
        )
        for reason, limit, table, key in checks:
            if limit > 0 and _live_count(table, key, limit) >= limit:
                self.refuse(
                    reason,
                    "refusing binding on %r for user %r: it has %d (%s)",
                    exchange,
                    user,
                    limit,
                    reason,
                )
                return False
        return True

    def charge_binding(self, user: bytes, binding: Binding) -> None:
        """``user`` made the new ``binding``."""
        self._user_bindings.setdefault(user, []).append(binding)
        self._queue_bindings.setdefault(id(binding.queue), []).append(binding)
        self._bindings_charged += 1
        if self._bindings_charged > self._bindings_kept + 1024:
            # Users and queues that never come back would keep gone bindings listed: sweep
            # all once more were charged than were live at the last sweep (amortized O(1)).
            for table in (self._user_bindings, self._queue_bindings):
                for key in list(table):
                    _live_count(table, key, 0)
            self._bindings_kept = sum(map(len, self._user_bindings.values()))
            self._bindings_charged = 0


def _live_count(table: dict[Any, list[Binding]], key: object, limit: int) -> int:
    """How many bindings ``table[key]`` lists that are still bound; at ``limit`` or more
    (0: always) the gone ones are dropped first."""
    listed = table.get(key)
    if not listed:
        return 0
    if len(listed) < limit:
        return len(listed)
    listed[:] = [b for b in listed if b.exchange.bindings.get(b.route_id) is b]
    if not listed:
        del table[key]
    return len(listed)


def install_exception_handler(
    loop: asyncio.AbstractEventLoop,
    limits: Limits,
    is_ours: Callable[[dict[str, Any]], bool],
) -> None:
    """Log what escapes our protocols and tasks in one rate-limited line per event.

    What still escapes a protocol callback or a task of ours reaches asyncio's exception
    handler, which logs a traceback per event; ours logs one rate-limited line instead, with
    the traceback at debug level only.

    asyncio already closes a transport whose protocol raised; only the logging changes.
    An :class:`~fqbroker.errors.FqError` is bad input that a session did not catch
    (INFO, counted as ``internal`` bad input); anything else is a bug (ERROR with the
    place it was raised; the traceback at DEBUG). A failed accept (descriptors used up)
    is one WARNING a minute. What is not ours goes to the handler that was there before.
    """
    previous = loop.get_exception_handler()

    def handle(loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        exc = context.get("exception")
        if not isinstance(exc, Exception) or not is_ours(context):
            if previous is not None:
                previous(loop, context)
            else:
                loop.default_exception_handler(context)
            return
        if "socket" in context and isinstance(exc, OSError):
            limits.refused["descriptors"] += 1
            limits.accept_log.log(
                logging.WARNING,
                "accept",
                "cannot accept connections: %s; they wait until descriptors free",
                exc,
            )
            return
        if isinstance(exc, FqError):
            limits.bad("internal", "closing a connection: %s", exc)
            return
        limits.bug(exc, str(context.get("message", "")))

    loop.set_exception_handler(handle)


def raised_in_package(exc: BaseException) -> bool:
    """Whether ``exc`` passed through fqbroker's code on its way up."""
    tb = exc.__traceback__
    while tb is not None:
        frame = tb.tb_frame
        # Compiled modules (fqbroker/accel.py) add frames named by a relative source path;
        # their globals still say which module they are.
        if frame.f_code.co_filename.startswith(PACKAGE_DIR) or str(
            frame.f_globals.get("__name__", "")
        ).startswith("fqbroker."):
            return True
        tb = tb.tb_next
    return False


def _origin(exc: BaseException) -> str:
    """file:line where ``exc`` was raised: enough to find a bug without a traceback."""
    tb = exc.__traceback__
    if tb is None:
        return "?"
    while tb.tb_next is not None:
        tb = tb.tb_next
    return f"{Path(tb.tb_frame.f_code.co_filename).name}:{tb.tb_lineno}"
