"""Routes and senders of Lumberjack events (docs/lumberjack.md, "Routes")."""

from __future__ import annotations

import json
from collections.abc import Mapping

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fqbroker.frontends.lumberjack import mapping
from fqbroker.frontends.lumberjack.mapping import (
    DEFAULT_ROUTE_TEMPLATE,
    RouteTemplate,
    cut_utf8,
    sender_for,
)
from fqbroker.protocols.lumberjack.wire import Event

DEFAULT = RouteTemplate(DEFAULT_ROUTE_TEMPLATE)


def v2(payload: bytes | str | dict[str, object]) -> Event:
    if isinstance(payload, dict):
        payload = json.dumps(payload)
    if isinstance(payload, str):
        payload = payload.encode()
    return Event(1, payload, None)


def v1(fields: dict[str, str]) -> Event:
    return Event(1, json.dumps(fields).encode(), fields)


@pytest.mark.parametrize(
    ("payload", "route"),
    [
        ({"@metadata": {"beat": "filebeat", "type": "_doc"}, "type": "x"}, b"filebeat"),
        ({"event": {"dataset": "nginx.access"}, "fields": {"type": "t"}}, b"nginx.access"),
        ({"fields": {"type": "app"}, "type": "x"}, b"app"),
        ({"type": "syslog", "message": "hi"}, b"syslog"),
        ({"message": "hi"}, b"lumberjack"),
        # Flattened dotted keys count, the longest key first.
        ({"event.dataset": "flat", "event": {"dataset": "nested"}}, b"flat"),
        ({"event.dataset": "", "event": {"dataset": "nested"}}, b"nested"),
        # Values that are not strings: numbers and booleans render, the rest falls through.
        ({"@metadata": {"beat": 7}}, b"7"),
        ({"@metadata": {"beat": 1.5}}, b"1.5"),
        ({"@metadata": {"beat": True}, "type": "x"}, b"true"),
        ({"@metadata": {"beat": None}, "type": "x"}, b"x"),
        ({"@metadata": {"beat": ""}, "type": "x"}, b"x"),
        ({"@metadata": {"beat": {"a": 1}}, "type": "x"}, b"x"),
        ({"@metadata": {"beat": ["a"]}, "type": "x"}, b"x"),
        ({"@metadata": "filebeat", "type": "x"}, b"x"),
        ({"type": "ünï"}, "ünï".encode()),
    ],
)
def test_default_chain_over_v2_payloads(payload: dict[str, object], route: bytes) -> None:
    assert DEFAULT.route(v2(payload)) == route


@pytest.mark.parametrize(
    "payload",
    [b"", b"not json", b"[1,2]", b'"str"', b"{", b'{"a": [}', b"\xff\xfe", b"[" * 100_000],
)
def test_payloads_that_are_not_objects_route_to_the_constant(payload: bytes) -> None:
    assert DEFAULT.route(v2(payload)) == b"lumberjack"


def test_broken_json_after_the_routed_field_is_not_checked() -> None:
    # Documented: the shortcut reads a flat prefix and the field's value, not the rest, so
    # a payload cut short after its routed field still routes by it (and is published as is).
    assert DEFAULT.route(v2(b'{"type": "x", "message": "cut sh')) == b"x"
    assert DEFAULT.route(v2(b'{"message": [1, "cut", {"type": "x"')) == b"lumberjack"


def test_v1_fields_are_read_flat_without_parsing_the_payload() -> None:
    event = Event(1, b"not even json", {"type": "syslog", "fields.type": "ft", "line": "x"})
    assert DEFAULT.route(event) == b"ft"
    assert DEFAULT.route(v1({"type": "syslog"})) == b"syslog"
    assert DEFAULT.route(v1({"line": "x"})) == b"lumberjack"


def test_literal_text_groups_and_escapes() -> None:
    t = RouteTemplate("beats.{@metadata.beat|'none'}.{{x}}.{ host.name | 'nohost' }")
    assert t.route(v2({"host": {"name": "web-1"}})) == b"beats.none.{x}.web-1"
    assert RouteTemplate("logs").route(v2(b"garbage")) == b"logs"
    assert RouteTemplate("{'a|b'}").route(v2({})) == b"a|b"
    # A group where nothing yields renders as nothing.
    assert RouteTemplate("x.{type}").route(v2({})) == b"x."
    assert RouteTemplate("").route(v2({})) == b""


@pytest.mark.parametrize(
    "bad", ["{", "}", "{}", "{a|}", "{|a}", "{a..b}", "{'x}", "{a'b'}", "{a}}", "x{a{b}}"]
)
def test_bad_templates_are_refused(bad: str) -> None:
    with pytest.raises(ValueError, match="route template"):
        RouteTemplate(bad)


def test_constant_templates_parse_nothing() -> None:
    t = RouteTemplate("logging.{'lumberjack'}")
    assert t.route(v2(b"[" * 100_000)) == b"logging.lumberjack"


def test_routes_are_cut_to_127_bytes_on_a_character_boundary() -> None:
    long = "é" * 100  # 200 bytes
    route = RouteTemplate("{type}").route(v2({"type": long}))
    assert len(route) == 126 and route.decode() == "é" * 63
    assert RouteTemplate("{type}").route(v2({"type": "x" * 500})) == b"x" * 127
    assert cut_utf8("aé€𝄞".encode(), 3) == b"a\xc3\xa9"
    assert cut_utf8("aé€𝄞".encode(), 5) == "aé".encode()
    assert cut_utf8("aé€𝄞".encode(), 6) == "aé€".encode()
    assert cut_utf8(b"abc", 3) == b"abc"


def test_sender_for_stays_within_fq_limits() -> None:
    assert sender_for("192.0.2.7", 5044) == b"lumberjack/192.0.2.7:5044"
    assert sender_for("::1", 40000) == b"lumberjack/[::1]:40000"
    long = sender_for("fe80::1%" + "x" * 200, 1)
    assert len(long) == 127 and long.startswith(b"lumberjack/[fe80::1%x")


# --- the shortcut reads what json.loads would ---------------------------------------------


class _Reference(RouteTemplate):
    """The same template, always parsing the whole payload: what the shortcut must match."""

    __slots__ = ()

    def route(self, event: Event) -> bytes:
        try:
            obj = json.loads(event.payload)
        except (ValueError, RecursionError):
            obj = {}
        return self._render_fields(obj if isinstance(obj, Mapping) else {})


KEYS = ["@metadata", "beat", "@metadata.beat", "event", "dataset", "event.dataset", "type", "x"]
scalars = st.one_of(
    st.text(alphabet='ab"\\\n{}[].é@', max_size=6),
    st.sampled_from(["@metadata", '"@metadata', "type", "beat"]),
    st.integers(-5, 5),
    st.floats(allow_nan=False, allow_infinity=False, width=32),
    st.booleans(),
    st.none(),
)


@st.composite
def raw_objects(draw: st.DrawFn, depth: int = 0) -> str:
    """JSON object text, duplicate keys and odd spacing included (json.dumps cannot)."""
    pairs = []
    for _ in range(draw(st.integers(0, 4))):
        key = json.dumps(draw(st.sampled_from(KEYS)), ensure_ascii=draw(st.booleans()))
        if draw(st.integers(0, 9)) == 0:
            key = key.replace("m", "\\u006d")  # a key spelled with an escape
        if depth < 2 and draw(st.booleans()):
            value = draw(raw_objects(depth + 1))
        else:
            value = json.dumps(draw(scalars))
        space = draw(st.sampled_from(["", " ", "\n"]))
        pairs.append(f"{key}{space}:{space}{value}")
    return "{" + ",".join(pairs) + "}"


@settings(max_examples=400, deadline=None)
@given(text=raw_objects())
def test_shortcut_routes_as_a_full_parse(text: str) -> None:
    for template in (DEFAULT_ROUTE_TEMPLATE, "{@metadata|x}.{event.dataset.x|event}.{type}"):
        assert RouteTemplate(template).route(v2(text)) == _Reference(template).route(v2(text))


def test_shortcut_is_taken_for_beats_events() -> None:
    text = '{"@timestamp":"2026-11-25T00:00:00Z","@metadata":{"beat":"filebeat"},"m":{"a":1}}'
    field = mapping._Field("@metadata.beat")
    assert field.top(text) == {"@metadata": {"beat": "filebeat"}}
    # Only \u (or \/ for a key with '/') can spell a key: other escapes keep the shortcut.
    assert field.top('{"message":"a \\"b\\"\\n","n":1}') == {}
    assert field.top('{"message":"\\u0040metadata"}') is None
    assert field.top('{"@metadata":{},"@\\u006detadata":"x"}') is None  # a duplicate key
    slash = mapping._Field("a/b")
    assert slash.top('{"x":"\\/"}') is None
    assert mapping._Field("ab").top('{"x":"\\/"}') == {}
    assert field.top('{"message":"plain"}') == {}
    assert field.top('{"a":{"@metadata":{}},"@metadata":{}}') is None  # nested: parse
