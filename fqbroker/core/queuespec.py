"""The queue field of the auth request: ``NAME [\\0 TYPE [":" PARAMS]]`` (fqd_ccs.c,
docs/fq-protocol.md §1.3).

``parse_queue_field`` turns the raw field into a :class:`QueueSpec` or raises
:class:`~fqbroker.errors.AuthError` with fqd's exact text. ``QueueSpec.attributes`` is
the canonical ``private|public,drop|block|reject,backlog=N`` form fqd stores in sqlite
(``reject`` is fqbroker's: fqd refuses a row with it, as it refuses ``backlog_bytes``).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from enum import StrEnum

from fqbroker.errors import AuthError

__all__ = [
    "DEFAULT_BACKLOG",
    "DEFAULT_BACKLOG_BYTES",
    "MAX_QUEUE_NAME",
    "UNLIMITED_BYTES",
    "Policy",
    "QueueKind",
    "QueueSpec",
    "parse_queue_field",
]

DEFAULT_BACKLOG = 16384
MAX_QUEUE_NAME = 127
UNLIMITED = 0xFFFFFFFF
# fqbroker extension (docs/memory.md): a memory queue's backlog in bytes. 0 is unlimited.
DEFAULT_BACKLOG_BYTES = 64 << 20
UNLIMITED_BYTES = 1 << 62
# An fqbroker extension: a disk queue's own fsync policy (see conf/fqd.toml).
FSYNC_TOKENS = frozenset({"fsync=always", "fsync=interval", "fsync=never"})


class QueueKind(StrEnum):
    MEM = "mem"
    DISK = "disk"


class Policy(StrEnum):
    """What a full queue does with a message: ``drop`` it (and the publisher is not told),
    ``block`` the publisher until there is room, or ``reject`` it and tell the publisher
    (an fqbroker extension: its confirm fails, docs/queues.md)."""

    DROP = "drop"
    BLOCK = "block"
    REJECT = "reject"


@dataclass(frozen=True, slots=True)
class QueueSpec:
    """What a client asked for. ``None`` fields were not given and take the default."""

    name: bytes
    kind: QueueKind = QueueKind.MEM
    private: bool | None = None
    policy: Policy | None = None
    backlog: int | None = None  # u32; 0xffffffff is in effect unlimited
    permanent: bool | None = None
    fsync: str | None = None  # disk queues: always | interval | never; None = broker's
    backlog_bytes: int | None = None  # memory queues: bytes held at most (plus one message)

    @property
    def is_private(self) -> bool:
        return self.private is not False

    @property
    def effective_policy(self) -> Policy:
        return self.policy or Policy.DROP

    @property
    def backlog_limit(self) -> int:
        return DEFAULT_BACKLOG if self.backlog is None else self.backlog

    @property
    def attributes(self) -> str:
        """fqd's canonical attribute string, as stored in the sqlite ``queue`` table."""
        sharing = "private" if self.is_private else "public"
        text = f"{sharing},{self.effective_policy},backlog={signed_backlog(self.backlog_limit)}"
        # Only when set: fqd would refuse a row with a parameter it does not know.
        if self.fsync:
            text += f",fsync={self.fsync}"
        if self.backlog_bytes is not None:
            text += f",backlog_bytes={self.backlog_bytes}"
        return text

    def with_params(self, params: str) -> QueueSpec:
        return _apply_params(self, params)


def signed_backlog(limit: int) -> int:
    """fqd prints the u32 limit as a signed int, so -1 stays -1 in stats.json."""
    return limit - (1 << 32) if limit >= 1 << 31 else limit


def _atoi(text: str) -> int:
    """C ``atoi``: optional sign and leading digits; trailing junk ignored, junk gives 0."""
    text = text.lstrip(" \t\n\v\f\r")
    sign = 1
    if text[:1] in ("+", "-"):
        sign = -1 if text[0] == "-" else 1
        text = text[1:]
    digits = ""
    for ch in text:
        if not ch.isdigit() or not ch.isascii():
            break
        digits += ch
    return sign * int(digits) if digits else 0


def _byte_count(text: str) -> int:
    """A byte count with an optional k, m or g suffix (powers of 1024); 0 is unlimited."""
    units = {"k": 1 << 10, "m": 1 << 20, "g": 1 << 30}
    scale = units.get(text[-1:].lower(), 1)
    digits = text[:-1] if scale > 1 else text
    if not digits.isascii() or not digits.isdigit():
        raise AuthError(f"invalid queue param: backlog_bytes={text}")
    return min(int(digits) * scale, UNLIMITED_BYTES)


def _apply_params(spec: QueueSpec, params: str) -> QueueSpec:
    changes: dict[str, object] = {}
    for token in params.split(","):
        if not token:
            continue
        if token == "private":
            changes["private"] = True
        elif token == "public":
            changes["private"] = False
        elif token == "drop":
            changes["policy"] = Policy.DROP
        elif token == "block":
            changes["policy"] = Policy.BLOCK
        elif token == "reject":
            changes["policy"] = Policy.REJECT
        elif token == "permanent":
            changes["permanent"] = True
        elif token == "transient":
            changes["permanent"] = False
        elif token.startswith("backlog="):
            changes["backlog"] = _atoi(token[8:]) & UNLIMITED
        elif token.startswith("backlog_bytes="):
            changes["backlog_bytes"] = _byte_count(token[14:])
        elif token in FSYNC_TOKENS:
            changes["fsync"] = token[6:]
        else:
            raise AuthError(f"invalid queue param: {token}")
    return replace(spec, **changes)  # type: ignore[arg-type]


def parse_queue_field(field: bytes) -> QueueSpec:
    """Parse the auth request's queue field exactly as fqd does
    (docs/fq-protocol.md §1.3)."""
    nul = field.find(0)
    if nul < 0:
        if len(field) > MAX_QUEUE_NAME:
            raise AuthError("queue name is too long")
        name, rest = field, None
    else:
        name, rest = field[:nul], field[nul + 1 :]
        # fqd overflows its 127-byte name buffer here; we refuse
        # (docs/fq-protocol.md §1.3, §9).
        if len(name) > MAX_QUEUE_NAME:
            raise AuthError("queue name is too long")
    kind_text, params = "mem", ""
    if rest:
        # fqd treats the field as a C string: a second NUL ends it.
        end = rest.find(0)
        text = (rest if end < 0 else rest[:end]).decode("latin-1")
        kind_text, _, params = text.partition(":")
    try:
        kind = QueueKind(kind_text)
    except ValueError:
        raise AuthError(f"invalid queue type: {kind_text}") from None
    spec = QueueSpec(name=name, kind=kind).with_params(params)
    if not name:
        # fqd names an anonymous queue itself, always private and transient.
        import uuid  # with platform: an idle broker need not hold them

        spec = replace(spec, name=f"auto-{uuid.uuid4()}".encode(), private=True, permanent=False)
    return spec
