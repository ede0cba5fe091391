"""Route-program compiler and rule functions (fqbroker/core/program.py;
docs/fq-protocol.md §2.2-2.4): accepted and rejected programs, escapes, matching and
canonical text. Property tests and the rule registry are in test_program_*.py beside it."""

from __future__ import annotations

import math

import pytest

from fqbroker.core.message import Message
from fqbroker.core.program import (
    MAX_PROGRAM_LEN,
    And,
    Call,
    Or,
    Rule,
    RuleRegistry,
    compile_program,
)
from fqbroker.errors import ProgramError


def _never(msg: Message, *args: object) -> bool:
    raise AssertionError("a rule built by the test is never evaluated")


def c(name: str, *args: bytes | float) -> Call:
    """An expected call node; Call equality ignores the resolved function."""
    return Call(name, args, _never)


TRUE = c("true")


def matches(program: bytes, route: bytes, payload: bytes = b"") -> bool:
    """What the router does: prefix, then exactness, then the rule."""
    p = compile_program(program)
    msg = Message(b"ex", route, payload)
    return route.startswith(p.prefix) and (not p.exact or route == p.prefix) and p.evaluate(msg)


# --- docs/fq-protocol.md §2.2: accepted and rejected programs ----------------------------------

ACCEPTED: list[tuple[bytes, bool, bytes, Rule]] = [
    # what fqd was seen to accept or refuse (docs/fq-protocol.md §2.2)
    (b"prefix:", False, b"", TRUE),
    (b"prefix:bla", False, b"bla", TRUE),
    (b'prefix:"bla"', False, b"bla", TRUE),
    (b"exact:abc", True, b"abc", TRUE),
    (b"prefix: true()", False, b"", TRUE),
    (
        b'prefix:x (route_contains("a") && payload_prefix("b"))',
        False,
        b"x",
        And(c("route_contains", b"a"), c("payload_prefix", b"b")),
    ),
    (
        b'prefix:x (route_contains("a") || payload_prefix("b"))',
        False,
        b"x",
        Or(c("route_contains", b"a"), c("payload_prefix", b"b")),
    ),
    (
        b'prefix:x ((route_contains("a") && true()) || payload_contains("c"))',
        False,
        b"x",
        Or(And(c("route_contains", b"a"), TRUE), c("payload_contains", b"c")),
    ),
    (b"prefix:y sample(0.5)", False, b"y", c("sample", 0.5)),
    (b"prefix:" + b"a" * 120, False, b"a" * 120, TRUE),  # 127 bytes
    # separators and whitespace
    (b"exact:", True, b"", TRUE),
    (b'prefix:"a b" true()', False, b"a b", TRUE),
    (b'prefix:"a"true()', False, b"a", TRUE),  # nothing needed after a closing quote
    (b'prefix:"a"\n\t sample(1)', False, b"a", c("sample", 1.0)),
    (b"prefix:a true()  \t\r\n", False, b"a", TRUE),
    (b"prefix:a   ", False, b"a", TRUE),
    (b"prefix:x\ttrue()", False, b"x\ttrue()", TRUE),  # only ' ' ends an unquoted prefix
    (b'prefix:ab"c', False, b'ab"c', TRUE),  # a quote only opens a quoted prefix first
    (b"prefix:x (true()&&true())", False, b"x", And(TRUE, TRUE)),
    (b"prefix:x (  true()  ||  true()  )", False, b"x", Or(TRUE, TRUE)),
    (b"prefix:x sample ( 0.5 )", False, b"x", c("sample", 0.5)),
    (b"prefix:x true( )", False, b"x", TRUE),
    (
        b"prefix: (((true() && true()) || (true() && true())) && true())",
        False,
        b"",
        And(Or(And(TRUE, TRUE), And(TRUE, TRUE)), TRUE),
    ),
    # NUL ends the program (the field is a C string) before the length is checked
    (b"prefix:a\0 garbage", False, b"a", TRUE),
    (b'prefix:x route_contains("a")\0)', False, b"x", c("route_contains", b"a")),
    (b"prefix:" + b"a" * 120 + b"\0" + b"x" * 1000, False, b"a" * 120, TRUE),
    # bytes that are not UTF-8 are fine anywhere a string may be
    (b"prefix:\xff\xfe true()", False, b"\xff\xfe", TRUE),
    (b'prefix: route_contains("\xc3(")', False, b"", c("route_contains", b"\xc3(")),
]


@pytest.mark.parametrize(("text", "exact", "prefix", "rule"), ACCEPTED)
def test_accepted(text: bytes, exact: bool, prefix: bytes, rule: Rule) -> None:
    p = compile_program(text)
    assert (p.exact, p.prefix, p.rule) == (exact, prefix, rule)
    assert p.text == text.split(b"\0")[0]


REJECTED: list[tuple[bytes, str]] = [
    # what fqd was seen to accept or refuse (docs/fq-protocol.md §2.2)
    (b"nonsense", "must start with"),
    (b"prefix:x no_such_function()", "unknown function no_such_function()"),
    (b'prefix:x (route_contains("a"))', "needs && or ||"),  # quirk 1, copied
    (b"prefix:x route_contains(true)", "boolean"),  # quirk 2, copied
    (b'prefix:x route_contains("")', "unterminated string"),  # quirk 4, copied
    (b"prefix:" + b"a" * 121, "128 bytes"),
    (b'prefix:"abc', "unterminated quoted prefix"),
    (b"prefix:a true() x", "trailing text"),
    # more of the same
    (b"", "must start with"),
    (b" prefix:", "must start with"),
    (b"PREFIX:a", "must start with"),
    (b"prefix", "must start with"),
    (b'prefix:"a b', "unterminated quoted prefix"),
    (b"prefix:x ((true() && true()))", "needs && or ||"),
    (b"prefix:x route_contains(false)", "boolean"),
    (b"prefix:x (true() |x true())", '"&&" or "||"'),  # quirk 3, fixed
    (b"prefix:x (true() x| true())", '"&&" or "||"'),
    (b"prefix:x (true() | true())", '"&&" or "||"'),
    (b"prefix:x (true() & true())", '"&&" or "||"'),
    (b"prefix:x (true() true())", '"&&" or "||"'),
    (b"prefix:x (true() && true()", 'expected ")"'),
    (b"prefix:x (true() && )", "function name"),
    (b"prefix:x (true() &&", "function name"),
    (b"prefix:x ()", "function name"),
    (b"prefix:x (", "function name"),
    (b"prefix:x true", '"("'),
    (b"prefix:x true(", "argument"),
    (b"prefix:x 1true()", "function name"),
    (b"prefix:x true() true()", "trailing text"),
    (b"prefix:x true() && true()", "trailing text"),
    (b"prefix:x true())", "trailing text"),
    (b'prefix:x route_contains("a",)', "argument"),
    (b'prefix:x route_contains(,"a")', "argument"),
    (b'prefix:x route_contains("a" "b")', '"," or ")"'),
    (b"prefix:x route_contains(a)", "argument"),
    (b'prefix:x route_contains("a', "unterminated string"),
    (b'prefix:x route_contains("a\\")', "unterminated string"),  # \" is kept, not a quote
    (b'prefix:x route_contains("a\\', "unterminated string"),
    (b'prefix:x route_contains("""")', '"," or ")"'),
    (b"prefix:x route_contains(1)", "unknown function route_contains(d)"),
    (b'prefix:x sample("0.5")', "unknown function sample(s)"),
    (b'prefix:x route_contains("a", "b")', "unknown function route_contains(s, s)"),
    (b"prefix:x sample()", "unknown function sample()"),
    (b"prefix:x sample(0.5x)", '"," or ")"'),
]


@pytest.mark.parametrize(("text", "reason"), REJECTED)
def test_rejected(text: bytes, reason: str) -> None:
    with pytest.raises(ProgramError) as info:
        compile_program(text)
    assert reason in str(info.value)


def test_error_positions() -> None:
    with pytest.raises(ProgramError) as info:
        compile_program(b"prefix:a true() x")
    assert info.value.position == 16
    with pytest.raises(ProgramError) as info:
        compile_program(b'prefix:"abc')
    assert info.value.position == 7
    with pytest.raises(ProgramError) as info:
        compile_program(b"prefix:x nope(1)")
    assert info.value.position == 9


def test_program_limit_counts_the_whole_program() -> None:
    rule = b" true()"
    fits = b"prefix:" + b"a" * (MAX_PROGRAM_LEN - 7 - len(rule)) + rule
    assert len(fits) == 127
    assert compile_program(fits).prefix == b"a" * (127 - 7 - len(rule))
    with pytest.raises(ProgramError):
        compile_program(fits + b" ")  # even trailing whitespace counts
    with pytest.raises(ProgramError):
        compile_program(b"prefix:" + b"x" * 65536)


# --- escapes -------------------------------------------------------------------------------

PREFIX_ESCAPES = [
    (b'"a\\.b"', b"a.b"),  # quirk 5, fixed: C gives "ab"
    (b'"a\\"b"', b'a"b'),
    (b'"a\\\\b"', b"a\\b"),
    (b'"\\x41"', b"A"),  # same as C for decimal digits
    (b'"\\x4a\\x4A"', b"JJ"),  # quirk 5, fixed: C computes (4<<4)|('a'-'0'), "q"
    (b'"\\xff"', b"\xff"),
    (b'"a\\x00b"', b"a\0b"),
    (b'"\\xg1"', b"xg1"),  # no two hex digits: a plain \x, that is "x"
    (b'"\\x4"', b"x4"),
    (b"a\\ b", b"a b"),  # an escaped space does not end an unquoted prefix
    (b"a\\", b"a\\"),  # a backslash with nothing after it is itself
    (b"\\x41b", b"Ab"),
    (b'\\"q', b'"q'),
]


@pytest.mark.parametrize(("source", "prefix"), PREFIX_ESCAPES)
def test_prefix_escapes(source: bytes, prefix: bytes) -> None:
    assert compile_program(b"prefix:" + source).prefix == prefix


STRING_ESCAPES = [
    (b'"a"', b"a"),
    (b'"a b,) && x"', b"a b,) && x"),
    (b'"a\\\\b"', b"a\\b"),
    (b'"a\\nb\\rc\\td"', b"a\nb\rc\td"),
    (b'"a\\"b"', b'a\\"b'),  # quirk 4, copied: other pairs are kept whole [obs]
    (b'"a\\qb"', b"a\\qb"),
    (b'"\\x41"', b"\\x41"),  # no hex escapes in arguments
    (b'"a\\0b"', b"a"),  # quirk 4, copied: \0 ends the C string
    (b'"\\0"', b""),
    (b'"""', b'"'),  # quirk 4, copied: the first character is never the terminator
    (b'"\\\\"', b"\\"),
]


@pytest.mark.parametrize(("source", "value"), STRING_ESCAPES)
def test_string_arguments(source: bytes, value: bytes) -> None:
    p = compile_program(b"prefix: route_contains(" + source + b")")
    assert p.rule == c("route_contains", value)


NUMBERS = [
    (b"0.5", 0.5),
    (b"10", 10.0),
    (b"-3", -3.0),
    (b"+.5", 0.5),
    (b"5.", 5.0),
    (b"1e3", 1000.0),
    (b"1E+2", 100.0),
    (b"2.5e-1", 0.25),
    (b"0x10", 16.0),
    (b"-0X1f", -31.0),
    (b"0x1p-2", 0.25),
    (b"0x.8", 0.5),
    (b"0x1p99999", math.inf),
    (b"1e999", math.inf),
    (b"inf", math.inf),
    (b"-Infinity", -math.inf),
    (b"INF", math.inf),
    (b"nan", math.nan),
    (b"NaN(123abc)", math.nan),
]


@pytest.mark.parametrize(("source", "value"), NUMBERS)
def test_number_arguments(source: bytes, value: float) -> None:
    p = compile_program(b"prefix: sample(" + source + b")")
    assert isinstance(p.rule, Call)
    (got,) = p.rule.args
    assert isinstance(got, float)
    assert got == value or (math.isnan(value) and math.isnan(got))


@pytest.mark.parametrize(
    "source",
    [
        b"1e",
        b"0x",
        b"0x1p",
        b"--1",
        b"1..2",
        b"1_000",
        b".",
        b"e5",
        b"+",
        b"- 1",
        b"nanx",
        b"infinit",
        b"0b1",
    ],
)
def test_bad_numbers(source: bytes) -> None:
    with pytest.raises(ProgramError):
        compile_program(b"prefix: sample(" + source + b")")


def test_nan_arguments_compare_equal() -> None:
    a = compile_program(b"prefix: sample(nan)")
    b = compile_program(b"prefix: sample(-NAN(1))")
    assert a == b


def test_sixteen_arguments_at_most() -> None:
    registry = RuleRegistry()
    registry.register("any_of", "VA", lambda msg, *args: len(args) == 16)
    sixteen = b"prefix: any_of(" + b", ".join([b'"a"'] * 16) + b")"
    assert compile_program(sixteen, registry).evaluate(Message(b"", b"", b""))
    with pytest.raises(ProgramError, match="more than 16 arguments"):
        compile_program(b"prefix: any_of(" + b",".join([b"1"] * 17) + b")", registry)


# --- docs/fq-protocol.md §2.3: matching --------------------------------------------------------

MATCHING = [
    # the [obs] examples
    (b"prefix:fo", b"fo", b"", True),
    (b"prefix:fo", b"foo", b"", True),
    (b"prefix:fo", b"foo.bar", b"", True),
    (b"prefix:fo", b"fox", b"", True),
    (b"prefix:fo", b"f", b"", False),
    (b"prefix:fo", b"bar", b"", False),
    (b"exact:fo", b"fo", b"", True),
    (b"exact:fo", b"foo", b"", False),
    (b"exact:fo", b"f", b"", False),
    (b'prefix:"foo"', b"foo", b"", True),
    (b'prefix:"foo"', b"foo.bar", b"", True),
    (b'prefix:"foo"', b"fo", b"", False),
    (b'prefix:"a."', b"a", b"", False),
    (b'prefix:"a."', b"a.b", b"", True),
    # empty prefixes
    (b"prefix:", b"", b"", True),
    (b"prefix:", b"anything", b"", True),
    (b"exact:", b"", b"", True),
    (b"exact:", b"a", b"", False),
    # the functions of docs/fq-protocol.md §2.4
    (b'prefix: route_contains("b.c")', b"a.b.c.d", b"", True),
    (b'prefix: route_contains("x")', b"a.b.c.d", b"", False),
    (b'prefix: route_contains("\\0")', b"a", b"", True),  # the empty string is everywhere
    (b'prefix: payload_prefix("GET ")', b"r", b"GET /index", True),
    (b'prefix: payload_prefix("GET ")', b"r", b"POST /", False),
    (b'prefix: payload_prefix("GET ")', b"r", b"GET", False),
    (b'prefix: payload_contains("err")', b"r", b"an error", True),
    (b'prefix: payload_contains("err")', b"r", b"fine", False),
    (b"prefix: sample(1)", b"r", b"", True),
    (b"prefix: sample(0)", b"r", b"", False),
    # combinations, after the prefix check
    (b'prefix:a (route_contains("b") && payload_prefix("p"))', b"ab", b"pq", True),
    (b'prefix:a (route_contains("b") && payload_prefix("p"))', b"ab", b"qq", False),
    (b'prefix:a (route_contains("b") && payload_prefix("p"))', b"xb", b"pq", False),
    (b'prefix:a (route_contains("b") || payload_prefix("p"))', b"ax", b"pq", True),
    (b'prefix:a (route_contains("b") || payload_prefix("p"))', b"ax", b"qq", False),
    (b'exact:ab (route_contains("b") || sample(0))', b"ab", b"", True),
    (b'exact:ab (route_contains("b") || sample(0))', b"abb", b"", False),
]


@pytest.mark.parametrize(("program", "route", "payload", "expected"), MATCHING)
def test_matching(program: bytes, route: bytes, payload: bytes, expected: bool) -> None:
    assert matches(program, route, payload) is expected


def test_no_short_circuit() -> None:
    # Quirk 6, copied: both sides run whatever the left side said.
    seen: list[float] = []

    def probe(msg: Message, value: float) -> bool:
        seen.append(value)
        return bool(value)

    registry = RuleRegistry()
    registry.register("probe", "d", probe)
    msg = Message(b"ex", b"r", b"")
    assert compile_program(b"prefix: (probe(0) && probe(1))", registry).evaluate(msg) is False
    assert seen == [0.0, 1.0]
    seen.clear()
    assert compile_program(b"prefix: (probe(2) || probe(3))", registry).evaluate(msg) is True
    assert seen == [2.0, 3.0]
    seen.clear()
    nested = b"prefix: ((probe(0) && probe(1)) || (probe(2) || probe(3)))"
    assert compile_program(nested, registry).evaluate(msg) is True
    assert seen == [0.0, 1.0, 2.0, 3.0]


def test_sample_probability() -> None:
    p = compile_program(b"prefix: sample(0.25)")
    msg = Message(b"ex", b"r", b"")
    hits = sum(p.evaluate(msg) for _ in range(2000))
    assert 350 <= hits <= 650  # fq saw 513 of 2000 [obs]
    assert not any(compile_program(b"prefix: sample(0)").evaluate(msg) for _ in range(200))
    assert all(compile_program(b"prefix: sample(1)").evaluate(msg) for _ in range(200))


def test_always_true() -> None:
    assert compile_program(b"prefix:a").always_true
    assert compile_program(b"exact:a true()").always_true
    assert not compile_program(b"prefix:a (true() && true())").always_true
    assert not compile_program(b"prefix:a sample(1)").always_true
    registry = RuleRegistry()
    registry.register("true", "", lambda msg: False)  # a plugin may override a built-in
    overridden = compile_program(b"prefix:a", registry)
    assert not overridden.always_true
    assert not overridden.evaluate(Message(b"", b"a", b""))


# --- canonical text -------------------------------------------------------------------------

UNPARSE = [
    (b"prefix:", "prefix:"),
    (b"exact:abc  true()", "exact:abc"),
    (b'prefix:"abc"', "prefix:abc"),
    (b'prefix:"a b"', 'prefix:"a b"'),
    (b'prefix:"a\\"b\\\\c"', 'prefix:"a\\"b\\\\c"'),
    (b'prefix:\\"a', 'prefix:"\\"a"'),
    (b'prefix:"a\\x00"', 'prefix:"a\\x00"'),
    (b"prefix:x (true()&&sample( 0x10 ))", "prefix:x (true() && sample(16))"),
    (b"prefix:x ((true()||true())&&sample(.5))", "prefix:x ((true() || true()) && sample(0.5))"),
    (
        b'prefix: route_contains("a\\tb\\\\c\\"d\\qe")',
        'prefix: route_contains("a\\tb\\\\c\\"d\\\\qe")',
    ),
    (b'prefix: route_contains(""")', 'prefix: route_contains(""")'),
    (b'prefix: route_contains("\\0")', 'prefix: route_contains("\\0")'),
    (b"prefix: sample(-inf)", "prefix: sample(-inf)"),
    (b"prefix: sample(1e300)", "prefix: sample(1e+300)"),
]


@pytest.mark.parametrize(("text", "canonical"), UNPARSE)
def test_unparse(text: bytes, canonical: str) -> None:
    p = compile_program(text)
    assert p.unparse() == canonical
    assert compile_program(canonical.encode()) == p


def test_unparse_non_utf8() -> None:
    p = compile_program(b'prefix:\xff route_contains("\xfe")')
    text = p.unparse()
    assert compile_program(text.encode("utf-8", "surrogateescape")) == p
    assert p.source() == b'prefix:\xff route_contains("\xfe")'


def test_programs_compare_by_meaning() -> None:
    a = compile_program(b'prefix:"x" true()')
    b = compile_program(b"prefix:x")
    assert a == b and hash(a) == hash(b) and a.text != b.text
    assert a != compile_program(b"exact:x")
