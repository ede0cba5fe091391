"""Route programs: ``prefix:``/``exact:`` plus a rule expression (fqd_routemgr.c, fqd_prog.c).

:func:`compile_program` turns a bind's program, such as ``prefix:"http."
(route_contains("a") && sample(0.1))``, into an immutable :class:`Program`: the prefix,
whether the route must equal it, and a tree of :class:`Rule` nodes whose leaves call rule
functions resolved once, by name and signature, through a :class:`RuleRegistry` (as fqd
looks up ``fqd_route_prog__<name>__<sig>``). The parser follows docs/fq-protocol.md §2.2
byte for byte; docs/programs.md says which of fqd's quirks are copied and which fixed.
"""

from __future__ import annotations

import importlib
import logging
import math
import random
import re
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Final, TypeGuard

from fqbroker.core.message import Message
from fqbroker.errors import ProgramError

__all__ = [
    "ENTRY_POINT_GROUP",
    "MAX_ARGS",
    "MAX_PROGRAM_LEN",
    "And",
    "Call",
    "Or",
    "Program",
    "Rule",
    "RuleFunction",
    "RuleRegistry",
    "compile_program",
    "default_registry",
]

logger = logging.getLogger(__name__)

MAX_PROGRAM_LEN: Final = 127  # the whole program, "prefix:" included (fqd_routemgr_compile)
MAX_ARGS: Final = 16  # MAX_VALNODE_ARGS; C overflows a stack array past it (quirk 7)
MAX_NAME_LEN: Final = 127  # a function name is read into a 128-byte buffer
ENTRY_POINT_GROUP: Final = "fqbroker.rules"

#: A rule function: ``fn(msg, *args) -> bool`` with strings as bytes and numbers as float.
RuleFunction = Callable[..., bool]
Arg = bytes | float

_WS: Final = frozenset(b" \t\n\v\f\r")  # C isspace() in the "C" locale
_BACKSLASH: Final = 0x5C
_QUOTE: Final = 0x22
_NAME: Final = re.compile(rb"[A-Za-z_][A-Za-z0-9_]*")
_NAME_STR: Final = re.compile(r"[A-Za-z_][A-Za-z0-9_]*", re.ASCII)
_HEX2: Final = re.compile(rb"[0-9A-Fa-f]{2}")
# The longest prefix C strtod() accepts. Alternation order matters: "0x" with no hex digit
# after it falls through to the decimal branch and yields 0, as strtod does.
_NUMBER: Final = re.compile(
    rb"""[+-]?(?:
        0[xX](?:[0-9A-Fa-f]+(?:\.[0-9A-Fa-f]*)?|\.[0-9A-Fa-f]+)(?:[pP][+-]?[0-9]+)?
      | (?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][+-]?[0-9]+)?
      | (?i:inf(?:inity)?|nan(?:\([0-9A-Za-z_]*\))?)
    )""",
    re.VERBOSE,
)
_ARG_ESCAPES: Final = {0x5C: b"\\", 0x30: b"\0", 0x6E: b"\n", 0x72: b"\r", 0x74: b"\t"}
_ARG_UNESCAPES: Final = {0x0A: b"\\n", 0x0D: b"\\r", 0x09: b"\\t"}


# --- rule trees ---------------------------------------------------------------------------


class Rule:
    """A node of a compiled rule tree: `Call`, `And` or `Or`."""

    __slots__ = ()

    def evaluate(self, msg: Message) -> bool:
        raise NotImplementedError

    def source(self) -> bytes:
        """Canonical program text for this rule."""
        raise NotImplementedError


@dataclass(frozen=True, slots=True)
class Call(Rule):
    """A rule function applied to literal arguments. Equality ignores the resolved `fn`."""

    name: str
    args: tuple[Arg, ...]
    fn: RuleFunction = field(compare=False, repr=False)

    def evaluate(self, msg: Message) -> bool:
        return self.fn(msg, *self.args)

    def source(self) -> bytes:
        return b"%s(%s)" % (self.name.encode(), b", ".join(map(_arg_source, self.args)))


@dataclass(frozen=True, slots=True)
class And(Rule):
    left: Rule
    right: Rule

    def evaluate(self, msg: Message) -> bool:
        # Quirk 6, copied: both sides always run, so a sample() on the right draws its
        # random number even when the left side is already false.
        left = self.left.evaluate(msg)
        right = self.right.evaluate(msg)
        return left and right

    def source(self) -> bytes:
        return b"(%s && %s)" % (self.left.source(), self.right.source())


@dataclass(frozen=True, slots=True)
class Or(Rule):
    left: Rule
    right: Rule

    def evaluate(self, msg: Message) -> bool:
        left = self.left.evaluate(msg)  # no short-circuit (quirk 6), as in And
        right = self.right.evaluate(msg)
        return left or right

    def source(self) -> bytes:
        return b"(%s || %s)" % (self.left.source(), self.right.source())


def _arg_source(arg: Arg) -> bytes:
    if isinstance(arg, float):
        text = repr(arg)  # shortest text that strtod reads back to the same double
        return text[:-2].encode() if text.endswith(".0") else text.encode()
    if not arg:
        return b'"\\0"'  # "" cannot be written (quirk 4); a \0 cuts the string to empty
    out = bytearray(b'"')
    i = 0
    if arg[0] == _QUOTE:
        # The first character after the opening quote is never taken as the terminator
        # (quirk 4), so `"""` is the one way to write a string that starts with a quote.
        out.append(_QUOTE)
        i = 1
    while i < len(arg):
        c = arg[i]
        if c == _BACKSLASH and arg[i + 1 : i + 2] == b'"':
            out += b'\\"'  # a backslash pair other than the 5 escapes is kept as written
            i += 2
            continue
        out += b"\\\\" if c == _BACKSLASH else _ARG_UNESCAPES.get(c, bytes((c,)))
        i += 1
    out.append(_QUOTE)
    return bytes(out)


def _prefix_source(prefix: bytes) -> bytes:
    if not any(c in prefix for c in (b" ", b"\\", b"\0")) and not prefix.startswith(b'"'):
        return prefix
    escaped = prefix.replace(b"\\", b"\\\\").replace(b'"', b'\\"').replace(b"\0", b"\\x00")
    return b'"%s"' % escaped


# --- programs -----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Program:
    """A compiled route program.

    Programs compare equal when they mean the same (`exact`, `prefix`, `rule`); `text` is
    what the client sent, which is what fq's duplicate-bind check compares.
    """

    text: bytes = field(compare=False)
    exact: bool
    prefix: bytes
    rule: Rule
    always_true: bool = field(compare=False)

    def evaluate(self, msg: Message) -> bool:
        """Evaluate the rule only; the caller has already checked prefix and exactness."""
        return self.rule.evaluate(msg)

    def source(self) -> bytes:
        """Canonical program bytes; `compile_program` reads them back to an equal Program.

        They can be longer than `text` (spaces, quotes), so a program written near the
        127-byte limit may not fit once canonicalised.
        """
        head = b"exact:" if self.exact else b"prefix:"
        prefix = _prefix_source(self.prefix)
        if _is_bare_true(self.rule):
            return head + prefix
        return b"%s%s %s" % (head, prefix, self.rule.source())

    def unparse(self) -> str:
        """`source` as text. Non-UTF-8 bytes come back as lone surrogates, so encode it with
        ``errors="surrogateescape"`` when the program is not plain UTF-8."""
        return self.source().decode("utf-8", "surrogateescape")


def _is_bare_true(rule: Rule) -> TypeGuard[Call]:
    return isinstance(rule, Call) and rule.name == "true" and not rule.args


def compile_program(text: bytes, registry: RuleRegistry | None = None) -> Program:
    """Compile a bind program (bytes as they came off the wire; NUL ends them).

    Raises `ProgramError`, and nothing else, for anything that does not compile; the bind
    is then answered with BIND_ILLEGAL. `registry` defaults to `default_registry()`.
    """
    text = bytes(text)
    nul = text.find(0)
    if nul >= 0:
        # The program field is used as a C string (docs/fq-protocol.md §1.5): NUL ends it.
        text = text[:nul]
    if len(text) > MAX_PROGRAM_LEN:
        raise ProgramError(f"program is {len(text)} bytes, over the limit of {MAX_PROGRAM_LEN}")
    if text.startswith(b"prefix:"):
        exact, start = False, 7
    elif text.startswith(b"exact:"):
        exact, start = True, 6
    else:
        raise ProgramError('program must start with "prefix:" or "exact:"', 0)
    parser = _Parser(text, start, registry if registry is not None else default_registry())
    prefix = parser.prefix()
    parser.skip_ws()
    if parser.pos == len(text):
        rule: Rule = parser.resolve("true", (), parser.pos)  # no rule means true()
    else:
        rule = parser.rule()
        parser.skip_ws()
        if parser.pos != len(text):
            raise ProgramError("trailing text after the rule", parser.pos)
    always_true = _is_bare_true(rule) and rule.fn is _true
    return Program(text, exact, prefix, rule, always_true)


class _Parser:
    """Recursive descent over the program bytes; `pos` is the next unread byte."""

    def __init__(self, text: bytes, pos: int, registry: RuleRegistry) -> None:
        self.text = text
        self.pos = pos
        self.registry = registry

    def error(self, reason: str, position: int | None = None) -> ProgramError:
        return ProgramError(reason, self.pos if position is None else position)

    def peek(self) -> int:
        return self.text[self.pos] if self.pos < len(self.text) else -1

    def skip_ws(self) -> None:
        text, pos = self.text, self.pos
        while pos < len(text) and text[pos] in _WS:
            pos += 1
        self.pos = pos

    def prefix(self) -> bytes:
        # Quoted: ends at an unescaped '"'. Unquoted: ends at the first ' ' or the end of
        # the text. The terminator is consumed; it is the whole separator before the rule.
        text, start = self.text, self.pos
        quoted = self.peek() == _QUOTE
        end_char = _QUOTE if quoted else 0x20
        pos = start + 1 if quoted else start
        out = bytearray()
        while pos < len(text):
            c = text[pos]
            if c == _BACKSLASH and pos + 1 < len(text):
                if text[pos + 1] == 0x78 and _HEX2.fullmatch(text, pos + 2, pos + 4):
                    # Quirk 5, fixed: real hex. C computes (H1-'0')<<4 | (H2-'0'), which
                    # agrees only when both digits are decimal ("\x41" is "A" in both).
                    out.append(int(text[pos + 2 : pos + 4], 16))
                    pos += 4
                else:
                    # Quirk 5, fixed: "\c" is a literal c. C emits the byte after c instead.
                    out.append(text[pos + 1])
                    pos += 2
            elif c == end_char:
                self.pos = pos + 1
                return bytes(out)
            else:
                out.append(c)
                pos += 1
        if quoted:
            raise self.error("unterminated quoted prefix", start)
        self.pos = pos
        return bytes(out)

    def rule(self) -> Rule:
        # Nesting needs no depth guard: each level costs a byte of a 127-byte program.
        self.skip_ws()
        if self.peek() != ord("("):
            return self.call()
        self.pos += 1
        left = self.rule()
        self.skip_ws()
        op = self.text[self.pos : self.pos + 2]
        node: type[And | Or]
        if op == b"&&":
            node = And
        elif op == b"||":  # quirk 3, fixed: C takes any pair with a '|' in it as OR
            node = Or
        elif op[:1] == b")":
            # Quirk 1, copied: C leaves the ')' unread and then rejects it as trailing text.
            raise self.error("a parenthesised rule needs && or ||; drop the parentheses")
        else:
            raise self.error('expected "&&" or "||"')
        self.pos += 2
        right = self.rule()
        self.skip_ws()
        if self.peek() != ord(")"):
            raise self.error('expected ")"')
        self.pos += 1
        return node(left, right)

    def call(self) -> Rule:
        start = self.pos
        match = _NAME.match(self.text, start)
        if match is None:
            raise self.error("expected a function name or (")
        self.pos = match.end()
        self.skip_ws()
        if self.peek() != ord("("):
            raise self.error('expected "(" after the function name')
        self.pos += 1
        self.skip_ws()  # fqd's strtod skips spaces before a number; strings get the same
        args: list[Arg] = []
        while self.peek() != ord(")"):
            if args:
                if self.peek() != ord(","):
                    raise self.error('expected "," or ")"')
                self.pos += 1
                self.skip_ws()
            if len(args) == MAX_ARGS:
                raise self.error(f"more than {MAX_ARGS} arguments")  # quirk 7, fixed
            args.append(self.arg())
            self.skip_ws()
        self.pos += 1
        return self.resolve(match.group().decode("ascii"), tuple(args), start)

    def arg(self) -> Arg:
        if self.peek() == _QUOTE:
            return self.string()
        number = _NUMBER.match(self.text, self.pos)
        if number is not None:
            self.pos = number.end()
            return _strtod(number.group())
        word = _NAME.match(self.text, self.pos)
        if word is not None and word.group() in (b"true", b"false"):
            # Quirk 2, copied: C only sees a boolean when the whole rest of the program is
            # the word, which can never happen inside f(...).
            raise self.error("boolean arguments are not supported")
        raise self.error("expected a string or number argument")

    def string(self) -> bytes:
        text, start = self.text, self.pos
        pos = start + 1
        out = bytearray()
        while pos < len(text):
            c = text[pos]
            # Quirk 4, copied: the first character is content even when it is a '"', so ""
            # cannot be written and """ is the string ".
            if c == _QUOTE and pos > start + 1:
                self.pos = pos + 1
                value = bytes(out)
                nul = value.find(0)  # quirk 4, copied: a C string, so \0 ends it
                return value if nul < 0 else value[:nul]
            if c == _BACKSLASH and pos + 1 < len(text):
                # Quirk 4, copied: \\ \0 \n \r \t decode; any other pair (\" too) is kept.
                escape = _ARG_ESCAPES.get(text[pos + 1])
                out += text[pos : pos + 2] if escape is None else escape
                pos += 2
            else:
                out.append(c)
                pos += 1
        raise self.error("unterminated string", start)

    def resolve(self, name: str, args: tuple[Arg, ...], position: int) -> Call:
        signature = "".join("s" if isinstance(a, bytes) else "d" for a in args)
        fn = self.registry.lookup(name, signature)
        if fn is None:
            raise self.error(f"unknown function {name}({', '.join(signature)})", position)
        return Call(name, args, fn)


def _strtod(token: bytes) -> float:
    text = token.decode("ascii")
    if text.lstrip("+-")[:2] in ("0x", "0X"):
        try:
            return float.fromhex(text)
        except OverflowError:  # strtod gives ±HUGE_VAL where fromhex refuses
            return -math.inf if text.startswith("-") else math.inf
    value = float(text.partition("(")[0])  # "nan(chars)": the chars choose a NaN payload
    # One NaN object for every NaN argument: tuples compare items by identity first, so
    # two compiles of sample(nan) still give equal Calls.
    return math.nan if value != value else value


# --- rule functions -----------------------------------------------------------------------


def _true(msg: Message) -> bool:
    return True


def _route_contains(msg: Message, needle: bytes) -> bool:
    return needle in msg.route


def _payload_prefix(msg: Message, prefix: bytes) -> bool:
    return msg.payload.startswith(prefix)


def _payload_contains(msg: Message, needle: bytes) -> bool:
    return needle in msg.payload


def _sample(msg: Message, probability: float) -> bool:
    return random.random() < probability  # drand48() < x in fqd_dyn_sample.c


class RuleRegistry:
    """Rule functions by (name, signature): fq's ``fqd_route_prog__<name>__<sig>`` symbols.

    A signature has one letter per argument, ``s`` for a string and ``d`` for a number, or
    is ``"VA"`` for a variadic fallback. Functions registered later replace earlier ones, so
    plugins can override built-ins, as fqd searches loaded modules before its built-ins.
    """

    def __init__(self, *, builtins: bool = True) -> None:
        self._functions: dict[tuple[str, str], RuleFunction] = {}
        self._plugins: str | None = None  # an entry-point group still to load
        if builtins:
            self.register("true", "", _true)
            self.register("route_contains", "s", _route_contains)
            self.register("payload_prefix", "s", _payload_prefix)
            self.register("payload_contains", "s", _payload_contains)
            self.register("sample", "d", _sample)  # a loadable module in fq; built in here

    def register(self, name: str, signature: str, fn: RuleFunction) -> None:
        if not _NAME_STR.fullmatch(name) or len(name) > MAX_NAME_LEN:
            raise ValueError(f"invalid rule function name {name!r}")
        if signature != "VA" and (len(signature) > MAX_ARGS or set(signature) - {"s", "d"}):
            raise ValueError(f"invalid signature {signature!r}: use s/d letters or 'VA'")
        if not callable(fn):
            raise TypeError(f"rule function {name} is not callable")
        self._load_deferred()  # plugins first, as if loaded when deferred
        self._functions[name, signature] = fn

    def lookup(self, name: str, signature: str) -> RuleFunction | None:
        self._load_deferred()
        fn = self._functions.get((name, signature))
        return self._functions.get((name, "VA")) if fn is None else fn

    def defer_entry_points(self, group: str = ENTRY_POINT_GROUP) -> None:
        """:meth:`load_entry_points` when a function is first looked up or registered.

        That is at the first bind (an empty rule is ``true()``, looked up too): a broker
        that nobody binds on never scans the installed packages, 2 MB it need not hold.
        """
        self._plugins = group

    def _load_deferred(self) -> None:
        if self._plugins is not None:
            group, self._plugins = self._plugins, None
            self.load_entry_points(group)

    def load_entry_points(self, group: str = ENTRY_POINT_GROUP) -> None:
        """Call every installed plugin's ``register(registry)`` (entry points in `group`).

        An entry point may name the function itself or a module that has one. A plugin
        that fails is logged and skipped, like a ``.so`` fqd cannot load: its functions
        are simply unknown, and binds that use them fail.
        """
        import importlib.metadata  # 2 MB with what it imports: see defer_entry_points

        for entry_point in importlib.metadata.entry_points(group=group):
            # Third-party code can raise anything; one bad plugin must not stop the rest.
            try:
                hook = entry_point.load()
                register = hook if callable(hook) else getattr(hook, "register", None)
                if not callable(register):
                    raise ValueError("it has no register(registry) function")
                register(self)
            except Exception:
                logger.exception(
                    "cannot load rule plugin %s (%s)", entry_point.name, entry_point.value
                )

    def load_module(self, name: str) -> None:
        """Import the module `name` and call its ``register(registry)``: fqd's ``-m NAME``."""
        try:
            module = importlib.import_module(name)
        except ImportError as exc:
            raise ImportError(f"cannot import rule module {name!r}: {exc}", name=name) from exc
        register = getattr(module, "register", None)
        if not callable(register):
            raise ValueError(f"rule module {name!r} has no register(registry) function")
        register(self)


_default_registry: RuleRegistry | None = None
_default_lock = threading.Lock()


def default_registry() -> RuleRegistry:
    """The process-wide registry: built-ins plus the ``fqbroker.rules`` plugins, loaded once."""
    global _default_registry
    with _default_lock:
        if _default_registry is None:
            registry = RuleRegistry()
            registry.defer_entry_points()
            _default_registry = registry
        return _default_registry
