"""The command channel's asyncio shell: auth, then bind/unbind/status/heartbeats (fqd_ccs.c).

The protocol is the sans-I/O :class:`~fqbroker.frontends.fq.commandmachine.CommandMachine`.
:class:`CommandSession` owns the transport (writes, pause and resume, the linger close after
an error frame) and turns the machine's events into calls on its :class:`CommandHost`, never
the Broker. It is a protocol, not a task: only a confirm waits, in a task of its own, and
heartbeats, once asked for (docs/fq-protocol.md §1.7), come from the broker's one
:class:`~fqbroker.frontends.kit.heartbeats.HeartbeatClock`: an idle session costs no task or timer.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
from typing import TYPE_CHECKING, Protocol

from fqbroker.core.bindflags import BIND_ILLEGAL
from fqbroker.core.permissions import Permissions
from fqbroker.core.program import compile_program
from fqbroker.core.router import ClientStats
from fqbroker.errors import AuthError, ProgramError, ProtocolError, QueueError
from fqbroker.frontends.fq.commandmachine import (
    Authenticate,
    Broken,
    CommandMachine,
    HeartbeatsAsked,
    Phase,
    Refused,
)
from fqbroker.frontends.kit.connections import RemotePeer
from fqbroker.frontends.kit.logins import THROTTLED_TEXT
from fqbroker.protocols.fq import wire

if TYPE_CHECKING:
    from collections import Counter

    from fqbroker.core.queue import Queue
    from fqbroker.core.queuespec import QueueSpec
    from fqbroker.frontends.kit.heartbeats import Entry, HeartbeatClock
    from fqbroker.frontends.kit.limits import LogLimiter
    from fqbroker.frontends.kit.logins import Check, LoginThrottle
    from fqbroker.storage.configdb.users import Users

__all__ = ["BadInputLog", "CommandHost", "CommandSession", "DataChannel", "Phase"]

log = logging.getLogger(__name__)

LINGER_SECONDS = 1.0
AUTH_FAILED = "authentication failed"
# Password checks under way: a task needs a strong reference while it runs.
_verifying: set[asyncio.Task[None]] = set()


class DataChannel(Protocol):
    """The data socket paired with a session (fqbroker.frontends.fq.data's DataSession)."""

    @property
    def is_peer(self) -> bool: ...

    async def confirm(self, count: int) -> str | None:
        """Once the first ``count`` messages are safe: ``None``, or why they are not."""
        ...

    def drain_then_close(self, linger: float) -> None: ...

    def deduplicate(self) -> None:
        """Its messages from now on are de-duplicated by id (core/dedup.py)."""
        ...

    def close(self) -> None: ...


class BadInputLog(Protocol):
    def bad(self, kind: str, msg: str, *args: object) -> None:
        """Count a close for bad input, and say so in one rate-limited line."""
        ...

    def refuse(self, reason: str, msg: str, *args: object) -> None:
        """Count a refusal (a failed login), and warn in one rate-limited line."""
        ...

    def bug(self, exc: BaseException, where: str) -> None:
        """Count an unexpected exception that ended a connection, and say so in one line."""
        ...

    @property
    def log(self) -> LogLimiter:
        """The rate-limited log, a few lines a second per kind."""
        ...

    @property
    def refused(self) -> Counter[str]:
        """Refusals counted so far, by reason."""
        ...


class CommandHost(Protocol):
    """What a command session asks of the broker (fqbroker.frontends.fq.registry's
    ClientRegistry): its queue and key, its bindings, the heartbeat clock, the log."""

    @property
    def limits(self) -> BadInputLog: ...

    @property
    def heartbeats(self) -> HeartbeatClock: ...

    @property
    def confirm_pair_timeout(self) -> float: ...

    @property
    def users(self) -> Users | None:
        """The user store under auth = "password"; None: no password is checked."""
        ...

    @property
    def logins(self) -> LoginThrottle:
        """The broker's login throttle, shared with every listener that checks passwords."""
        ...

    def attach(self, spec: QueueSpec, client: CommandSession) -> Queue: ...

    def register(self, client: CommandSession) -> bytes: ...

    def deregister(self, client: CommandSession) -> None: ...

    def bind(
        self, exchange: bytes, program: bytes, queue: Queue, flags: int, user: bytes
    ) -> int: ...

    def unbind(self, exchange: bytes, route_id: int, queue: Queue) -> bool: ...

    def closed(self, transport: asyncio.Transport) -> None: ...


# The data channel's pairing, in one slot (10,000 idle sessions make every slot count):
# None before it, a future while a confirm waits for it, the channel once paired, and
# UNPAIRED once that channel is gone (a missing channel is then an answer at once).
UNPAIRED = True
Pairing = DataChannel | asyncio.Future[None] | bool | None
_NOT_A_CHANNEL = (bool, asyncio.Future)


class CommandSession(RemotePeer, asyncio.Protocol):
    """One client's command connection: its queue, key, counters and paired data channel."""

    __slots__ = (
        "_beat",
        "_pairing",
        "_stats",
        "dedup",
        "host",
        "key",
        "machine",
        "permissions",
        "queue",
        "transport",
        "user",
    )

    def __init__(self, host: CommandHost, transport: asyncio.Transport) -> None:
        self.host = host
        self.transport = transport
        self.machine: CommandMachine[asyncio.Task[str | None]] = CommandMachine(
            host.heartbeats.time()
        )
        self.user = b""
        # What the client may do (core/permissions.py): None until authenticated, and
        # while its password is being checked.
        self.permissions: Permissions | None = None
        self.queue: Queue | None = None
        self.key = b""
        # Made at first use (see stats): an idle client never counts anything.
        self._stats: ClientStats | None = None
        self._pairing: Pairing = None
        self._beat: Entry | None = None
        # Its data channel's messages are de-duplicated by id (core/dedup.py): asked for
        # with a DEDUP request, which fq's own clients never send.
        self.dedup = False

    def __lt__(self, other: object) -> bool:
        # Heartbeat entries of one time compare their sessions; any fixed order will do.
        return id(self) < id(other)

    @property
    def stats(self) -> ClientStats:
        """The client's counters (docs/fq-protocol.md §1.6). Made when first asked for,
        by its data channel's first message either way or by a status or /stats read,
        which then see zeros as from counters made at connect: 112 bytes in every idle
        client otherwise."""
        stats = self._stats
        if stats is None:
            stats = self._stats = ClientStats()
        return stats

    @property
    def pretty(self) -> str:
        queue = self.queue.name.decode(errors="replace") if self.queue else "?"
        return f"{self.user.decode(errors='replace')}/{queue}@{self.remote_addr}:{self.remote_port}"

    @property
    def phase(self) -> Phase:
        return self.machine.phase

    @property
    def closed(self) -> bool:
        return self.machine.closed

    @property
    def heartbeat_ms(self) -> int:
        return self.machine.heartbeat_ms

    @property
    def data(self) -> DataChannel | None:
        """The paired data channel, while it is open."""
        pairing = self._pairing
        if pairing is None or isinstance(pairing, _NOT_A_CHANNEL):
            return None
        return pairing

    @data.setter
    def data(self, channel: DataChannel | None) -> None:
        # The data session lets go of its owner with None; pairing goes through paired().
        if channel is None:
            if self.data is not None:
                self._pairing = UNPAIRED
        else:
            self.paired(channel)

    def paired(self, data: DataChannel) -> None:
        """The data socket presenting this session's key has paired with it."""
        pairing = self._pairing
        if isinstance(pairing, asyncio.Future) and not pairing.done():
            pairing.set_result(None)
        self._pairing = data

    # --- asyncio.Protocol -----------------------------------------------------------------

    def data_received(self, data: bytes) -> None:
        machine = self.machine
        if machine.closed:
            return  # lingering after an error: input is read and thrown away
        machine.receive_data(data)
        if self.permissions is None and machine.phase is Phase.READY:
            return  # the password is being checked: the requests behind it wait
        self._pump()

    def _pump(self) -> None:
        """Act on every whole request read; stop at one whose password is being checked."""
        machine = self.machine
        now = self.host.heartbeats.time()
        try:
            while (event := machine.next_event(now)) is not None:
                self._handle(event)
                if machine.closed:
                    return
                if self.permissions is None:
                    return  # checking a password: _verify() carries on
        except (AuthError, QueueError) as exc:  # what the host refuses (a queue, a limit)
            machine.refuse(exc.text)
            self._refused(exc)
            return
        except ProtocolError as exc:
            self._broken(exc)
            return
        self._flush(now)

    def eof_received(self) -> bool:
        machine = self.machine
        if machine.closed:
            return False  # the client saw our error frame and hung up: close now
        event = machine.receive_eof()
        if isinstance(event, Refused):
            self._refused(event.error)
        else:
            self._end()
            self.transport.close()
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        self.host.closed(self.transport)
        if not self.machine.closed:
            log.debug("connection lost: %s", self.pretty)
            self._end()

    def pause_writing(self) -> None:
        # A client that does not read its replies is not read from either.
        self.transport.pause_reading()

    def resume_writing(self) -> None:
        if not self.machine.closed:
            self.transport.resume_reading()

    # --- events to collaborators ----------------------------------------------------------

    def _handle(self, event: object) -> None:
        host, machine = self.host, self.machine
        match event:
            case Authenticate(user, spec, password):
                self.user = user
                users = host.users
                if users is None:
                    self._admit(spec, Permissions.ALL)
                else:
                    self._authenticate(users, spec, password)
            case HeartbeatsAsked(when):
                self._heartbeats(when)
            case wire.StatusRequest():
                assert self.queue is not None
                machine.status(self.queue.dropped_to, self.stats if self.data is not None else None)
            case wire.BindRequest(flags, exchange, program):
                assert self.queue is not None and self.permissions is not None
                if self.permissions.may_consume(exchange):
                    limited = _binding_refusals(host.limits.refused)
                    route_id = host.bind(exchange, program, self.queue, flags, self.user)
                    if route_id == BIND_ILLEGAL:
                        if _binding_refusals(host.limits.refused) > limited:
                            why = "over a binding limit (docs/limits.md)"
                        else:
                            why = _why_illegal(program)
                        self._bind_refused(exchange, program, why)
                    machine.bound(route_id)
                else:
                    # fq's bind failure, so old clients report it as they would any.
                    self._bind_refused(exchange, program, "not permitted to consume from it")
                    machine.bound(BIND_ILLEGAL)
            case wire.UnbindRequest(route_id, exchange):
                assert self.queue is not None
                machine.unbound(route_id, host.unbind(exchange, route_id, self.queue))
            case wire.DedupRequest():
                self.dedup = True
                data = self.data
                if data is not None:
                    data.deduplicate()
                machine.deduplicating()
            case wire.ConfirmRequest(count):
                task = asyncio.ensure_future(self._confirm(count))
                machine.defer(task)
                task.add_done_callback(functools.partial(self._confirm_done, count))
            case Refused(error):
                self._refused(error)
            case Broken(error):
                self._broken(error)

    def _bind_refused(self, exchange: bytes, program: bytes, reason: str) -> None:
        # The client hears only BIND_ILLEGAL (fq's wire has no reason): the log says why,
        # a few lines a second at most, so a retrying client cannot flood it.
        self.host.limits.log.log(
            logging.INFO,
            "bind",
            "refused bind of %r on exchange %r to user %r (%s): %s",
            program.partition(b"\0")[0].decode(errors="replace"),
            exchange.decode(errors="replace"),
            self.user.decode(errors="replace"),
            self.pretty,
            reason,
        )

    # --- authentication (docs/security.md) ---------------------------------------------------

    def _admit(self, spec: QueueSpec, permissions: Permissions) -> None:
        """The client is who it says: attach its queue (within its rights) and answer."""
        self.permissions = permissions
        self.queue = self.host.attach(spec, self)
        self.key = self.host.register(self)
        self.machine.accept(self.key)
        log.info("client %s authenticated", self.pretty)

    def _authenticate(self, users: Users, spec: QueueSpec, password: bytes) -> None:
        try:
            name = self.user.decode()
        except UnicodeDecodeError:
            name = "\0"  # no stored user bears it: checked against the dummy hash
        # The throttle first, the password after: while the source is throttled the right
        # password is refused as a wrong one is, before anything is looked at.
        check = self.host.logins.try_check(self.remote_addr)
        if check is not None:
            try:
                permissions = users.cached(name, password)
            except BaseException:
                check.failed()
                raise
            if permissions is not None:  # verified before: no PBKDF2 (a reconnect storm)
                check.passed()
                self._admit(spec, permissions)
                return
        # PBKDF2 takes milliseconds: in a worker thread, reading paused meanwhile.
        self.transport.pause_reading()
        task = asyncio.ensure_future(self._verify(users, name, spec, password, check))
        _verifying.add(task)
        task.add_done_callback(self._verify_done)

    def _verify_done(self, task: asyncio.Task[None]) -> None:
        """A login that raised is a bug: said once, and the connection closed, never left
        unanswered holding its place among the connections."""
        _verifying.discard(task)
        if task.cancelled():
            self.close()
            return
        exc = task.exception()
        if exc is not None:
            self.host.limits.bug(exc, f"checking the password of {self.pretty}")
            self.close()

    async def _verify(
        self, users: Users, name: str, spec: QueueSpec, password: bytes, check: Check | None
    ) -> None:
        host = self.host
        if check is None:
            check = await host.logins.check(self.remote_addr)
            if check is None:
                self._throttled(name)
                return
            if self.machine.closed:
                check.cancel()  # the client hung up while it waited: nothing was checked
                return
        with check:  # settled as failed if the check raises
            permissions = await users.verify_async(name, password)
            if permissions is None:
                check.failed()
            else:
                check.passed()
        if self.machine.closed:
            return  # the client hung up meanwhile
        if permissions is None:
            host.limits.refuse(
                "auth", "authentication failed for user %r from %s", name, self.remote_addr
            )
            self._refuse_login(AUTH_FAILED)
            return
        try:
            self._admit(spec, permissions)
        except (AuthError, QueueError) as exc:  # what the host refuses (a queue, a limit)
            self.machine.refuse(exc.text)
            self._refused(exc)
            return
        if not self.transport.is_closing():
            self.transport.resume_reading()
        self._pump()  # the requests that came behind the auth request

    def _throttled(self, name: str) -> None:
        """Too many failed logins from the client's network: refused unchecked, the right
        password as the wrong one (docs/security.md)."""
        if self.machine.closed:
            return
        address = self.remote_addr
        self.host.limits.refuse(
            "auth_throttled",
            "login of user %r from %s refused unchecked: too many failed logins (retry in %.0fs)",
            name,
            address,
            self.host.logins.retry_after(address),
        )
        self._refuse_login(THROTTLED_TEXT)

    def _refuse_login(self, text: str) -> None:
        self.machine.refuse(text)
        self._flush(self.host.heartbeats.time())
        self._end()
        self._linger()

    def _flush(self, now: float) -> None:
        out = self.machine.data_to_send(now)
        if out and not self.transport.is_closing():
            self.transport.write(out)

    def _refused(self, exc: AuthError | QueueError) -> None:
        """The machine queued the error frame: send it, end, and linger
        (docs/fq-protocol.md §1.8)."""
        if isinstance(exc, AuthError):
            self.host.limits.bad("command", "refusing %s: %r", self.pretty, exc.text)
        else:  # not bad input; a limit's refusal is counted where it is raised
            log.info("refusing %s: %r", self.pretty, exc.text)
        self._flush(self.host.heartbeats.time())
        self._end()
        self._linger()

    def _broken(self, exc: ProtocolError) -> None:
        self.host.limits.bad("command", "closing %s: %s", self.pretty, exc)
        self._flush(self.host.heartbeats.time())  # the replies before the bad frame
        self._end()
        self.transport.close()

    def _linger(self) -> None:
        """Close without a reset once the error frame is out (as the HTTP front end's linger_close).

        Closing with unread input makes the kernel send RST, which can destroy the error
        frame before the client reads it (docs/fq-protocol.md §1.8). So: half-close after
        what is queued, discard input until the client hangs up or for a moment, then close.
        """
        transport = self.transport
        if transport.is_closing():
            return
        if transport.can_write_eof():
            with contextlib.suppress(OSError):  # ENOTCONN: the client reset already
                transport.write_eof()
        transport.resume_reading()
        asyncio.get_running_loop().call_later(LINGER_SECONDS, transport.close)

    def _end(self) -> None:
        """The session is over: no more heartbeats or replies, the client is deregistered."""
        for confirm in self.machine.close():
            confirm.cancel()
        if self._beat is not None:
            self.host.heartbeats.cancel(self._beat)
            self._beat = None
        self.host.deregister(self)

    def close(self) -> None:
        """End the session and close the connection after what is queued for it."""
        if not self.machine.closed:
            self._end()
        self.transport.close()

    # --- confirms (docs/confirms.md) --------------------------------------------------------

    async def _confirm(self, count: int) -> str | None:
        if self._pairing is None or isinstance(self._pairing, asyncio.Future):
            await self._wait_for_pairing()
        data = self.data
        return "no data channel" if data is None else await data.confirm(count)

    async def _wait_for_pairing(self) -> None:
        # A client writes its first messages on the data socket and then confirms on the
        # command socket; the broker may read the confirm before it has even accepted the
        # data socket. Failing it would make a retrying publisher send duplicates.
        pairing = self._pairing
        if not isinstance(pairing, asyncio.Future):
            pairing = self._pairing = asyncio.get_running_loop().create_future()
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(self.host.confirm_pair_timeout):
                await asyncio.shield(pairing)

    def _confirm_done(self, count: int, task: asyncio.Task[str | None]) -> None:
        if task.cancelled() or task.exception() is not None:
            self.machine.drop(task)
        else:
            self.machine.settle(task, count, task.result())
        self._flush(self.host.heartbeats.time())

    # --- heartbeats (docs/fq-protocol.md §1.7) -----------------------------------------------

    def _heartbeats(self, when: float | None) -> None:
        clock = self.host.heartbeats
        if when is None:
            if self._beat is not None:
                clock.cancel(self._beat)
                self._beat = None
            return
        if self._beat is not None:
            if self._beat[0] <= when:
                return  # it comes up first anyway and then looks again
            clock.cancel(self._beat)
        self._beat = clock.schedule(self, when)

    def heartbeat_due(self, now: float) -> None:
        """The clock's call: send the heartbeat due, or fail a silent client."""
        self._beat = None
        machine = self.machine
        if machine.closed:
            return
        when = machine.heartbeat_due(now)
        if machine.closed:
            log.info("client %s heartbeat failed", self.pretty)
            self._flush(now)
            self._end()
            self.transport.close()
            return
        self._flush(now)
        if when is not None:
            self._beat = self.host.heartbeats.schedule(self, when)


def _binding_refusals(refused: Counter[str]) -> int:
    return refused["bindings_per_queue"] + refused["bindings_per_user"]


def _why_illegal(program: bytes) -> str:
    """Why the broker answered a permitted bind within the limits with BIND_ILLEGAL: the
    program's compile error (as the built-in functions see it: the broker's -m modules
    add functions, never take one away)."""
    try:
        compile_program(program)
    except ProgramError as exc:
        return f"bad program: {exc}"
    return "the program does not compile here"
