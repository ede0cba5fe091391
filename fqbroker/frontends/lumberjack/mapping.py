"""From a Lumberjack event to an fq message's route and sender.

A :class:`RouteTemplate` picks each event's route from its fields, with fallbacks and
constants (docs/lumberjack.md, "Routes"); :func:`sender_for` names the shipper. A
version-2 payload is parsed only as far as the template needs, so a template of constants
costs nothing per event.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Final

from fqbroker.core.frames import MAX_RK_LEN
from fqbroker.protocols.lumberjack.wire import Event

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
    """One field path: its keys, every dotted run of them, and its first key's JSON text."""

    __slots__ = ("joined", "mark", "n", "path", "slash")

    def __init__(self, path: str) -> None:
        parts = path.split(".")
        if not path or any(p == "" for p in parts):
            raise ValueError(f"route template: empty key in field path {path!r}")
        self.path = path
        self.n = len(parts)
        # joined[i][j] is the key "parts[i]. ... .parts[j-1]", built once, not per event.
        self.joined = [
            {j: ".".join(parts[i:j]) for j in range(i + 1, self.n + 1)} for i in range(self.n)
        ]
        # Every top-level key this path can start with begins '"' and the first key (a
        # longer dotted key starts the same way): the shortcut (top) looks for that text.
        mark = '"' + parts[0]
        # None for a key needing JSON escapes: its payloads are always parsed.
        self.mark = mark if json.dumps(parts[0], ensure_ascii=False) == mark + '"' else None
        self.slash = "/" in parts[0]

    def lookup(self, obj: Mapping[str, object], i: int = 0) -> str | None:
        """The route text of this path in ``obj`` (from key ``i`` on), or None."""
        # Longest key first: "a.b.c" tries obj["a.b.c"], obj["a.b"]["c"], obj["a"]["b.c"],
        # obj["a"]["b"]["c"]; a value that cannot be rendered lets the next one try.
        keys = self.joined[i]
        n = self.n
        for j in range(n, i, -1):
            key = keys[j]
            if key in obj:
                value = obj[key]
                if j == n:
                    text = _render(value)
                    if text is not None:
                        return text
                elif isinstance(value, dict):
                    text = self.lookup(value, j)
                    if text is not None:
                        return text
        return None

    def top(self, text: str) -> Mapping[str, object] | None:
        """The payload's top-level pairs this path can read, without parsing the rest.

        ``text`` is the payload decoded. Returns ``{}`` when it cannot hold the path,
        ``{key: value}`` for the one top-level key that can, or None when that cannot be
        told cheaply (the caller then parses the whole payload). The shortcut holds when
        the key comes after only flat pairs (strings without escapes, numbers, literals)
        and its first key's text occurs nowhere else: then it is the one candidate, at the
        top level, and only its value is parsed.
        """
        mark = self.mark
        if mark is None:
            return None
        k = text.find(mark)
        # The only escapes that can spell a key without '"' or '\\' in it: \uXXXX, and \/
        # for a '/'. Without them past ``k`` the mark's text is every spelling of the key.
        # (A one-character find is much faster than a two-character one: look for "\\" first.)
        at = max(k, 0)
        escaped = text.find("\\", at) >= 0 and (
            text.find("\\u", at) >= 0 or (self.slash and text.find("\\/", at) >= 0)
        )
        if k < 0:
            return None if escaped else _EMPTY
        # Before it only '{' and flat pairs (no bracket, escape or control character, the
        # strings whole, so the mark's quote opens a string); after it no other candidate.
        flat = _FLAT_PREFIX.match(text, 0, k)
        if escaped or flat is None or flat.end() != k or text.find(mark, k + 1) >= 0:
            return None
        start = k + 1
        end = text.find('"', start)
        if end < 0 or text.find("\\", start, end) >= 0:
            return None
        after = text[start + len(mark) - 1]
        if after != '"' and after != ".":
            return _EMPTY  # a longer key ("@metadatax"): the path's key is nowhere
        if text.startswith(":", end + 1) and not text.startswith(_WS_CHARS, end + 2):
            # Compact JSON, as shippers write it.
            value_at = end + 2
        else:
            m = _COLON.match(text, end + 1)
            if m is None:
                # A string value, not a key: being the one occurrence, the key is nowhere.
                return _EMPTY if _AFTER_VALUE.match(text, end + 1) else None
            value_at = m.end()
        try:
            value = _DECODER.raw_decode(text, value_at)[0]
        except (ValueError, RecursionError):
            return None
        return {text[start:end]: value}


# '{' and then anything but a bracket, an escape or a control character, strings whole:
# the text before the key is flat top-level pairs.
_FLAT_PREFIX = re.compile('[{](?:[^][{}"\\\\\x00-\x1f]+|"[^"\\\\\x00-\x1f]*")*')
_WS_CHARS = (" ", "\t", "\n", "\r")
_COLON = re.compile("[ \t\n\r]*:[ \t\n\r]*")
_AFTER_VALUE = re.compile("[ \t\n\r]*[,}]")


_EMPTY: Mapping[str, object] = {}
_DECODER = json.JSONDecoder()


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
    """A parsed route template; :meth:`route` renders one event's route.

    Syntax (docs/lumberjack.md, "Routes"):

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

    __slots__ = ("_constant", "_pieces", "template")

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
        self._constant: bytes | None = None if fields else self._render_fields({})

    def __repr__(self) -> str:
        return f"RouteTemplate({self.template!r})"

    def route(self, event: Event) -> bytes:
        if self._constant is not None:
            return self._constant
        fields = event.fields
        if fields is not None:
            return self._render_fields(fields)
        return self._render_payload(event.payload)

    def _render_fields(self, obj: Mapping[str, object]) -> bytes:
        out: list[str] = []
        for piece in self._pieces:
            if isinstance(piece, str):
                out.append(piece)
                continue
            for alt in piece:
                if isinstance(alt, str):
                    out.append(alt)
                    break
                text = alt.lookup(obj)
                if text is not None:
                    out.append(text)
                    break
        return cut_utf8("".join(out).encode())

    def _render_payload(self, payload: bytes) -> bytes:
        # Each field first tries its shortcut (_Field.top); the first one that cannot tell
        # parses the whole payload, once, for itself and every field after it.
        parsed: Mapping[str, object] | None = None
        text = ""
        if payload[:1] == b"{":
            try:
                text = payload.decode()
            except UnicodeDecodeError:
                parsed = _parse_object(payload)
        else:  # leading space, a BOM, another encoding, not an object: json.loads decides
            parsed = _parse_object(payload)
        out: list[str] = []
        for piece in self._pieces:
            if isinstance(piece, str):
                out.append(piece)
                continue
            for alt in piece:
                if isinstance(alt, str):
                    out.append(alt)
                    break
                if parsed is None:
                    top = alt.top(text)
                    if top is None:
                        parsed = _parse_object(text)
                        top = parsed
                else:
                    top = parsed
                value = alt.lookup(top)
                if value is not None:
                    out.append(value)
                    break
        return cut_utf8("".join(out).encode())


def _parse_object(data: str | bytes) -> Mapping[str, object]:
    try:
        obj = json.loads(data)
    except (ValueError, RecursionError):
        # Not JSON (or nested past the parser's depth): published as is, no fields.
        return _EMPTY
    return obj if isinstance(obj, dict) else _EMPTY
