"""A set of byte-string prefixes answering "which of them start this route?" fast.

fqd keeps rules in an 8-byte prefix jump table (fqd_routemgr.c); the router indexes its
``prefix:`` bindings here instead, at one bisect and a short walk a lookup however many
prefixes there are and however many lengths they have (:class:`PrefixIndex` says how).
"""

from __future__ import annotations

import bisect
from collections.abc import Iterator
from typing import Generic, TypeVar

__all__ = ["PrefixIndex"]

T = TypeVar("T")


class PrefixIndex(Generic[T]):
    """Prefixes kept sorted, each remembering its *parent*: the longest other prefix in
    the set that it starts with.

    For a route R, let p be the largest prefix that sorts <= R (one bisect). Every prefix
    q of R lies between q and R in sort order, so q also starts p: the prefixes of R are
    exactly p's chain of parents from the first one that R starts with. A lookup is one
    bisect plus a walk up a chain no longer than the nesting of prefixes.
    """

    def __init__(self) -> None:
        self._keys: list[bytes] = []
        self._items: dict[bytes, list[T]] = {}
        self._parent: dict[bytes, bytes | None] = {}

    def __len__(self) -> int:
        return len(self._keys)

    def add(self, prefix: bytes, item: T) -> None:
        bucket = self._items.get(prefix)
        if bucket is not None:
            bucket.append(item)
            return
        self._parent[prefix] = self._longest_in(prefix)
        keys = self._keys
        i = bisect.bisect_left(keys, prefix)
        keys.insert(i, prefix)
        self._items[prefix] = [item]
        # Prefixes that extend the new one and had a shorter parent now hang below it.
        n = len(prefix)
        parents = self._parent
        for key in self._extensions(i + 1, prefix):
            parent = parents[key]
            if parent is None or len(parent) < n:
                parents[key] = prefix

    def remove(self, prefix: bytes, item: T) -> None:
        bucket = self._items[prefix]
        bucket.remove(item)
        if bucket:
            return
        del self._items[prefix]
        keys = self._keys
        i = bisect.bisect_left(keys, prefix)
        del keys[i]
        parents = self._parent
        grandparent = parents.pop(prefix)
        for key in self._extensions(i, prefix):
            if parents[key] == prefix:
                parents[key] = grandparent

    def _extensions(self, start: int, prefix: bytes) -> Iterator[bytes]:
        keys = self._keys
        for i in range(start, len(keys)):
            key = keys[i]
            if not key.startswith(prefix):
                return
            yield key

    def _longest_in(self, route: bytes) -> bytes | None:
        """The longest prefix in the set that ``route`` starts with."""
        i = bisect.bisect_right(self._keys, route) - 1
        if i < 0:
            return None
        p: bytes | None = self._keys[i]
        parents = self._parent
        while p is not None and not route.startswith(p):
            p = parents[p]
        return p

    def matching(self, route: bytes) -> list[list[T]]:
        """The item lists of every prefix ``route`` starts with, longest prefix first."""
        p = self._longest_in(route)
        out = []
        items, parents = self._items, self._parent
        while p is not None:
            out.append(items[p])
            p = parents[p]
        return out
