"""setup.py in pip's isolated build: what ``pip wheel .`` (and so ``pip install .``) of a
checkout gives a user.

One wheel is built, the way a user builds it (build isolation on: pip fetches
build-system.requires, mypy among them, from the package index), and shared by the tests:
it carries every module of fqbroker.accel.MODULES compiled, with the manifest of their
sources, and unpacked it runs them, as ``fqd --version`` says (and pure Python with
FQBROKER_PURE=1). Without a package index or a C compiler they skip (fail on CI, which
has both). The fallbacks (no C compiler, FQBROKER_PURE=1 at build time) are
tests/test_accel.py's.
"""

from __future__ import annotations

import importlib.machinery
import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from fqbroker import accel
from fqbroker.version import FQ_COMPAT_VERSION, __version__
from tests.prereqs import missing
from tests.procs import ROOT

SUFFIX = importlib.machinery.EXTENSION_SUFFIXES[0]
PACKAGES = ("fqbroker", "pyspark_fqbroker")
COMPILED = f"compiled: {len(accel.MODULES)} of {len(accel.MODULES)} modules, mypyc"


def _clean_env(**extra: str) -> dict[str, str]:
    """This environment without the checkout on the path or a choice of build."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", accel.ENV)}
    return {**env, **extra}


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    if shutil.which((os.environ.get("CC") or "cc").split()[0]) is None:
        missing("no C compiler (cc): pip wheel . would be pure Python")
    tmp = tmp_path_factory.mktemp("wheel")
    # A copy of what a clone has: no build of the checkout's comes along.
    src = tmp / "src"
    src.mkdir()
    for name in ("pyproject.toml", "setup.py", "README.md", "LICENSE"):
        shutil.copy(ROOT / name, src / name)
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info", "*.so", accel.MANIFEST)
    for package in PACKAGES:
        shutil.copytree(ROOT / package, src / package, ignore=ignore)
    out = tmp / "out"
    done = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-cache-dir",
         "--disable-pip-version-check", "-w", str(out), str(src)],
        cwd=tmp, env=_clean_env(), capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    text = done.stdout + done.stderr
    if done.returncode != 0 and "install build dependencies" in text:
        missing(f"pip could not fetch build-system.requires (no package index?): {text[-600:]}")
    assert done.returncode == 0, text
    (built,) = out.glob("fqbroker-*.whl")
    return built


@pytest.mark.timeout(900)
def test_pip_wheel_compiles_every_accelerated_module(wheel: Path) -> None:
    # A wheel for this Python and platform, not a pure one.
    assert not wheel.name.endswith("-none-any.whl"), wheel.name
    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
        built = json.loads(archive.read(f"fqbroker/{accel.MANIFEST}"))
    for module in accel.MODULES:
        assert module.replace(".", "/") + SUFFIX in names, module
        assert module.replace(".", "/") + ".py" in names, module  # the pure fallback
    assert accel.LIBRARY.replace(".", "/") + SUFFIX in names
    assert built == accel.manifest(accel.MODULES, str(ROOT / "fqbroker"))


@pytest.mark.timeout(900)
def test_an_installed_wheel_runs_compiled_and_version_says_so(wheel: Path, tmp_path: Path) -> None:
    """Unpacked as pip installs it, imported from there (its dependencies this venv's)."""
    site = tmp_path / "site"
    with zipfile.ZipFile(wheel) as archive:
        archive.extractall(site)

    def version(**env: str) -> str:
        done = subprocess.run(
            [sys.executable, "-m", "fqbroker", "--version"],
            cwd=tmp_path, env=_clean_env(PYTHONPATH=str(site), **env),
            capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
        return done.stdout

    head = f"fqd (fqbroker {__version__}, fq protocol {FQ_COMPAT_VERSION}"
    assert version() == f"{head}, {COMPILED})\n"
    assert version(FQBROKER_PURE="1") == f"{head}, pure Python: FQBROKER_PURE is set)\n"
