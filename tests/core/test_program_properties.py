"""Property tests of the route-program compiler (fqbroker/core/program.py): any bytes
compile or raise ProgramError, and generated programs compile to their meaning and
round-trip through their canonical text."""

from __future__ import annotations

import contextlib
import math

import pytest
from hypothesis import event, given, settings
from hypothesis import strategies as st

from fqbroker.core.program import MAX_PROGRAM_LEN, And, Or, Program, Rule, compile_program
from fqbroker.errors import ProgramError
from tests.core.test_program import TRUE, c


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=200))
def test_any_bytes_compile_or_raise_program_error(text: bytes) -> None:
    with contextlib.suppress(ProgramError):
        compile_program(text)


TOKENS = [
    b"prefix:",
    b"exact:",
    b" ",
    b"\t",
    b"(",
    b")",
    b"&&",
    b"||",
    b"|",
    b"&",
    b",",
    b'"',
    b"\\",
    b"\\x4",
    b"\\0",
    b"\0",
    b"a",
    b"x.",
    b"true",
    b"()",
    b"route_contains",
    b"payload_prefix",
    b"sample",
    b"0.5",
    b"-1e3",
    b"0x1p",
    b"nan(",
    b"inf",
    b"\xff",
]


@settings(max_examples=300, deadline=None)
@given(
    st.sampled_from([b"prefix:", b"exact:", b""]), st.lists(st.sampled_from(TOKENS), max_size=30)
)
def test_token_soup_compiles_or_raises_program_error(head: bytes, tokens: list[bytes]) -> None:
    text = head + b"".join(tokens)
    try:
        p = compile_program(text)
    except ProgramError:
        event("rejected")
        return
    event("compiled")
    source = p.source()
    if len(source) <= MAX_PROGRAM_LEN:
        assert compile_program(source) == p


SAFE = "abcXYZ019._-/:@,()&|"
WS = st.sampled_from(["", " ", "  ", "\t", "\n "])
_STRING_ESCAPES = {"\\": "\\\\", "\n": "\\n", "\t": "\\t", '"': '\\"'}


def _string_arg(value: str) -> tuple[str, bytes]:
    src = "".join(_STRING_ESCAPES.get(ch, ch) for ch in value)
    return f'"{src}"', value.replace('"', '\\"').encode()  # \" is kept as both characters


NUMBER_ARGS = st.one_of(
    st.integers(-999, 999).map(lambda i: (str(i), float(i))),
    st.integers(0, 4095).map(lambda i: (hex(i), float(i))),
    st.floats(width=64, allow_nan=False).map(lambda f: (repr(f), f)),
    st.sampled_from([("NaN", math.nan), ("-INF", -math.inf), (".5", 0.5), ("1e3", 1e3)]),
)
STRING_ARGS = (
    st.text(SAFE + ' "\\\n\t', min_size=1, max_size=5)
    .filter(lambda s: s[0] != '"')
    .map(_string_arg)
)
CALLS = st.one_of(
    st.just(("true()", TRUE)),
    st.tuples(
        st.sampled_from(["route_contains", "payload_prefix", "payload_contains"]),
        STRING_ARGS,
        WS,
        WS,
    ).map(lambda t: (f"{t[0]}{t[2]}({t[1][0]}{t[3]})", c(t[0], t[1][1]))),
    st.tuples(NUMBER_ARGS, WS).map(lambda t: (f"sample({t[1]}{t[0][0]})", c("sample", t[0][1]))),
)


def _combine(kids: st.SearchStrategy[tuple[str, Rule]]) -> st.SearchStrategy[tuple[str, Rule]]:
    def build(t: tuple[tuple[str, Rule], str, tuple[str, Rule], str, str]) -> tuple[str, Rule]:
        (ls, lr), op, (rs, rr), w1, w2 = t
        node = And(lr, rr) if op == "&&" else Or(lr, rr)
        return f"({w1}{ls}{w2}{op}{w1}{rs}{w2})", node

    return st.tuples(kids, st.sampled_from(["&&", "||"]), kids, WS, WS).map(build)


RULES = st.recursive(CALLS, _combine, max_leaves=4)


def _escaped_prefix(draw: st.DrawFn, value: str, quoted: bool) -> str:
    out = []
    for ch in value:
        forms = [f"\\x{ord(ch):02x}", f"\\x{ord(ch):02X}"]
        if ch != "x":  # "\x" followed by two hex digits would be a hex escape
            forms.append("\\" + ch)
        if ch not in ' "\\' or (quoted and ch == " "):
            forms.append(ch)
        out.append(draw(st.sampled_from(forms)))
    return "".join(out)


@st.composite
def programs(draw: st.DrawFn) -> tuple[bytes, Program]:
    """A valid program's text, with random spacing and escapes, and its expected meaning."""
    exact = draw(st.booleans())
    quoted = draw(st.booleans())
    prefix = draw(st.text(SAFE + ' "\\', max_size=8))
    prefix_src = _escaped_prefix(draw, prefix, quoted)
    if quoted:
        prefix_src = f'"{prefix_src}"'
    rule = draw(st.none() | RULES)
    trailing = draw(WS)
    rule_src: str = ""
    rule_node: Rule = TRUE
    if rule is None:
        if not quoted and trailing:
            trailing = " " + trailing  # after an unquoted prefix only ' ' ends it
    else:
        rule_src, rule_node = rule
        rule_src = (draw(WS) if quoted else " " + draw(WS)) + rule_src
    head = "exact:" if exact else "prefix:"
    text = (head + prefix_src + rule_src + trailing).encode()
    return text, Program(text, exact, prefix.encode(), rule_node, False)


@settings(max_examples=300, deadline=None)
@given(programs())
def test_generated_programs_compile_and_round_trip(case: tuple[bytes, Program]) -> None:
    text, expected = case
    if len(text) > MAX_PROGRAM_LEN:
        event("over 127 bytes")
        with pytest.raises(ProgramError):
            compile_program(text)
        return
    p = compile_program(text)
    assert p == expected
    canonical = p.unparse()
    event(f"canonical form fits: {len(canonical.encode()) <= MAX_PROGRAM_LEN}")
    if len(canonical.encode()) <= MAX_PROGRAM_LEN:
        again = compile_program(canonical.encode())
        assert again == p
        assert again.unparse() == canonical
