"""The words of a web UI panel: the JSON a front end's ``Counters.panel`` returns.

The web UI draws any front end's panel from this JSON alone (web/js/ownpanels.js), so a
new front end's counters appear without a UI edit. Numbers travel raw, with the name of
their format, and are formatted in the page as the rest of the page formats them. The
shape of the JSON is drawn below the imports.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Literal

__all__ = ["Json", "Parts", "Text", "cell", "chip", "chips", "count", "head", "n", "plural", "tile"]

# The JSON, as web/js/ownpanels.js reads it:
#
#     panel  {"tiles": [tile], "chips": chips, "table": table,
#             "count": {"id", "text"}, "summary": {"text", "state": "ok"|"warn"}}
#     tile   {"label", "value": cell, "sub": cell, "warn": bool}
#     cell   {"field", "text", "value", "rate", "suffix", "class", "title", "chips"}
#     text   "plain words" | ["words", {"n": 3, "f": "int"}, ...]
#     chips  {"field", "items": [{"text", "title", "class", "data": {...}}], "empty"}
#     table  {"head": [{"text", "n": bool}], "key", "rows": [{"key", "cells": [cell]}]}
#
# A cell's "value" goes to its data-value (the hook tests and scripts read); one with
# "rate" shows that counter's rate per second between the page's polls instead.
Json = dict[str, Any]
Parts = list[str | Json]  # words and numbers, in order
Text = str | Parts

# How the page formats a number: "int" with thousands separators (compact from 10M),
# "bytes" in KiB/MiB..., "rate" as rates are, "percent" of a ratio to one decimal,
# "plain" as it is, "fixed1" with one decimal.
Format = Literal["int", "bytes", "rate", "percent", "plain", "fixed1"]


def n(value: int | float, fmt: Format = "int") -> Json:
    """A number in a text, formatted by the page."""
    return {"n": value, "f": fmt}


def plural(value: int, one: str, many: str) -> Parts:
    """``1 hit``, ``3 hits``."""
    return [n(value), " " + (one if value == 1 else many)]


def cell(
    field: str,
    text: Text,
    *,
    value: object = None,
    rate: int | None = None,
    suffix: str = "",
    cls: str = "",
    title: str = "",
) -> Json:
    """One value shown: ``value`` (None: none) is its raw number; ``rate`` a counter whose
    rate per second the page shows instead of ``text``, followed by ``suffix``."""
    out: Json = {"text": text}
    if field:
        out["field"] = field
    if value is not None:
        out["value"] = value
    if rate is not None:
        out["rate"] = rate
        out["suffix"] = suffix
    if cls:
        out["class"] = cls
    if title:
        out["title"] = title
    return out


def tile(label: str, value: Json, sub: Json | None = None, *, warn: bool = False) -> Json:
    out: Json = {"label": label, "value": value}
    if sub is not None:
        out["sub"] = sub
    if warn:
        out["warn"] = True
    return out


def chip(text: Text, title: Text, cls: str = "", data: Mapping[str, str] | None = None) -> Json:
    return {"text": text, "title": title, "class": cls, "data": dict(data or {})}


def chips(field: str, items: Iterable[Json], empty: str) -> Json:
    """A row of chips; the page shows the first few and how many more, or ``empty``."""
    return {"field": field, "items": list(items), "empty": empty}


def count(text: Text, element_id: str = "") -> Json:
    """The number beside the panel's title (``element_id``: its id in the page)."""
    out: Json = {"text": text}
    if element_id:
        out["id"] = element_id
    return out


def head(*columns: str | tuple[str, bool]) -> Sequence[Json]:
    """A table's head; a column given as ``(text, True)`` holds numbers."""
    return [
        {"text": c[0], "n": c[1]} if isinstance(c, tuple) else {"text": c, "n": False}
        for c in columns
    ]
