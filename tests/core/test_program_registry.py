"""The rule registry of the route-program compiler (fqbroker/core/program.py): built-ins,
signatures, and plugins loaded from a module or from entry points, at once or deferred."""

from __future__ import annotations

import logging
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

import fqbroker.core.program as program_module
from fqbroker.core.message import Message
from fqbroker.core.program import RuleRegistry, compile_program, default_registry
from fqbroker.errors import ProgramError

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "rules_plugin"


def test_default_registry_is_shared_and_has_the_builtins() -> None:
    registry = default_registry()
    assert registry is default_registry()
    for name, sig in [
        ("true", ""),
        ("route_contains", "s"),
        ("payload_prefix", "s"),
        ("payload_contains", "s"),
        ("sample", "d"),
    ]:
        assert registry.lookup(name, sig) is not None
    assert registry.lookup("sample", "s") is None


def test_exact_signature_before_variadic() -> None:
    registry = RuleRegistry(builtins=False)
    registry.register("f", "s", lambda msg, s: True)
    registry.register("f", "VA", lambda msg, *args: False)
    msg = Message(b"", b"", b"")
    assert compile_program(b'prefix: f("a")', registry).evaluate(msg)
    assert not compile_program(b"prefix: f(1, 2)", registry).evaluate(msg)
    assert not compile_program(b"prefix: f()", registry).evaluate(msg)
    with pytest.raises(ProgramError, match=r"unknown function true\(\)"):
        compile_program(b"prefix:", registry)  # no built-ins, so no true() either


@pytest.mark.parametrize(
    ("name", "signature", "error"),
    [
        ("1f", "s", ValueError),
        ("f-g", "s", ValueError),
        ("", "", ValueError),
        ("f", "x", ValueError),
        ("f", "b", ValueError),
        ("f", "s" * 17, ValueError),
        ("f", "va", ValueError),
    ],
)
def test_register_validates(name: str, signature: str, error: type[Exception]) -> None:
    with pytest.raises(error):
        RuleRegistry().register(name, signature, lambda msg: True)


def test_register_needs_a_callable() -> None:
    with pytest.raises(TypeError):
        RuleRegistry().register("f", "", "not callable")  # type: ignore[arg-type]


@pytest.fixture
def forget_modules() -> Iterator[list[str]]:
    """Module names a test imports from a temporary path; removed from sys.modules after."""
    names: list[str] = []
    yield names
    for name in names:
        sys.modules.pop(name, None)


def test_load_module_example_plugin(
    monkeypatch: pytest.MonkeyPatch, forget_modules: list[str]
) -> None:
    monkeypatch.syspath_prepend(str(EXAMPLES))
    forget_modules.append("fqbroker_rules_example")
    registry = RuleRegistry()
    with pytest.raises(ProgramError):
        compile_program(b'prefix: route_endswith(".json")', registry)
    registry.load_module("fqbroker_rules_example")
    p = compile_program(b'prefix:"http." route_endswith(".json")', registry)
    assert p.evaluate(Message(b"", b"http.a.json", b""))
    assert not p.evaluate(Message(b"", b"http.a.xml", b""))
    any_of = compile_program(b'prefix: route_contains_any("err", 1, "fatal")', registry)
    assert any_of.evaluate(Message(b"", b"app.fatal", b""))
    assert not any_of.evaluate(Message(b"", b"app.info", b""))


def test_load_module_errors() -> None:
    with pytest.raises(ImportError, match="no_such_rules_module"):
        RuleRegistry().load_module("no_such_rules_module")
    with pytest.raises(ValueError, match="register"):
        RuleRegistry().load_module("string")  # importable, but no register()


def _fake_distribution(root: Path, entry_points: str) -> None:
    dist = root / "fqbroker_test_plugin-1.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: fqbroker-test-plugin\nVersion: 1.0\n"
    )
    (dist / "entry_points.txt").write_text(entry_points)


def test_load_entry_points(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    forget_modules: list[str],
    caplog: pytest.LogCaptureFixture,
) -> None:
    (tmp_path / "fqbt_hook.py").write_text(
        "def register(registry):\n"
        "    registry.register('route_is', 's', lambda msg, s: msg.route == s)\n"
    )
    (tmp_path / "fqbt_module.py").write_text(
        "def register(registry):\n"
        "    registry.register('payload_is', 's', lambda msg, s: msg.payload == s)\n"
    )
    (tmp_path / "fqbt_broken.py").write_text("raise RuntimeError('plugin bug')\n")
    forget_modules.extend(["fqbt_hook", "fqbt_module", "fqbt_broken"])
    _fake_distribution(
        tmp_path,
        "[fqbroker.rules]\n"
        "hook = fqbt_hook:register\n"
        "module = fqbt_module\n"  # a module with a register() works too
        "broken = fqbt_broken:register\n",
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    registry = RuleRegistry()
    with caplog.at_level(logging.ERROR, logger="fqbroker.core.program"):
        registry.load_entry_points()
    assert "broken" in caplog.text  # logged and skipped; the others still load
    p = compile_program(b'prefix: (route_is("a") && payload_is("b"))', registry)
    assert p.evaluate(Message(b"", b"a", b"b"))
    assert not p.evaluate(Message(b"", b"a", b"c"))
    # The process-wide registry loads the same group the first time it is asked for.
    monkeypatch.setattr(program_module, "_default_registry", None)
    assert compile_program(b'prefix: route_is("a")').evaluate(Message(b"", b"a", b""))


def test_deferred_entry_points_load_before_the_first_lookup_or_register(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, forget_modules: list[str]
) -> None:
    """Deferred plugins override built-ins and yield to later registers, as if loaded early."""
    (tmp_path / "fqbt_override.py").write_text(
        "loaded = []\n"
        "def register(registry):\n"
        "    loaded.append(registry)\n"
        "    registry.register('route_contains', 's', lambda msg, s: True)\n"
        "    registry.register('payload_is', 's', lambda msg, s: msg.payload == s)\n"
    )
    forget_modules.append("fqbt_override")
    _fake_distribution(tmp_path, "[fqbroker.rules]\noverride = fqbt_override:register\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    registry = RuleRegistry()
    registry.defer_entry_points()
    assert "fqbt_override" not in sys.modules  # nothing compiled yet: nothing loaded
    p = compile_program(b'prefix: route_contains("zzz")', registry)
    assert p.evaluate(Message(b"", b"a", b""))  # the plugin's, not the built-in
    assert sys.modules["fqbt_override"].loaded == [registry]

    later = RuleRegistry()
    later.defer_entry_points()
    later.register("payload_is", "s", lambda msg, s: False)  # loads the plugins first
    assert not compile_program(b'prefix: payload_is("b")', later).evaluate(Message(b"", b"a", b"b"))
