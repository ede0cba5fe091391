"""From a Lumberjack event to an fq message's route and sender.

Route template syntax (docs/lumberjack.md, "Routes"):

- literal text, copied as is, around any number of groups in braces: ``beats.{...}.x``;
  ``{{`` and ``}}`` are literal braces;
- a group is a fallback chain: alternatives separated by ``|``, tried left to right, the
  first that yields a value wins; spaces around an alternative are ignored;
- an alternative is a field path, dotted into nested objects (``@metadata.beat`` reads
  ``{"@metadata": {"beat": ...}}``; a key that itself holds dots, such as a v1 ``D`` pair
  named ``fields.type`` or a flattened ``"event.dataset"`` key, matches too, the longest
  key first), or a constant in single quotes (``'lumberjack'``, which always yields; it
  may hold anything but a single quote);
- a field yields its value when it is a non-empty string, a number (``42``, ``1.5``) or a
  boolean (``true``/``false``); null, ``""``, objects, lists and a missing field fall
  through to the next alternative; a group where nothing yields renders as nothing.

The rendered route is UTF-8, cut to fq's 127-byte limit on a character boundary.

A version-2 payload is parsed only when the template reads a field, once per call, and
not at all when the payload's bytes cannot hold any of the template's keys (no ``"key``
text and no backslash escape). A payload that is not a JSON object has no fields: its
route is the template's constants.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Final

from fqbroker.core.frames import MAX_RK_LEN
from fqbroker.frontends.lumberjack.protocol import Event

__all__ = ["DEFAULT_ROUTE_TEMPLATE", "RouteTemplate", "cut_utf8", "sender_for"]

DEFAULT_ROUTE_TEMPLATE: Final = "{@metadata.beat|event.dataset|fields.type|type|'lumberjack'}"

_SENDER_PREFIX: Final = "lumberjack/"


def cut_utf8(data: bytes, limit: int = MAX_RK_LEN) -> bytes:
    """``data`` cut to at most ``limit`` bytes without splitting a UTF-8 character."""
    if len(data) <= limit:
        return data
    end = limit
    # Back off over continuation bytes (10xxxxxx) to the start of the cut character.
    while end > 0 and data[end] & 0xC0 == 0x80:
        end -= 1
    return data[:end]


def sender_for(remote_addr: str, remote_port: int) -> bytes:
    """``b"lumberjack/ip:port"`` (IPv6 in brackets), within fq's 127-byte limit."""
    host = f"[{remote_addr}]" if ":" in remote_addr else remote_addr
    return cut_utf8(f"{_SENDER_PREFIX}{host}:{remote_port}".encode())


class _Field:
    """One field path, with every way its dots can split into keys, longest key first."""

    __slots__ = ("parts", "path")

    def __init__(self, path: str) -> None:
        parts = path.split(".")
        if not path or any(p == "" for p in parts):
            raise ValueError(f"route template: empty key in field path {path!r}")
        self.path = path
        self.parts = parts

    def lookup(self, obj: Mapping[str, object]) -> object:
        return _lookup(obj, self.parts, 0)


def _lookup(obj: Mapping[str, object], parts: list[str], i: int) -> object:
    # Longest key first: "a.b.c" tries obj["a.b.c"], then obj["a.b"]["c"], then obj["a"][...].
    n = len(parts)
    for j in range(n, i, -1):
        key = parts[i] if j == i + 1 else ".".join(parts[i:j])
        if key in obj:
            value = obj[key]
            if j == n:
                if _render(value) is not None:
                    return value
            elif isinstance(value, dict):
                found = _lookup(value, parts, j)
                if found is not None:
                    return found
    return None


def _render(value: object) -> str | None:
    """The route text of a field's value, or None to fall through."""
    if isinstance(value, str):
        return value or None
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    return None


# A template is a list of pieces: literal text, or a chain of alternatives (a _Field, or a
# str constant).
_Chain = list[_Field | str]


def _parse(template: str) -> list[str | _Chain]:
    pieces: list[str | _Chain] = []
    text: list[str] = []
    i = 0
    n = len(template)
    while i < n:
        c = template[i]
        if c in "{}" and template.startswith(c * 2, i):
            text.append(c)
            i += 2
        elif c == "}":
            raise ValueError(f"route template: unmatched '}}' at {i} in {template!r}")
        elif c == "{":
            if text:
                pieces.append("".join(text))
                text = []
            chain, i = _parse_group(template, i + 1)
            pieces.append(chain)
        else:
            text.append(c)
            i += 1
    if text:
        pieces.append("".join(text))
    return pieces


def _parse_group(template: str, i: int) -> tuple[_Chain, int]:
    """Parse the alternatives after a '{' at ``i - 1``; return them and the index past '}'."""
    chain: _Chain = []
    start = i - 1
    n = len(template)
    while True:
        while i < n and template[i] == " ":
            i += 1
        if i < n and template[i] == "'":
            close = template.find("'", i + 1)
            if close < 0:
                raise ValueError(f"route template: unclosed quote at {i} in {template!r}")
            chain.append(template[i + 1 : close])
            i = close + 1
        else:
            j = i
            while j < n and template[j] not in "|}{'":
                j += 1
            path = template[i:j].strip()
            if not path:
                raise ValueError(
                    f"route template: empty alternative in the group at {start} of {template!r}"
                )
            chain.append(_Field(path))
            i = j
        while i < n and template[i] == " ":
            i += 1
        if i >= n:
            raise ValueError(f"route template: unclosed '{{' at {start} in {template!r}")
        if template[i] == "}":
            return chain, i + 1
        if template[i] != "|":
            raise ValueError(f"route template: unexpected {template[i]!r} at {i} in {template!r}")
        i += 1


class RouteTemplate:
    """A parsed route template (syntax in the module docstring); ``route`` renders one."""

    __slots__ = ("_constant", "_key_marks", "_pieces", "template")

    def __init__(self, template: str) -> None:
        self.template = template
        self._pieces = _parse(template)
        fields = [
            alt
            for piece in self._pieces
            if not isinstance(piece, str)
            for alt in piece
            if isinstance(alt, _Field)
        ]
        # A template without fields renders the same for every event.
        self._constant: bytes | None = None if fields else self._render({})
        # What a payload must contain to hold one of the fields: the first key's JSON text
        # without its closing quote (a longer dotted key starts the same way). A key written
        # with escapes needs a backslash, so a payload with neither cannot match.
        marks = {json.dumps(f.parts[0], ensure_ascii=False)[:-1].encode() for f in fields}
        self._key_marks = (*sorted(marks), b"\\")

    def __repr__(self) -> str:
        return f"RouteTemplate({self.template!r})"

    def route(self, event: Event) -> bytes:
        if self._constant is not None:
            return self._constant
        fields = event.fields
        if fields is not None:
            return self._render(fields)
        return self._render(self._parse_payload(event.payload))

    def _parse_payload(self, payload: bytes) -> dict[str, object]:
        if not any(mark in payload for mark in self._key_marks):
            return {}
        try:
            obj = json.loads(payload)
        except (ValueError, RecursionError):
            # Not JSON (or nested past the parser's depth): published as is, no fields.
            return {}
        return obj if isinstance(obj, dict) else {}

    def _render(self, obj: Mapping[str, object]) -> bytes:
        out: list[str] = []
        for piece in self._pieces:
            if isinstance(piece, str):
                out.append(piece)
                continue
            for alt in piece:
                if isinstance(alt, str):
                    out.append(alt)
                    break
                text = _render(alt.lookup(obj))
                if text is not None:
                    out.append(text)
                    break
        return cut_utf8("".join(out).encode())
