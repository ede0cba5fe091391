"""What one user may do: publish to, bind on (consume from) exchanges, attach to queues,
relay messages as a peer.

Sans-IO: built from the ``(kind, pattern, allow)`` rows the user store keeps for a user
(table ``fqbroker_permissions``) and asked by the sessions with names as they come off the
wire (bytes); docs/permissions.md has the rules. Under ``auth = "none"`` every client holds
:attr:`Permissions.ALL`, whose answers cost one attribute lookup; a user's answers are
cached per name, in a bounded cache, so the data path pays one dict lookup per run.
"""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Callable, Iterable
from typing import ClassVar, Final

__all__ = ["KINDS", "Permissions"]

# The permission kinds a rule may name (fq-admin checks against this too).
KINDS: Final = ("publish", "consume", "queue", "peer", "admin")
# Names remembered per kind before the cache starts over.
CACHE_LIMIT: Final = 4096


def _compile(patterns: list[str]) -> Callable[[bytes], bool]:
    """One regular expression for a list of globs: a name matches if any glob does."""
    if not patterns:
        return lambda name: False
    # fnmatch.translate works on text; names are bytes and may be any bytes, so both
    # are matched over latin-1 (one character per byte, every byte valid), a pattern
    # as its UTF-8 bytes: "ä*" matches the name b"\xc3\xa4..." a client sends for it.
    texts = (p.encode("utf-8", "surrogateescape").decode("latin-1") for p in patterns)
    regex = "|".join(f"(?:{fnmatch.translate(t)})" for t in texts)
    match = re.compile(regex, re.DOTALL).match
    return lambda name: match(name.decode("latin-1")) is not None


def _kind(allow: list[str], deny: list[str]) -> Callable[[bytes], bool]:
    """The answer for one kind's allow and deny globs, cached per name.

    A closure rather than an object with ``__call__``: the data path calls it once per
    run, and a plain function call is the cheaper of the two.
    """
    allowed = _compile(allow)
    denied = _compile(deny)
    cache: dict[bytes, bool] = {}

    def check(name: bytes) -> bool:
        answer = cache.get(name)
        if answer is None:
            answer = not denied(name) and allowed(name)
            if len(cache) >= CACHE_LIMIT:
                cache.clear()
            cache[name] = answer
        return answer

    return check


def _always(name: bytes) -> bool:
    return True


class Permissions:
    ALL: ClassVar[Permissions]

    __slots__ = ("admin", "may_attach", "may_consume", "may_peer", "may_publish", "rules")

    def __init__(
        self,
        admin: bool,
        publish: Callable[[bytes], bool],
        consume: Callable[[bytes], bool],
        attach: Callable[[bytes], bool],
        rules: tuple[tuple[str, str, bool], ...] = (),
        peer: bool | None = None,
    ) -> None:
        self.admin = admin
        # Whether its data socket's messages in peer mode keep the sender and hops they
        # carry; without it they are the user's own (docs/permissions.md). None: admin's.
        self.may_peer = admin if peer is None else peer
        # Plain attributes holding callables, so a call is one lookup, no dispatch.
        self.may_publish = publish
        self.may_consume = consume
        self.may_attach = attach
        self.rules = rules

    @classmethod
    def from_rules(cls, rules: Iterable[tuple[str, str, bool]]) -> Permissions:
        """Build from ``(kind, pattern, allow)`` rows; an unknown kind raises ValueError."""
        rows = tuple((kind, pattern, bool(allow)) for kind, pattern, allow in rules)
        allow: dict[str, list[str]] = {kind: [] for kind in KINDS}
        deny: dict[str, list[str]] = {kind: [] for kind in KINDS}
        for kind, pattern, allowed in rows:
            if kind not in allow:
                raise ValueError(f"unknown permission kind {kind!r} (one of {', '.join(KINDS)})")
            (allow if allowed else deny)[kind].append(pattern)
        # admin: an allowing admin rule that no admin deny rule cancels.
        admin = bool(allow["admin"]) and not deny["admin"]
        if admin:
            return cls(True, _always, _always, _always, rows)
        return cls(
            False,
            _kind(allow["publish"], deny["publish"]),
            _kind(allow["consume"], deny["consume"]),
            _kind(allow["queue"], deny["queue"]),
            rows,
            # Like admin, a right over the whole connection, not per name.
            peer=bool(allow["peer"]) and not deny["peer"],
        )

    @property
    def everything(self) -> bool:
        """True when every question is answered yes without looking (admin or ALL)."""
        return self.may_publish is _always

    def __repr__(self) -> str:
        return f"Permissions(admin={self.admin}, peer={self.may_peer}, rules={list(self.rules)!r})"


# Under auth = "none" every client may do everything, as with fqd.
Permissions.ALL = Permissions(True, _always, _always, _always)
