"""The compiled accelerator (fqbroker/accel.py, setup.py) against pure Python.

* Which one runs: FQBROKER_PURE=1 forces the sources; a build whose manifest does not
  match the sources (one edited since), or made for another Python, or missing a module,
  is passed over for them; ``fqbroker.ACCELERATED`` and ``--version`` say which runs.
* Same frames out for the same bytes in: two child processes (tests/accel_worker.py), one
  compiled and one pure, get the same hypothesis-made inputs (fq data channel bytes in any
  split, valid or not; bindings and a data channel's messages routed to queues;
  OpenCluster frames through the connection's machine and a real store) and must answer
  alike, errors included.

Without a built accelerator the comparisons skip (on CI, where mypyc and a C compiler
are there to build it, they fail instead: tests/prereqs.py). The rest of the suite runs
compiled where it is built; ``make test-pure`` runs the compiled modules' tests pure.
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import itertools
import json
import os
import shutil
import subprocess
import sys
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import fqbroker
from fqbroker import accel
from fqbroker.core.frames import encode_peer, encode_publish
from fqbroker.protocols.opencluster import wire as ocwire
from tests.prereqs import missing
from tests.procs import ENV, ROOT

SUFFIX = importlib.machinery.EXTENSION_SUFFIXES[0]


def _run(code: str, **env: str) -> str:
    done = subprocess.run(
        [sys.executable, "-c", code],
        env={**ENV, **env}, cwd=ROOT, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    return done.stdout


# --- which one runs -----------------------------------------------------------------------


def _fake_build(tmp_path: Path) -> Path:
    """A package directory with every module's source, an extension file beside each and
    the manifest of a build of those sources."""
    package = tmp_path / "fqbroker"
    for module in accel.MODULES:
        source = Path(accel.source_path(module, str(package)))
        source.parent.mkdir(parents=True, exist_ok=True)
        source.write_text(f"# {module}\n")
        source.with_suffix(SUFFIX).write_bytes(b"")
    manifest = accel.manifest(accel.MODULES, str(package))
    (package / accel.MANIFEST).write_text(json.dumps(manifest))
    return package


def test_a_build_that_does_not_match_its_sources_is_passed_over(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(accel.ENV, raising=False)
    package = _fake_build(tmp_path)
    # A manifest that matches gets as far as loading the shared library.
    assert accel._check(str(package)) != "not built"
    first = Path(accel.source_path(accel.MODULES[0], str(package)))
    first.write_text("# edited since the build\n")
    reason = accel._check(str(package))
    assert reason is not None and "changed since the build" in reason
    assert str(first.relative_to(tmp_path)) in reason

    package = _fake_build(tmp_path / "b")
    Path(accel.source_path(accel.MODULES[-1], str(package))).with_suffix(SUFFIX).unlink()
    assert accel._check(str(package)) == f"{accel.MODULES[-1]} not built"

    package = _fake_build(tmp_path / "c")
    data = json.loads((package / accel.MANIFEST).read_text())
    (package / accel.MANIFEST).write_text(json.dumps({**data, "suffix": ".cpython-27.so"}))
    assert accel._check(str(package)) == f"built for .cpython-27.so, not {SUFFIX}"

    del data["modules"][accel.MODULES[0]]
    (package / accel.MANIFEST).write_text(json.dumps(data))
    assert accel._check(str(package)) == "built for another set of modules"

    (package / accel.MANIFEST).unlink()
    assert accel._check(str(package)) == "not built"
    monkeypatch.setenv(accel.ENV, "1")
    assert accel._check(str(_fake_build(tmp_path / "d"))) == "FQBROKER_PURE is set"


def test_fqbroker_pure_forces_the_sources_and_version_says_so() -> None:
    code = (
        "import importlib, fqbroker; from fqbroker import accel;"
        "print(fqbroker.ACCELERATED, accel.REASON);"
        "print(*(importlib.import_module(m).__file__ for m in accel.MODULES))"
    )
    flag, files = _run(code, FQBROKER_PURE="1").splitlines()
    assert flag == "False FQBROKER_PURE is set"
    assert all(f.endswith(".py") for f in files.split())
    version = _run("from fqbroker.cli.console import version_text; print(version_text('fqd'))")
    if fqbroker.ACCELERATED or os.environ.get(accel.ENV, "") in ("", "0"):
        # This process's choice is the child's when FQBROKER_PURE is not set.
        assert version.rstrip().endswith(f", {accel.describe()})")
    pure_version = _run(
        "from fqbroker.cli.console import version_text; print(version_text('fqd'))",
        FQBROKER_PURE="1",
    )
    assert pure_version.rstrip().endswith(", pure Python: FQBROKER_PURE is set)")


def _need_build() -> None:
    """Skip (fail on CI, where it can be built) unless the accelerator is built here,
    whether or not this process runs it."""
    why = accel._check(accel._PACKAGE_DIR, env=False)
    if why is None:
        return
    can_build = importlib.util.find_spec("mypyc") is not None and shutil.which("cc")
    reason = f"the accelerator is not built here ({why}; make accel)"
    if can_build:
        missing(reason)
    pytest.skip(reason)


def test_a_build_runs_the_compiled_modules() -> None:
    _need_build()
    code = (
        "import importlib, fqbroker; from fqbroker import accel;"
        "print(fqbroker.ACCELERATED, accel.REASON);"
        "print(*(importlib.import_module(m).__file__ for m in accel.MODULES))"
    )
    flag, files = _run(code, FQBROKER_PURE="0").splitlines()
    assert flag == "True compiled (mypyc)"
    assert all(f.endswith(SUFFIX) for f in files.split())
    version = _run(
        "from fqbroker.cli.console import version_text; print(version_text('fqd'))",
        FQBROKER_PURE="0",
    )
    n = len(accel.MODULES)
    assert version.rstrip().endswith(f", compiled: {n} of {n} modules, mypyc)")


def test_an_extension_not_to_run_is_passed_over_for_its_source() -> None:
    _need_build()
    module = "fqbroker.core.frames"  # built: an extension lies beside its source
    spec = accel._SourceFirst(frozenset()).find_spec(module, None)
    assert spec is not None and spec.origin == accel.source_path(module)
    assert accel._SourceFirst(frozenset(accel.MODULES)).find_spec(module, None) is None
    # Nothing beside it: the usual finders find it.
    assert accel._SourceFirst(frozenset()).find_spec("fqbroker.settings.broker", None) is None
    assert accel._SourceFirst(frozenset()).find_spec("json", None) is None


# --- building --------------------------------------------------------------------------------


def _checkout(tmp_path: Path) -> Path:
    """A copy of what setup.py builds from, without any build."""
    src = tmp_path / "src"
    src.mkdir()
    for name in ("pyproject.toml", "setup.py", "README.md", "LICENSE"):
        shutil.copy(ROOT / name, src / name)
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", "*.so", accel.MANIFEST)
    shutil.copytree(ROOT / "fqbroker", src / "fqbroker", ignore=ignore)
    return src


def _build(src: Path, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "setup.py", "-q", "build_ext", "--inplace"],
        cwd=src, env={**os.environ, **env}, capture_output=True, text=True, timeout=300,
    )  # fmt: skip


def test_a_build_that_fails_leaves_pure_python(tmp_path: Path) -> None:
    """No C compiler: the build says so and succeeds, and nothing of it is left to load."""
    if importlib.util.find_spec("mypyc") is None:
        pytest.skip("mypyc is not installed (the dev extra)")
    src = _checkout(tmp_path)
    done = _build(src, CC="/bin/false", FQBROKER_PURE="0")
    assert done.returncode == 0, done.stderr
    assert "the C build failed" in done.stderr and "pure Python" in done.stderr
    assert not list(src.rglob("*.so"))
    assert not (src / "fqbroker" / accel.MANIFEST).exists()
    assert accel._check(str(src / "fqbroker"), env=False) == "not built"


def test_a_wheel_whose_build_fails_is_a_pure_one(tmp_path: Path) -> None:
    """What pip wheel . (pip install .) makes without a C compiler: the build backend
    pip calls, with this venv's mypyc and setuptools (the isolated build's: tests/test_setup.py)."""
    if importlib.util.find_spec("mypyc") is None:
        pytest.skip("mypyc is not installed (the dev extra)")
    src = _checkout(tmp_path)
    shutil.copytree(ROOT / "pyspark_fqbroker", src / "pyspark_fqbroker")
    code = (
        "import sys; from setuptools import build_meta; print(build_meta.build_wheel(sys.argv[1]))"
    )
    done = subprocess.run(
        [sys.executable, "-c", code, str(tmp_path)],
        cwd=src, env={**os.environ, "CC": "/bin/false", "FQBROKER_PURE": "0"},
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "the C build failed" in done.stderr and "pure Python" in done.stderr
    name = done.stdout.strip().splitlines()[-1]
    assert name.endswith("-py3-none-any.whl"), name
    with zipfile.ZipFile(tmp_path / name) as archive:
        names = archive.namelist()
    assert "fqbroker/core/frames.py" in names
    assert not [n for n in names if n.endswith(".so") or n.endswith(accel.MANIFEST)]


def test_fqbroker_pure_skips_the_build(tmp_path: Path) -> None:
    src = _checkout(tmp_path)
    done = _build(src, FQBROKER_PURE="1")
    assert done.returncode == 0, done.stderr
    assert "FQBROKER_PURE is set: pure Python" in done.stderr
    assert not list(src.rglob("*.so"))


# --- the same frames out for the same bytes in ----------------------------------------------


class Worker:
    def __init__(self, pure: bool) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "tests.accel_worker"],
            env={**ENV, accel.ENV: "1" if pure else "0"}, cwd=ROOT,
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
        )  # fmt: skip
        assert self.proc.stdout is not None
        self.accelerated = json.loads(self.proc.stdout.readline())["accelerated"]

    def ask(self, request: dict[str, Any]) -> Any:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(json.dumps(request) + "\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        assert line, f"the worker died (exit {self.proc.wait()})"
        return json.loads(line)

    def close(self) -> None:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.close()
        self.proc.wait(timeout=30)
        self.proc.stdout.close()


@pytest.fixture(scope="module")
def workers() -> Iterator[tuple[Worker, Worker]]:
    _need_build()
    pure, compiled = Worker(pure=True), Worker(pure=False)
    try:
        assert not pure.accelerated and compiled.accelerated
        yield pure, compiled
    finally:
        pure.close()
        compiled.close()


def same(workers: tuple[Worker, Worker], request: dict[str, Any]) -> Any:
    pure, compiled = workers
    expected = pure.ask(request)
    assert compiled.ask(request) == expected
    return expected


def _split(data: bytes, cuts: list[int]) -> list[str]:
    points = sorted({c % (len(data) + 1) for c in cuts} | {0, len(data)})
    return [data[a:b].hex() for a, b in itertools.pairwise(points)] or [""]


names = st.one_of(st.binary(max_size=6), st.binary(min_size=125, max_size=130))
short_names = st.sampled_from([b"", b"a", b"ex", b"a.b", b"a.b.c"])
payloads = st.one_of(st.binary(max_size=40), st.binary(min_size=200, max_size=2000))
junk = st.binary(min_size=1, max_size=24)

EXAMPLES = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@st.composite
def publisher_stream(draw: st.DrawFn) -> bytes:
    parts = []
    for _ in range(draw(st.integers(0, 12))):
        if draw(st.integers(0, 9)) == 0:
            parts.append(draw(junk))
        else:
            ex = draw(st.one_of(short_names, names))
            rt = draw(st.one_of(short_names, names))
            parts.append(
                encode_publish(
                    ex[:255], rt[:255], draw(st.binary(min_size=16, max_size=16)), draw(payloads)
                )
            )
    return b"".join(parts)


@EXAMPLES
@given(
    publisher_stream(),
    st.lists(st.integers(0, 1 << 16), max_size=6),
    st.sampled_from([64, 1000, 1 << 20]),
)
def test_publisher_frames_decode_alike(
    workers: tuple[Worker, Worker], data: bytes, cuts: list[int], max_payload: int
) -> None:
    same(
        workers,
        {"kind": "fq", "chunks": _split(data, cuts), "peer": False, "max_payload": max_payload},
    )


@st.composite
def peer_stream(draw: st.DrawFn) -> bytes:
    parts = []
    for _ in range(draw(st.integers(0, 10))):
        if draw(st.integers(0, 9)) == 0:
            parts.append(draw(junk))
        else:
            hops = draw(st.binary(max_size=40))
            parts.append(
                encode_peer(
                    draw(short_names), draw(st.one_of(short_names, names))[:255],
                    draw(st.binary(min_size=16, max_size=16)), draw(short_names),
                    hops[: len(hops) // 4 * 4], draw(payloads),
                )
            )  # fmt: skip
    return b"".join(parts)


@EXAMPLES
@given(peer_stream(), st.lists(st.integers(0, 1 << 16), max_size=6), st.sampled_from([64, 1 << 20]))
def test_peer_frames_decode_alike(
    workers: tuple[Worker, Worker], data: bytes, cuts: list[int], max_payload: int
) -> None:
    same(
        workers,
        {"kind": "fq", "chunks": _split(data, cuts), "peer": True, "max_payload": max_payload},
    )


def test_a_large_frame_is_assembled_alike(workers: tuple[Worker, Worker]) -> None:
    big = encode_publish(b"ex", b"big", bytes(16), bytes(range(256)) * 4200)
    small = encode_publish(b"ex", b"small", bytes(16), b"after")
    data = small + big + small
    answer = same(
        workers,
        {
            "kind": "fq",
            "chunks": _split(data, [30, 70, 5000, 600000]),
            "peer": False,
            "max_payload": 1 << 28,
        },
    )
    assert answer[-1][1] == len(data)


programs = st.sampled_from(
    [b'prefix:""', b'prefix:"a"', b'prefix:"a.b"', b'exact:"a.b"', b'prefix:"b"',
     b'prefix:"a" route_contains("c")', b"bad program", b'prefix:"a" payload_prefix("x")']
)  # fmt: skip


@EXAMPLES
@given(
    st.lists(
        st.tuples(st.sampled_from([b"ex", b"other"]), programs, st.integers(0, 3)), max_size=8
    ),
    st.lists(
        st.tuples(
            st.sampled_from([b"ex", b"other", b"none"]),
            st.sampled_from([b"a", b"a.b", b"a.b.c", b"b", b"c"]),
            st.binary(max_size=3),
        ),
        max_size=40,
    ),
    st.sampled_from([3, 1000]),
)
def test_messages_are_routed_alike(
    workers: tuple[Worker, Worker],
    binds: list[tuple[bytes, bytes, int]],
    messages: list[tuple[bytes, bytes, bytes]],
    backlog: int,
) -> None:
    frames = b"".join(encode_publish(ex, rt, bytes(16), p) for ex, rt, p in messages)
    same(
        workers,
        {
            "kind": "route",
            "binds": [(e.hex(), p.hex(), q) for e, p, q in binds],
            "frames": frames.hex(),
            "backlog": backlog,
        },
    )


@st.composite
def oc_stream(draw: st.DrawFn) -> bytes:
    keys = st.sampled_from([b"k1", b"k2", b"testdata", b"x" * 70])
    users = st.integers(0, 9)
    ints = st.integers(-(2**31), 2**31 - 1)
    expiry = st.sampled_from([0, 0, 3600])
    commands = st.integers(0, 3000)
    frames = st.one_of(
        st.builds(ocwire.set_int, users, keys, ints),
        st.builds(lambda u, k, v, e: ocwire.set_string(u, k, v, expires=e), users, keys,
                  st.binary(max_size=40), expiry),
        st.builds(ocwire.get_int, users, keys),
        st.builds(ocwire.get_string, users, keys),
        st.builds(ocwire.ping, users),
        st.builds(ocwire.capabilities, users, commands),
        st.builds(ocwire.encode_frame, commands, commands, users, st.binary(max_size=12)),
        st.builds(ocwire.goodbye, users),
    )  # fmt: skip
    body = draw(st.lists(frames, max_size=14))
    return ocwire.hello(0) + b"".join(body)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    oc_stream(),
    st.lists(st.integers(0, 1 << 12), max_size=5),
    st.sampled_from([[64, 64, 2048, 3], [64, 1024, 2048, 64]]),
)
def test_opencluster_connections_are_answered_alike(
    workers: tuple[Worker, Worker], data: bytes, cuts: list[int], limits: list[int]
) -> None:
    same(workers, {"kind": "opencluster", "chunks": _split(data, cuts), "limits": limits})


@EXAMPLES
@given(
    st.binary(max_size=300),
    st.lists(st.integers(0, 300), max_size=5),
    st.sampled_from([8, 64]),
    st.sampled_from([1, 100]),
)
def test_opencluster_frames_decode_alike(
    workers: tuple[Worker, Worker], data: bytes, cuts: list[int], max_payload: int, limit: int
) -> None:
    same(
        workers,
        {
            "kind": "ocframes",
            "chunks": _split(data, cuts),
            "max_payload": max_payload,
            "limit": limit,
        },
    )


# --- routing: the router compiled against pure Python ---------------------------------------

PREFIXES = [b"", b"a", b"a.", b"a.b", b"b", b"c", b"r."]
ROUTES = [b"", b"a", b"a.b", b"a.b.c", b"ab", b"b", b"c", b"ac", b"r.1", b"r.2", b"r.3c"]
NEEDLES = [b"c", b"x", b"a.", b""]


@st.composite
def rule_text(draw: st.DrawFn, depth: int = 2) -> bytes:
    if depth and draw(st.integers(0, 3)) == 0:
        op = draw(st.sampled_from([b"&&", b"||"]))
        return b"(%s %s %s)" % (draw(rule_text(depth - 1)), op, draw(rule_text(depth - 1)))
    name = draw(st.sampled_from([b"route_contains", b"payload_prefix", b"payload_contains"]))
    if draw(st.integers(0, 5)) == 0:
        return b"true()"
    return b'%s("%s")' % (name, draw(st.sampled_from(NEEDLES)) or b"\\0")


@st.composite
def program_text(draw: st.DrawFn) -> bytes:
    """A route program: mostly ``prefix:``/``exact:`` alone (what a route decides), else
    with a rule that looks past the route (at the route's text or the payload)."""
    if draw(st.integers(0, 15)) == 0:
        return draw(st.sampled_from([b"bad program", b'prefix:"a" nosuch("x")', b"exact:"]))
    head = draw(st.sampled_from([b"prefix:", b"prefix:", b"exact:"]))
    text = head + b'"%s"' % draw(st.sampled_from(PREFIXES))
    if draw(st.integers(0, 2)) == 0:
        text += b" " + draw(rule_text())
    return text


@st.composite
def routing_ops(draw: st.DrawFn) -> list[list[Any]]:
    exchanges = st.sampled_from([b"ex", b"other"])
    ops: list[list[Any]] = []
    binds: list[int] = []
    for _ in range(draw(st.integers(1, 12))):
        kind = draw(st.integers(0, 9))
        if kind < 4 or not binds:
            binds.append(len(ops))
            flags = draw(st.sampled_from([0, 0, 0x01, 0x02, 0x03]))
            ops.append(["bind", draw(exchanges), draw(program_text()), draw(st.integers(0, 4)),
                        flags])  # fmt: skip
        elif kind == 4:
            ops.append(["unbind", draw(exchanges), draw(st.sampled_from(binds)),
                        draw(st.integers(0, 4))])  # fmt: skip
        elif kind == 5:
            ops.append(["take", draw(st.integers(0, 4))])
        else:
            messages = draw(
                st.lists(
                    st.tuples(
                        st.sampled_from([b"ex", b"ex", b"ex", b"other", b"none"]),
                        st.sampled_from(ROUTES),
                        st.integers(1, 4),  # a run of this many on the route
                        st.sampled_from([b"", b"x", b"cx", b"xc" * 40]),
                    ),
                    max_size=30,
                )
            )
            frames = b"".join(
                encode_publish(ex, rt, bytes(16), p + b"%d" % k)
                for ex, rt, n, p in messages
                for k in range(n)
            )
            ops.append(["read", frames, draw(st.booleans())])
    return ops


def _hexed(ops: list[list[Any]]) -> list[list[Any]]:
    return [[op[0], *(x.hex() if isinstance(x, bytes) else x for x in op[1:])] for op in ops]


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(routing_ops())
def test_the_router_routes_alike(workers: tuple[Worker, Worker], ops: list[list[Any]]) -> None:
    """Bindings and unbindings, reads of runs on many routes, programs that look past
    the route, drop and block queues (by count and by bytes), sampled timing: the same
    deliveries per queue in the same order and the same counters, compiled and pure."""
    same(workers, {"kind": "routing", "ops": _hexed(ops)})


def test_a_program_that_looks_past_the_route_after_an_unrouted_run(
    workers: tuple[Worker, Worker],
) -> None:
    """What told compiled routing from pure while a route's reach was a tuple: a run that
    reaches nothing (b) waits as a group, then a run whose program must run (a). mypyc
    keeps a tuple-typed value unboxed and boxes it afresh for ``is``, so ``group is not
    _NO_GROUP`` always held compiled: the run on b, gathered already, was counted again
    on the way out (3 messages published of 2)."""
    frames = b"".join(encode_publish(b"ex", rt, bytes(16), b"p") for rt in (b"b", b"a"))
    ops = [["bind", b"ex", b'prefix:"a" route_contains("c")', 0, 0], ["read", frames, False]]
    answer = same(workers, {"kind": "routing", "ops": _hexed(ops)})
    assert answer[0][1] == [[2, 2, []]]
    assert answer[2][0] == 2 and answer[2][4] == 2  # two messages, neither routed
