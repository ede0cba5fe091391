"""The ``[opencluster]`` table: the OpenCluster key/value store's settings
(docs/opencluster.md).

Declared here, beside the listener, and read by the shared parser
(:mod:`fqbroker.settings.section`).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from fqbroker.settings.section import Section, setting

__all__ = ["OpenCluster"]

_LISTEN = """\
Where OpenCluster clients connect: "HOST:PORT", "[IPV6]:PORT", or "PORT" on the address of
`bind` (13600 is the protocol's customary port); 0 picks a free port. Empty: off.
`fqd --opencluster ADDR:PORT` sets it too. The protocol has no authentication: bind it to
loopback or a private network."""
_SYNC = """\
Values are kept in memory and in <queue_dir>/opencluster/ (a journal, folded into
kv.sqlite3 in the background); a set is acknowledged once its batch is in the journal.
"full": the batch is fsynced, an ack survives a power cut. "normal": an ack survives
kill -9 of fqd, not a power cut (faster)."""
_INLINE = """\
With sync = "full", a batch's fdatasync runs on the event loop while the last one took
under this many milliseconds (a local SSD's), as Redis does: cheaper than a hand-off to a
thread. Slower, it runs in the store's journal thread. 0: always in the thread, so that a
disk that hangs in an fdatasync stalls OpenCluster alone, not the whole broker."""
_LIMITS = """\
Limits. A frame whose name, value or payload (the header's length) is over these closes
that connection (counted as bad input); the others carry on."""
_MAX_KEYS = 'Keys held: a set of a new key past it is answered failinfo (code 3, "store full").'
_MAX_INFLIGHT = """\
Commands one connection may have read and not yet answered; past it the broker stops
reading that connection until its replies go out (flow control, not an error)."""
_TLS = "TLS: a PEM certificate chain, and its key (unset: the key is in the certificate's file)."

_NAMESPACE = """\
Under auth = "password", the name a user's rights are checked on (gets carry only hashes
of the key, not its name): a get needs the consume right on it, a set the publish right."""
_ANONYMOUS = """\
Under auth = "password" clients log in with TLS client certificates (tls_cert here, the
broker's tls_client_ca; the subject CN is the user). true: serve anyone who reaches the
port, no login, every right (fqd refuses to start otherwise when it cannot log them in)."""


@dataclass(frozen=True, slots=True)
class OpenCluster(Section):
    """The ``[opencluster]`` table: the OpenCluster key/value listener (docs/opencluster.md).

    Off while ``listen`` is None (or empty in the TOML file). Values live in memory, and
    in a journal folded into sqlite under ``queue_dir``; a set is acknowledged once its
    batch is written to the journal, fsynced (``sync = "full"``) or not (``"normal"``:
    survives kill -9, not a power cut). A frame over a limit closes that connection;
    ``max_keys`` refuses new keys (failinfo); ``max_inflight`` stops reading a connection
    until its replies go out.
    """

    NAME = "opencluster"
    TITLE = "The OpenCluster key/value store (docs/opencluster.md)"
    PORT = 13600  # the protocol's customary port, for a ``listen`` naming a host only

    listen: str | None = setting(
        None, "HOST:PORT, [V6]:PORT or PORT (on `bind`); empty: off", comment=_LISTEN
    )
    sync: str = setting(
        "full", '"full": an ack survives a power cut; "normal": kill -9 only', comment=_SYNC,
        choices=("full", "normal"),
    )  # fmt: skip
    inline_sync_ms: float = setting(
        1.0,
        "fdatasync on the event loop while the last took under this; 0: never",
        comment=_INLINE,
    )
    max_name: int = setting(1024, "bytes of a key's name", comment=_LIMITS, positive=True)
    max_value: int = setting(1 << 20, "bytes of a string value", comment="", positive=True)
    max_payload: int = setting(
        (1 << 20) + 1024 + 64, "a frame's payload length (its header's)", comment="",
        positive=True,
    )  # fmt: skip
    max_keys: int = setting(
        1_000_000, "keys held; a set of a new key past it is refused", comment=_MAX_KEYS,
        positive=True,
    )  # fmt: skip
    max_inflight: int = setting(
        1024, "commands read and not yet answered, per connection", comment=_MAX_INFLIGHT,
        positive=True,
    )  # fmt: skip
    tls_cert: Path | None = setting(  # noqa: RUF009 (a field, as dataclasses.field)
        None, "PEM certificate chain: TLS when set", comment=_TLS,
        example="/etc/fqd/opencluster.crt",
    )  # fmt: skip
    tls_key: Path | None = setting(  # noqa: RUF009 (a field, as dataclasses.field)
        None, "PEM private key; unset: in tls_cert's file", comment="",
        example="/etc/fqd/opencluster.key",
    )  # fmt: skip
    anonymous: bool = setting(
        False, 'under auth = "password": no login, anyone who reaches it', comment=_ANONYMOUS
    )
    namespace: str = setting(
        "opencluster",
        "the name permissions are checked on: get = consume, set = publish",
        comment=_NAMESPACE,
    )

    def check(self) -> None:
        # A frame of the largest name and value must fit: 16 bytes of hashes, expiry and
        # full_wait, two 4-byte lengths.
        if self.max_payload > (1 << 31) - 1:
            raise ValueError("opencluster max_payload must fit the header's i32 length")
        if self.max_payload < 24 + self.max_name + 4:
            raise ValueError(
                "opencluster max_payload must hold a set of a max_name name "
                f"(at least {24 + self.max_name + 4})"
            )
        if not self.namespace:
            raise ValueError("opencluster namespace must not be empty")
        if not 0 <= self.inline_sync_ms < float("inf"):
            raise ValueError("opencluster inline_sync_ms must be 0 or more")
        Section.check(self)
