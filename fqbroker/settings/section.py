"""A front end's section of the settings file: its TOML table, declared once, read alike.

A front end with settings declares a :class:`Section` whose fields, each made by
:func:`setting`, are its table's keys with their types, defaults and one-line docs. One
parser reads every section, and the same declarations write ``fqd --print-config``'s
tables (:func:`sample`) and docs/cli.md's (:func:`reference`), as Vector's component
schemas write its docs. Also here for the front ends: :func:`listen_address`,
:class:`Flag`, and :class:`Claim` with :func:`refuse_shared`.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping
from dataclasses import MISSING, Field, dataclass, field, fields, replace
from pathlib import Path
from typing import Any, ClassVar, NamedTuple, Self, TypeVar

__all__ = [
    "Claim",
    "Flag",
    "Section",
    "check_positive",
    "listen_address",
    "reference",
    "refuse_shared",
    "sample",
    "setting",
]

Address = tuple[str, int]
# Wide enough for the longest heading of the sample file, dashes after it to this column.
HEADING_WIDTH = 95


def setting(
    default: Any = MISSING,
    doc: str = "",
    *,
    factory: Callable[[], Any] | None = None,
    comment: str | None = None,
    example: str = "",
    positive: bool = False,
    choices: tuple[str, ...] = (),
    parse: Callable[[Any], Any] | None = None,
) -> Any:
    """A field of a :class:`Section`, with what the parser, the sample file and the docs
    need of it.

    ``doc``: one line, for docs/cli.md. ``comment``: the sample file's comment above it
    (several lines; default ``doc``; "" for none, the field then follows the one before
    it directly). ``example``: for an optional path left unset, the value the sample file
    shows commented out. ``positive``: a number above 0. ``choices``: the strings it may
    be. ``parse``: turns a TOML value of a kind no type check knows (a table) into the
    field's value, raising ValueError.
    """
    metadata = {
        "doc": doc,
        "comment": comment,
        "example": example,
        "positive": positive,
        "choices": choices,
        "parse": parse,
    }
    if factory is not None:
        return field(default_factory=factory, metadata=metadata)
    return field(default=default, metadata=metadata)


def listen_address(what: str, listen: str, bind: str, default_port: int) -> Address | None:
    """A ``listen`` setting as an address: "HOST:PORT", "[V6]:PORT", "PORT" (on ``bind``)
    or "HOST:" (the protocol's ``default_port``); None when empty (off)."""
    text = listen.strip()
    if not text:
        return None
    host, sep, port = text.rpartition(":")
    if not sep:
        host, port = "", text
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    elif ":" in host:
        raise ValueError(f"{what} listen {text!r}: write an IPv6 address as [ADDR]:PORT")
    try:
        number = int(port) if port else default_port
    except ValueError:
        raise ValueError(f"{what} listen {text!r} is not HOST:PORT") from None
    if not 0 <= number <= 65535:
        raise ValueError(f"{what} listen {text!r}: port out of range")
    return (host or bind, number)


def check_positive(what: str, value: object, kind: type | tuple[type, ...] = int) -> None:
    """ValueError naming ``what`` unless ``value`` is a ``kind`` above 0 (never a bool)."""
    if not isinstance(value, kind) or isinstance(value, bool) or value <= 0:  # type: ignore[operator]
        noun = "integer" if kind is int else "number"
        raise ValueError(f"{what} must be a positive {noun}, not {value!r}")


class Section:
    """A front end's table of the settings file; subclasses are frozen dataclasses of
    :func:`setting` fields.

    ``NAME`` is the table (``[NAME]``); ``TITLE`` heads it in the sample file; ``PORT``
    is the port of a ``listen`` naming a host only; ``FOOTER`` is sample text after the
    fields (an example sub-table). A section whose front end has a port of its own has a
    ``listen`` field, off while empty.

    One parser reads every section (:meth:`updated`): unknown keys are refused naming the
    table, values are checked against the field's type (and its ``positive`` or
    ``choices``), paths become :class:`~pathlib.Path`, and "" turns an optional setting
    off; the section's own :meth:`check` adds the rules that tie fields together.
    """

    __slots__ = ()

    NAME: ClassVar[str]
    TITLE: ClassVar[str] = ""
    PORT: ClassVar[int] = 0
    FOOTER: ClassVar[str] = ""

    @classmethod
    def from_table(cls, table: object) -> Self:
        """The section of a TOML table; ValueError naming the table and the key for an
        unknown key or a value it cannot work with."""
        if not isinstance(table, Mapping):
            raise ValueError(f"{cls.NAME} must be a table, not {table!r}")
        return cls().updated(table)

    def updated(self, values: Mapping[str, Any]) -> Self:
        """A copy with ``values`` applied and checked."""
        made = replace(self, **_parsed(type(self), values))  # type: ignore[type-var]
        made.check()
        return made

    def check(self) -> None:
        """Raise ValueError for a combination of settings the front end cannot work with;
        a section that adds rules calls this one after them (``tls_key`` needs ``tls_cert``,
        and ``listen`` must parse)."""
        if getattr(self, "tls_key", None) is not None and getattr(self, "tls_cert", None) is None:
            raise ValueError(f"{self.NAME} tls_key needs tls_cert")
        if getattr(self, "listen", None):
            self.address("127.0.0.1")

    def address(self, bind: str) -> Address | None:
        """Where to listen, or None when off; a bare port listens on the broker's ``bind``."""
        return listen_address(self.NAME, getattr(self, "listen", None) or "", bind, self.PORT)


_DEFAULTS: dict[type[Section], Section] = {}


S = TypeVar("S", bound=Section)


def default_of(kind: type[S]) -> S:
    """The section with every default (made once: sections are immutable)."""
    made = _DEFAULTS.get(kind)
    if made is None:
        made = _DEFAULTS[kind] = kind()
    return made  # type: ignore[return-value]


# --- the generic parser -----------------------------------------------------------------------


def _kind(f: Field[Any]) -> tuple[str, bool]:
    """A field's type as its annotation spells it, and whether None is one of its values."""
    text = str(f.type).replace(" ", "")
    return text.removesuffix("|None"), text.endswith("|None")


_KINDS: dict[str, type | tuple[type, ...]] = {
    "int": int, "float": (int, float), "str": str, "bool": bool
}  # fmt: skip
_NOUNS = {"int": "an integer", "float": "a number", "str": "a string", "bool": "true or false"}


def _parsed(cls: type[Section], values: Mapping[str, Any]) -> dict[str, Any]:
    known = {f.name: f for f in fields(cls)}  # type: ignore[arg-type]
    if unknown := sorted(set(values) - set(known)):
        noun = "setting" if len(unknown) == 1 else "settings"
        raise ValueError(f"unknown {cls.NAME} {noun} {', '.join(map(repr, unknown))}")
    out = {}
    for key, value in values.items():
        f = known[key]
        base, optional = _kind(f)
        what = f"{cls.NAME} {key}"
        parse = f.metadata.get("parse")
        if value is None or (value == "" and optional):
            if not optional:
                continue  # None leaves a setting as it is
            value = None
        elif parse is not None:
            value = parse(value)
        elif base == "Path":
            if not isinstance(value, str | Path):
                raise ValueError(f"{what} must be a path, not {value!r}")
            value = Path(value)
        else:
            value = _checked(f, base, what, value)
        out[key] = value
    return out


def _checked(f: Field[Any], base: str, what: str, value: object) -> object:
    number = base in ("int", "float")
    if f.metadata.get("positive"):
        check_positive(what, value, int if base == "int" else (int, float))
        return value
    kinds: type | tuple[type, ...] | None = _KINDS.get(base)
    if kinds is not None and (not isinstance(value, kinds) or (number and isinstance(value, bool))):
        raise ValueError(f"{what} must be {_NOUNS[base]}, not {value!r}")
    if (choices := f.metadata.get("choices")) and value not in choices:
        listed = ", ".join(choices[:-1]) + f" or {choices[-1]}"
        raise ValueError(f"{what} must be {listed}, not {value!r}")
    return value


# --- flags and claims ------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Flag:
    """An fqd flag that sets one setting of its front end's section, as the table would."""

    option: str  # "--figg"
    setting: str  # the section's field it sets: "listen"
    metavar: str
    help: str


class Claim(NamedTuple):
    """An address a front end listens on. The front ends of the main port share its claim
    (``shared``); any other two on one address (not port 0) are refused."""

    transport: str  # "tcp" (TLS too) or "udp"
    host: str
    port: int
    owner: str  # the front end's name
    shared: bool = False  # the main port's, claimed by each front end sniffed on it


def refuse_shared(claims: Iterable[Claim]) -> None:
    """ValueError naming both when two front ends claim one address, before anything
    binds (Vector's ``resources()``); port 0 picks a free port, so it never collides."""
    owners: dict[tuple[str, str, int], list[Claim]] = {}
    for claim in claims:
        if claim.port != 0:
            owners.setdefault((claim.transport, claim.host, claim.port), []).append(claim)
    for (transport, host, port), claimed in owners.items():
        groups = dict.fromkeys(_who(c, claimed) for c in claimed)
        if len(groups) > 1:
            first, second = list(groups)[:2]
            where = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
            raise ValueError(
                f"{first} and {second} both claim {transport} {where}: give one another address"
            )


def _who(claim: Claim, claimed: list[Claim]) -> str:
    if not claim.shared:
        return claim.owner
    sharing = ", ".join(c.owner for c in claimed if c.shared)
    return f"the main port ({sharing})"


# --- the sample file and the docs ------------------------------------------------------------


def _toml(f: Field[Any], value: object) -> str:
    base, _ = _kind(f)
    if value is None:
        return '""'
    if isinstance(value, bool):
        return "true" if value else "false"
    if base == "float":
        return repr(float(value))  # type: ignore[arg-type]
    if isinstance(value, str | Path):
        return json.dumps(str(value))
    return str(value)


def _default(f: Field[Any]) -> object:
    if f.default is MISSING and callable(f.default_factory):
        return f.default_factory()
    return f.default


def sample(cls: type[Section]) -> str:
    """The section as ``fqd --print-config`` writes it: its heading, every setting with its
    comment and default (an unset path commented out with its example), then ``FOOTER``."""
    heading = f"# --- {cls.TITLE} "
    lines = [heading.ljust(HEADING_WIDTH, "-"), f"[{cls.NAME}]"]
    for n, f in enumerate(fields(cls)):  # type: ignore[arg-type]
        if f.metadata.get("parse") is not None:
            continue  # a table of tables: the FOOTER shows one
        comment = f.metadata.get("comment")
        if comment is None:  # the one-line doc, as a sentence
            doc = f.metadata.get("doc", "")
            comment = doc[:1].upper() + doc[1:] + ("." if doc else "")
        if comment and n:
            lines.append("")
        lines += [f"# {line}".rstrip() for line in comment.splitlines()]
        value = _default(f)
        if value is None and f.metadata.get("example"):
            lines.append(f"# {f.name} = {json.dumps(f.metadata['example'])}")
        else:
            lines.append(f"{f.name} = {_toml(f, value)}")
    text = "\n".join(lines) + "\n"
    return text + ("\n" + cls.FOOTER if cls.FOOTER else "")


def reference(cls: type[Section]) -> str:
    """The section's rows for docs/cli.md: | setting | default | meaning |."""
    rows = ["| setting | default | meaning |", "|---|---|---|"]
    for f in fields(cls):  # type: ignore[arg-type]
        value = _default(f)
        if f.metadata.get("parse") is not None:
            shown = "none"  # a table of tables
        elif value is None and f.metadata.get("example"):
            shown = "unset"
        else:
            shown = f"`{_toml(f, value)}`"
        rows.append(f"| `{f.name}` | {shown} | {f.metadata.get('doc', '')} |")
    return "\n".join(rows) + "\n"
