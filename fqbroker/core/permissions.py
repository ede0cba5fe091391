"""What one user may do: publish to, bind on (consume from) exchanges, attach to queues.

Sans-IO: built from the ``(kind, pattern, allow)`` rows the user store keeps for a user
(table ``fqbroker_permissions``), asked by the sessions with names as they come off the
wire (bytes). Patterns are fnmatch-style globs over names (``*``, ``logs.*``, an exact
name), matched case-sensitively. The rules, in order:

* the ``admin`` kind (pattern ``*``) grants everything;
* otherwise a ``deny`` rule that matches wins over any ``allow``;
* no matching ``allow`` means denied.

Under ``auth = "none"`` every client holds :attr:`Permissions.ALL`, whose answers are
constant ``True`` and cost one attribute lookup. A user's answers are cached per name so
the data path pays one dict lookup per run of messages to an exchange; the cache is
bounded (a client inventing exchange names cannot grow it without limit).
"""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Callable, Iterable
from typing import ClassVar, Final

__all__ = ["KINDS", "Permissions"]

# The permission kinds a rule may name (fq-admin checks against this too).
KINDS: Final = ("publish", "consume", "queue", "admin")
# Names remembered per kind before the cache starts over.
CACHE_LIMIT: Final = 4096


def _compile(patterns: list[str]) -> Callable[[bytes], bool]:
    """One regular expression for a list of globs: a name matches if any glob does."""
    if not patterns:
        return lambda name: False
    # fnmatch.translate works on text; names are bytes and may be any bytes, so the
    # patterns are matched over latin-1 (one character per byte, every byte valid).
    regex = "|".join(f"(?:{fnmatch.translate(p)})" for p in patterns)
    match = re.compile(regex, re.DOTALL).match
    return lambda name: match(name.decode("latin-1")) is not None


class _Kind:
    """The allow and deny globs of one kind, and the cached answer per name."""

    __slots__ = ("_allow", "_cache", "_deny")

    def __init__(self, allow: list[str], deny: list[str]) -> None:
        self._allow = _compile(allow)
        self._deny = _compile(deny)
        self._cache: dict[bytes, bool] = {}

    def __call__(self, name: bytes) -> bool:
        answer = self._cache.get(name)
        if answer is None:
            answer = not self._deny(name) and self._allow(name)
            if len(self._cache) >= CACHE_LIMIT:
                self._cache.clear()
            self._cache[name] = answer
        return answer


def _always(name: bytes) -> bool:
    return True


class Permissions:
    ALL: ClassVar[Permissions]

    __slots__ = ("admin", "may_attach", "may_consume", "may_publish", "rules")

    def __init__(
        self,
        admin: bool,
        publish: Callable[[bytes], bool],
        consume: Callable[[bytes], bool],
        attach: Callable[[bytes], bool],
        rules: tuple[tuple[str, str, bool], ...] = (),
    ) -> None:
        self.admin = admin
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
            _Kind(allow["publish"], deny["publish"]),
            _Kind(allow["consume"], deny["consume"]),
            _Kind(allow["queue"], deny["queue"]),
            rows,
        )

    @property
    def everything(self) -> bool:
        """True when every question is answered yes without looking (admin or ALL)."""
        return self.may_publish is _always

    def __repr__(self) -> str:
        return f"Permissions(admin={self.admin}, rules={list(self.rules)!r})"


# Under auth = "none" every client may do everything, as with fqd.
Permissions.ALL = Permissions(True, _always, _always, _always)
