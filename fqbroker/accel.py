"""Which implementation of the hot modules runs: compiled or pure Python (docs/accel.md).

The modules in :data:`MODULES` can be compiled with mypyc into one extension (``setup.py``
builds it where mypyc and a C compiler are present; ``make accel``). The pure sources stay
beside the extensions, so the choice is made once, when ``fqbroker`` is first imported,
and for all of them or none: ``FQBROKER_PURE=1``, or a source changed since the build's
``_compiled.json``, means pure Python, and :data:`REASON` says why. Imported by
``fqbroker/__init__.py`` and by ``setup.py`` (by path): the standard library only.
"""

from __future__ import annotations

import importlib
import importlib.machinery
import importlib.util
import json
import os
import sys
from collections.abc import Sequence
from types import ModuleType
from typing import Any, Final

try:
    # The interpreter's own SHA-256, the same digest: hashlib's would load OpenSSL's
    # digests into every broker (bench/RESULTS.md, the idle row).
    _sha256: Any = importlib.import_module("_sha256").sha256
except ImportError:  # an interpreter built without it
    from hashlib import sha256 as _sha256

__all__ = ["ACCELERATED", "ENV", "MODULES", "REASON", "describe"]

ENV: Final = "FQBROKER_PURE"
# The extension all compiled modules share (mypyc's group library: ``<group>__mypyc``).
GROUP: Final = "fqbroker._compiled"
LIBRARY: Final = GROUP + "__mypyc"
MANIFEST: Final = "_compiled.json"

# The hot loops the profiles name: the fq data path (decode, queue, publish). Each must
# compile with mypyc as it is. A compiled class cannot be subclassed by an interpreted
# one, so the subclasses of decoding.py's decoders are compiled too (fq's, Figg's and
# OpenCluster's wire.py); the router, with the exchanges, counters and prefix index it
# calls per batch; OpenCluster's store and machine (a read's run of sets:
# KVStore.put_frames, a get). Not targets.py (Sink has interpreted subclasses) nor
# program.py: see docs/accel.md.
MODULES: Final[tuple[str, ...]] = (
    "fqbroker.protocols.decoding",
    "fqbroker.protocols.fq.wire",
    "fqbroker.protocols.figg.wire",
    "fqbroker.core.frames",
    "fqbroker.core.message",
    "fqbroker.protocols.fq.largeframe",
    "fqbroker.protocols.fq.msgdecoder",
    "fqbroker.frontends.fq.datachannel",
    "fqbroker.core.memstore",
    "fqbroker.core.queue",
    "fqbroker.core.publisher",
    "fqbroker.core.router",
    "fqbroker.core.exchange",
    "fqbroker.core.routestats",
    "fqbroker.core.prefixes",
    "fqbroker.protocols.opencluster.wire",
    "fqbroker.storage.kv.store",
    "fqbroker.frontends.opencluster.machine",
    "fqbroker.storage.segments.runs",
)

_PACKAGE_DIR: Final = os.path.dirname(os.path.abspath(__file__))


def source_path(module: str, package_dir: str = _PACKAGE_DIR) -> str:
    """The ``.py`` file of one of :data:`MODULES` (``fqbroker.x.y`` -> ``<pkg>/x/y.py``)."""
    parts = module.split(".")[1:]
    return os.path.join(package_dir, *parts) + ".py"


def digest(path: str) -> str:
    with open(path, "rb") as f:
        return str(_sha256(f.read()).hexdigest())


def manifest(modules: Sequence[str], package_dir: str) -> dict[str, object]:
    """What a build records: the extension suffix it was built for and each source's hash."""
    return {
        "suffix": importlib.machinery.EXTENSION_SUFFIXES[0],
        "modules": {m: digest(source_path(m, package_dir)) for m in modules},
    }


def _check(package_dir: str, *, env: bool = True) -> str | None:
    """Why the compiled modules cannot run here (None: they can); with ``env`` False,
    whatever FQBROKER_PURE says."""
    if env and os.environ.get(ENV, "") not in ("", "0"):
        return f"{ENV} is set"
    try:
        with open(os.path.join(package_dir, MANIFEST), encoding="utf-8") as f:
            built = json.load(f)
    except FileNotFoundError:
        return "not built"
    except (OSError, ValueError) as exc:
        return f"unreadable {MANIFEST}: {exc}"
    suffix = importlib.machinery.EXTENSION_SUFFIXES[0]
    if built.get("suffix") != suffix:
        return f"built for {built.get('suffix')}, not {suffix}"
    hashes = built.get("modules", {})
    if set(hashes) != set(MODULES):
        return "built for another set of modules"
    for module in MODULES:
        source = source_path(module, package_dir)
        if not os.path.exists(source[: -len(".py")] + suffix):
            return f"{module} not built"
        try:
            if digest(source) != hashes[module]:
                rel = os.path.relpath(source, os.path.dirname(package_dir))
                return f"{rel} changed since the build (make accel rebuilds)"
        except OSError as exc:
            return str(exc)
    try:
        importlib.import_module(LIBRARY)
    except ImportError as exc:
        return f"cannot load {LIBRARY}: {exc}"
    return None


class _SourceFirst:
    """Imports a module of the package from its ``.py`` source when an extension of an
    earlier build lies beside it that is not to run: every one when pure Python runs, and
    those of modules no longer in :data:`MODULES` when the build runs (their extension
    would look for its code in a shared library that no longer has it).

    A finder by its ``find_spec`` alone: importlib.abc's base class would import
    importlib.resources and with it tempfile, shutil and random, into every broker
    (bench/RESULTS.md, the idle row)."""

    def __init__(self, compiled: frozenset[str]) -> None:
        self.compiled = compiled

    def find_spec(
        self,
        fullname: str,
        path: Sequence[str] | None,
        target: ModuleType | None = None,
    ) -> importlib.machinery.ModuleSpec | None:
        if not fullname.startswith("fqbroker.") or fullname in self.compiled:
            return None
        source = source_path(fullname)
        if not os.path.exists(source[: -len(".py")] + _SUFFIX) or not os.path.exists(source):
            return None
        return importlib.util.spec_from_file_location(fullname, source)


_SUFFIX: Final = importlib.machinery.EXTENSION_SUFFIXES[0]


def _choose() -> tuple[bool, str]:
    reason = _check(_PACKAGE_DIR)
    accelerated = reason is None
    # By name: a fresh import of this module (tests forget the package) makes a new class.
    for finder in [f for f in sys.meta_path if type(f).__name__ == "_SourceFirst"]:
        sys.meta_path.remove(finder)
    sys.meta_path.insert(0, _SourceFirst(frozenset(MODULES if accelerated else ())))
    return (True, "compiled (mypyc)") if accelerated else (False, reason or "")


ACCELERATED, REASON = _choose()


def describe() -> str:
    """One phrase for ``--version`` and the bench: which implementation runs, and why
    pure Python if it does (``not built``: the install compiled nothing)."""
    if ACCELERATED:
        return f"compiled: {len(MODULES)} of {len(MODULES)} modules, mypyc"
    return f"pure Python: {REASON}"
