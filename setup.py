"""The optional compiled accelerator: fqbroker.accel.MODULES compiled with mypyc.

Everything else about the package is in pyproject.toml. The extension is built where
mypyc (the mypy package) can be imported and a C compiler works, and not with
FQBROKER_PURE=1 in the environment; if any of that fails the build goes on without it and
the package is pure Python (fqbroker.accel chooses at import). pyproject.toml's
build-system requires mypy, so pip's isolated build (``pip install .``, ``pip install -e
.``, ``pip wheel .``) has mypyc; ``make accel`` builds in place for a checkout.
"""

from __future__ import annotations

import importlib.util
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

from setuptools import setup
from setuptools.command.build_ext import build_ext

ROOT = Path(__file__).resolve().parent


def _accel() -> Any:
    # By path: the package's __init__ must not run in a build environment.
    spec = importlib.util.spec_from_file_location("_fqbroker_accel", ROOT / "fqbroker" / "accel.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _say(text: str) -> None:
    print(f"fqbroker accelerator: {text}", file=sys.stderr)


def _extensions() -> list[Any]:
    # Metadata only (pip asks for it before the build): nothing to say yet.
    if "egg_info" in sys.argv or "dist_info" in sys.argv:
        return []
    accel = _accel()
    if os.environ.get(accel.ENV, "") not in ("", "0"):
        _say(f"{accel.ENV} is set: pure Python")
        return []
    try:
        from mypyc.build import mypycify
    except ImportError:
        _say("mypyc is not installed: pure Python")
        return []
    paths = [
        os.path.relpath(accel.source_path(m, str(ROOT / "fqbroker")), ROOT) for m in accel.MODULES
    ]
    started = time.monotonic()
    try:
        # The modules it compiles must type-check; those they import are read for their
        # types only, so a dependency missing where this builds is no error.
        options = [
            "--follow-imports=silent",
            "--ignore-missing-imports",
            "--no-warn-unused-ignores",
        ]
        extensions = mypycify(
            [*options, *paths],
            opt_level=os.environ.get("FQBROKER_ACCEL_OPT", "3"),
            group_name=accel.GROUP,
        )
    except (Exception, SystemExit) as exc:  # mypyc exits on a type error
        _say(f"mypyc failed ({exc!r}): pure Python")
        return []
    _say(f"mypyc made C for {len(paths)} modules in {time.monotonic() - started:.1f} s")
    return list(extensions)


class BuildExt(build_ext):
    """build_ext where a failure leaves pure Python: no extension of the group is kept
    unless every one built, and the manifest fqbroker.accel checks is written last."""

    def run(self) -> None:
        if not self.extensions:
            return
        accel = _accel()
        inplace = self.inplace or self.editable_mode
        # A manifest is what says the extensions match their sources: none until they do.
        self._remove(accel, inplace, extensions=False)
        started = time.monotonic()
        try:
            super().run()
        except Exception as exc:  # no compiler, a compile error: CompileError, ...
            self._remove(accel, inplace, extensions=True)
            self._pure()
            _say(f"the C build failed ({str(exc)[:300]}): pure Python")
            return
        if inplace:
            self._remove_strays()
        data = accel.manifest(accel.MODULES, str(ROOT / "fqbroker"))
        for directory in self._package_dirs(accel, inplace):
            (directory / accel.MANIFEST).write_text(json.dumps(data, indent=1) + "\n")
        _say(f"compiled in {time.monotonic() - started:.1f} s")

    def _pure(self) -> None:
        """Nothing compiled: a wheel of this build is a pure one (py3-none-any, in
        purelib), as one built without the accelerator is, not one tagged for this
        platform with no extension in it. bdist_wheel chose its tag before the build and
        lays out the wheel after it."""
        self.distribution.ext_modules = []
        wheel = self.distribution.command_obj.get("bdist_wheel")
        if wheel is not None:
            wheel.root_is_pure = True  # type: ignore[attr-defined]

    def _package_dirs(self, accel: Any, inplace: bool) -> list[Path]:
        """Where fqbroker's extensions go: the build's tree, and the sources' if in place."""
        saved, self.inplace = self.inplace, False
        try:
            dirs = [Path(self.get_ext_fullpath(accel.LIBRARY)).parent]
        finally:
            self.inplace = saved
        if inplace:
            dirs.append(ROOT / "fqbroker")
        return dirs

    def _remove_strays(self) -> None:
        """Extensions beside the sources that this build did not make: those of modules
        no longer compiled (fqbroker.accel imports their sources anyway)."""
        package = ROOT / "fqbroker"
        made = {self._inplace_path(package, ext.name) for ext in self.extensions}
        suffix = Path(self.get_ext_filename("x")).name[1:]
        for path in package.rglob("*" + suffix):
            if path not in made:
                path.unlink()

    def _inplace_path(self, package: Path, name: str) -> Path:
        return package.joinpath(*name.split(".")[1:-1], Path(self.get_ext_filename(name)).name)

    def _remove(self, accel: Any, inplace: bool, *, extensions: bool) -> None:
        for directory in self._package_dirs(accel, inplace):
            doomed = [directory / accel.MANIFEST]
            if extensions:
                doomed += [self._inplace_path(directory, ext.name) for ext in self.extensions]
            for path in doomed:
                path.unlink(missing_ok=True)


setup(ext_modules=_extensions(), cmdclass={"build_ext": BuildExt})
