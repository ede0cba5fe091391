"""Every ``sh``, ``console`` and ``python`` block of README.md and docs/*.md runs as written,
or carries a marker saying why not (``<!-- skip: next "needs a second host" -->``); every
``toml`` block loads as fqd's settings.

Why Sybil: it reads Markdown (fenced blocks, and HTML comments for the markers and for the
invisible setup a text takes for granted), its skip comment is visible in the raw file and
carries its reason, and its evaluators are ours to write, so shell and console blocks run
as well as Python. pytest-markdown-docs and pytest's own doctest run Python only; a
home-grown regex parser is what tests/docs/test_readme.py was, and what each new
document would have to grow.

Each document runs in a network namespace of its own (``unshare --net``, as root or with
``--map-root-user``), so its brokers listen on 8765 as written, whatever the developer
has running, with a scratch directory as ``./`` (``./var``, the state directory): see
tests/docs/markdown_blocks.py for what running a block means. Without a namespace, the
run goes to the host's loopback when 8765 is free there, and otherwise skips (fails on
CI, tests/prereqs.py).
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from tests.docs import markdown_blocks as mb

# A reason says why the block cannot run here: a bare or vague marker does not do.
VAGUE = {"", '""', "''", '"skip"', '"todo"', '"not run"', '"does not run"'}


def _blocks() -> list[tuple[str, int]]:
    return [(name, e.line) for name in mb.DOCUMENTS for e in mb.runnable_blocks(mb.parse(name))]


BLOCKS = _blocks()


def _namespace_command() -> list[str] | None:
    import shutil

    unshare = shutil.which("unshare")
    if unshare is None:
        return None
    for args in ([unshare, "--net"], [unshare, "--net", "--map-root-user"]):
        if subprocess.run([*args, "true"], capture_output=True, timeout=30).returncode == 0:
            return args
    return None


def _port_free(port: int = 8765) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


class _Runs:
    """Each document's report, made once, on first use."""

    def __init__(self, tmp: pytest.TempPathFactory) -> None:
        self.tmp = tmp
        self.reports: dict[str, dict[int, list[str]]] = {}
        self.prefix = _namespace_command()

    def of(self, name: str) -> dict[int, list[str]]:
        if name not in self.reports:
            if self.prefix is None and not _port_free():
                from tests.prereqs import missing

                missing("no network namespace here, and port 8765 (the documents') is in use")
            work = self.tmp.mktemp(Path(name).stem)
            script = [
                sys.executable,
                mb.__file__,
                name,
                str(work),
                "netns" if self.prefix else "host",
            ]
            run = subprocess.run(
                [*(self.prefix or []), *script], capture_output=True, timeout=240, cwd=mb.ROOT
            )
            assert run.returncode == 0, run.stderr.decode()
            self.reports[name] = {int(k): v for k, v in json.loads(run.stdout).items()}
        return self.reports[name]


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> _Runs:
    return _Runs(tmp_path_factory)


@pytest.mark.parametrize(("name", "line"), BLOCKS, ids=[f"{n}:{line}" for n, line in BLOCKS])
def test_block(runs: _Runs, name: str, line: int) -> None:
    report = runs.of(name)
    outcome, detail = report[line]
    assert outcome != "failed", f"{name}:{line}: {detail}"
    # What the prose after the block says a tool prints ("`fq-recv` prints `...`"), checked
    # in the same run, and reported here: the block's own test is where a reader looks.
    mine = sorted(b for n, b in BLOCKS if n == name)
    after = [b for b in mine if b > line]
    until = after[0] if after else float("inf")
    for other, (what, why) in sorted(report.items()):
        if line < other < until and other not in mine:
            assert what != "failed", f"{name}:{other} (the text after this block): {why}"
    if outcome == "marked":
        pytest.skip(f"{name}:{line} is marked: {detail}")
    assert outcome == "ran", f"{name}:{line}: {outcome} {detail}"


@pytest.mark.parametrize("name", mb.DOCUMENTS)
def test_every_block_is_seen(name: str) -> None:
    """Sybil finds every fenced block a reader sees (an indented fence, a stray space
    after the language would hide one from it, and from this test)."""
    text = (mb.ROOT / name).read_text(encoding="utf-8")
    shown = mb.fences(text)
    found = {e.line for e in mb.runnable_blocks(mb.parse(name))}
    assert set(shown) <= found, f"blocks Sybil does not see: {sorted(set(shown) - found)}"


@pytest.mark.parametrize("name", mb.DOCUMENTS)
def test_every_marker_says_why(name: str) -> None:
    for line, action, reason in mb.skip_reasons((mb.ROOT / name).read_text(encoding="utf-8")):
        assert action == "next", (
            f"{name}:{line}: mark blocks one by one (skip: next), each with its reason"
        )
        assert reason.lower() not in VAGUE, f"{name}:{line}: the marker says no reason"


def test_there_are_blocks() -> None:
    assert len(BLOCKS) > 50, BLOCKS
