"""Exceptions raised by fqbroker: one tree, every public exception of the package in it.

::

    FqError
    ├── ProtocolError        malformed bytes, or a frame illegal in this phase
    │   ├── FrameTooLarge    a length field over its limit (.field, .size, .limit)
    │   ├── AuthError        the auth request is refused; .text is fq's exact error text
    │   ├── FiggProtocolError  a Figg frame that breaks the wire format (frontends/figg)
    │   ├── FyrehoseProtocolError  a bad fyrehose datagram (frontends/fyrehose); dropped
    │   └── OpenClusterProtocolError  an OpenCluster frame that breaks the wire format
    ├── ProgramError         a route program does not compile (answered as BIND_ILLEGAL)
    ├── QueueError           a queue cannot be created or attached; .text is fq's error text
    ├── CheckpointError      a checkpoint request is refused; .message is fqd's text
    ├── LogFormatError       a disk queue's directory holds no segment log this version reads
    ├── SequenceFileError    the fyrehose sequence file is unusable: fqd does not start
                             (also a ValueError, so fqd says why in one line)
    ├── KVStoreError         the OpenCluster store cannot be opened: fqd does not start
                             (also a ValueError)
    ├── ConfigError          a settings file or the config database fqd cannot use; the
                             message names the file (also a ValueError: one line, exit 2)
    ├── ClientError          a broker refused the client; .text is its exact error text
    │   └── ClientClosed     the client is closed (also a ConnectionError)
    │       └── FyrehoseClosed  the fyrehose client is closed (clients/fyrehose)
    ├── BrokerError          a replay request was refused or found no broker; .text
    │   ├── DataLost         records asked for are no longer stored; .first is the oldest
    │   └── AdminError       the admin API refused a request; .status is the HTTP status
    ├── DataLossError        Spark: offsets a query needs are gone (also a RuntimeError)
    └── SparkOptionError     Spark: an `fq` option unknown, misplaced or bad, or naming
                             no queue or topic; names the option (also a ValueError)

Five internal signals stay outside the tree, since none reaches a user as itself:
``frontends.http.reads.queues.Refused``, ``frontends.http.admin.base.Refused``,
``protocols.decoding.NeedData``, ``storage.segments.records.Damaged`` and
``storage.segments.checkpoints.Unreadable``. The comments below say why, and how each shell maps
the tree's exceptions to the wire.
"""

from __future__ import annotations

# Sans-IO code raises these and never writes a reply itself; the asyncio shell that fed it
# the bytes maps them to the wire. On fq's command channel an AuthError or QueueError
# becomes an error frame carrying its .text, then a close; any other ProtocolError (there,
# or on a data channel) closes the connection and is counted as bad input
# (fqbroker.frontends.kit.limits). A ProgramError answers a bind with BIND_ILLEGAL; the HTTP
# endpoints answer CheckpointError and bad requests with fqd's JSON error. Whatever escapes
# a session reaches the event loop's exception handler (limits.install_exception_handler),
# which counts an FqError as bad input and logs anything else as a bug. Traffic outcomes
# (no exchange, no route, dropped) are counters, never exceptions.
#
# The client-side ones are defined here and importable from where their users meet them
# (fqbroker.clients.fq.client, fqbroker.clients.http.replay, fqbroker.spark). The internal signals
# outside the tree: frontends.http.reads.queues.Refused (a replay or topic read answered with an
# HTTP error; its endpoint turns it into the answer), frontends.http.admin.base.Refused (the same
# for the admin API), protocols.decoding.NeedData (a decode step ran out of bytes; its decoder
# catches it), storage.segments.records.Damaged (bytes that are no valid record: an OSError with
# EIO, which is what reads and repair() raise, and which the exception handler must keep counting as
# an OS failure rather than bad input) and storage.segments.checkpoints.Unreadable (caught where
# checkpoints are opened).

__all__ = [
    "AdminError",
    "AuthError",
    "BrokerError",
    "CheckpointError",
    "ClientClosed",
    "ClientError",
    "ConfigError",
    "DataLossError",
    "DataLost",
    "FiggProtocolError",
    "FqError",
    "FrameTooLarge",
    "FyrehoseClosed",
    "FyrehoseProtocolError",
    "KVStoreError",
    "LogFormatError",
    "OpenClusterProtocolError",
    "ProgramError",
    "ProtocolError",
    "QueueError",
    "SequenceFileError",
    "SparkOptionError",
]


class FqError(Exception):
    """Root of every fqbroker exception."""


# --- the broker's: what a peer's input or a request can cause ------------------------------


class ProtocolError(FqError):
    """The peer sent bytes that break the protocol; the connection is closed."""


class FrameTooLarge(ProtocolError):
    """A length field is over its limit."""

    def __init__(self, field: str, size: int, limit: int) -> None:
        super().__init__(f"{field} of {size} bytes is over the limit of {limit}")
        self.field = field
        self.size = size
        self.limit = limit


class AuthError(ProtocolError):
    """The auth request is refused; ``text`` is what goes on the wire in the error frame."""

    def __init__(self, text: str) -> None:
        super().__init__(text)
        self.text = text


class FiggProtocolError(ProtocolError):
    """A Figg peer sent a frame that breaks the wire format; the connection is closed."""


class FyrehoseProtocolError(ProtocolError):
    """A fyrehose datagram is malformed, truncated, oversized or of an unknown type.

    UDP has no connection to close: the listener drops the datagram, counts it and never
    answers it.
    """


class OpenClusterProtocolError(ProtocolError):
    """An OpenCluster peer sent a frame that breaks the wire format (a bad length, fields
    that do not add up to the payload, a name or value over its limit); the server closes
    that connection, the client gives the connection up (protocols/opencluster/wire.py)."""


class ProgramError(FqError):
    """A route program does not compile."""

    def __init__(self, reason: str, position: int = -1) -> None:
        where = f" at offset {position}" if position >= 0 else ""
        super().__init__(f"{reason}{where}")
        self.reason = reason
        self.position = position


class QueueError(FqError):
    """A queue cannot be created or attached to; ``text`` is fq's exact error text."""

    def __init__(self, text: str) -> None:
        super().__init__(text)
        self.text = text


class CheckpointError(FqError):
    """A checkpoint request is refused; ``message`` is fqd's text for it."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class LogFormatError(FqError):
    """The directory holds a log of an unknown format version, or is not a segment log."""


class SequenceFileError(FqError, ValueError):
    """The fyrehose sequence file is there but cannot be read or written, or holds no
    usable number; the listener does not start (frontends/fyrehose/sequence.py)."""


class KVStoreError(FqError, ValueError):
    """The OpenCluster store's database cannot be opened or read; the listener does not
    start (storage/kv/store.py)."""


class ConfigError(FqError, ValueError):
    """A settings file fqd cannot read or use, or a config database it cannot open; the
    message names the file (settings/broker.py, cli/fqd.py)."""


class StoreInUse(FqError, OSError):
    """Another fqd holds the lock of a queue directory or config database this one was
    given: fqd does not start (storage/lock.py). ``pid`` is the holder's, or None."""

    def __init__(self, text: str, pid: int | None) -> None:
        super().__init__(text)
        self.pid = pid


# --- the clients': what a broker's answer can cause ----------------------------------------


class ClientError(FqError):
    """The broker refused us; ``text`` is its exact error text
    (docs/fq-protocol.md §1.8)."""

    def __init__(self, text: str) -> None:
        super().__init__(text)
        self.text = text


class ClientClosed(ClientError, ConnectionError):
    """The client is closed (or lost its connection with ``reconnect=False``)."""


class FyrehoseClosed(ClientClosed):
    """The fyrehose client is closed: ``next()`` and ``publish()`` have nothing more."""

    def __init__(self, text: str = "fyrehose client is closed") -> None:
        super().__init__(text)


class BrokerError(FqError):
    """The broker refused a request, or could not be reached; ``text`` says why."""

    def __init__(self, text: str) -> None:
        super().__init__(text)
        self.text = text


class DataLost(BrokerError):
    """Records asked for are no longer stored (trimmed, or lost in a crash)."""

    def __init__(self, text: str, first: int) -> None:
        super().__init__(text)
        self.first = first


class AdminError(BrokerError):
    """The admin API answered with an error (clients/http/admin.py); ``text`` is its one line,
    ``status`` the HTTP status (400, 401, 403, 404, 409, ...)."""

    def __init__(self, text: str, status: int) -> None:
        super().__init__(text)
        self.status = status


_SUPPRESS_CONTEXT = BaseException.__dict__["__suppress_context__"]


class _SparkError(FqError):
    """An error the ``fq`` Spark data source reports to a user through Spark.

    Spark shows such an error as its formatted traceback, whose first line is "Traceback
    (most recent call last):", and clears its ``__cause__`` first, which suppresses its
    context too. With ``lead`` set (by ``fqbroker.spark.options.headline``, which puts a
    copy of the error with no traceback as its context), the context is shown anyway: one
    line, the message, ahead of the traceback.
    """

    lead = False

    @property
    def __suppress_context__(self) -> bool:
        return False if self.lead else bool(_SUPPRESS_CONTEXT.__get__(self))

    @__suppress_context__.setter
    def __suppress_context__(self, value: bool) -> None:
        _SUPPRESS_CONTEXT.__set__(self, value)


class DataLossError(_SparkError, RuntimeError):
    """Offsets the query needs are no longer stored, and ``failOnDataLoss`` is true."""


class SparkOptionError(_SparkError, ValueError):
    """An option of the Spark data source ``fq`` is unknown, misplaced or has a bad value,
    or names a queue or topic the broker does not have; the message names the option."""
