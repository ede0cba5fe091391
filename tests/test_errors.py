"""One exception tree: every public exception of the package derives from FqError.

The modules are imported and their classes read (not their source): a class defined in
one module and re-exported from another is checked once, where it is defined.
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import pkgutil
import re
from types import ModuleType

import pytest

import fqbroker
from fqbroker import errors
from fqbroker.errors import FqError

# Signals that never reach a user as themselves, each caught inside the package (errors.py
# says why each stays outside the tree). Listed by where they are defined.
INTERNAL = {
    "fqbroker.protocols.decoding.NeedData",
    "fqbroker.frontends.http.reads.queues.Refused",
    "fqbroker.frontends.http.admin.base.Refused",
    "fqbroker.storage.segments.records.Damaged",
    "fqbroker.storage.segments.checkpoints.Unreadable",
}
# ``python -m fqbroker`` runs the broker when imported; it defines nothing.
NOT_IMPORTED = {"fqbroker.__main__"}


def _modules() -> list[ModuleType]:
    modules = [fqbroker]
    for info in pkgutil.walk_packages(fqbroker.__path__, "fqbroker."):
        if info.name in NOT_IMPORTED:
            continue
        if info.name.startswith("fqbroker.spark") and importlib.util.find_spec("pyspark") is None:
            continue  # the optional extra is not installed here
        modules.append(importlib.import_module(info.name))
    return modules


def _exceptions() -> dict[str, type[BaseException]]:
    found: dict[str, type[BaseException]] = {}
    for module in _modules():
        for name, value in vars(module).items():
            if (
                inspect.isclass(value)
                and issubclass(value, BaseException)
                and value.__module__ == module.__name__
                and not name.startswith("_")
            ):
                found[f"{module.__name__}.{name}"] = value
    return found


def test_the_walk_finds_the_package_and_its_exceptions() -> None:
    names = {module.__name__ for module in _modules()}
    assert {"fqbroker.core.frames", "fqbroker.storage.segments.log", "fqbroker.errors"} <= names
    assert "fqbroker.errors.ClientClosed" in _exceptions()  # so the next test is not vacuous


def test_every_public_exception_is_an_fq_error() -> None:
    outside = {
        name
        for name, cls in _exceptions().items()
        if not issubclass(cls, FqError) and name not in INTERNAL
    }
    assert outside == set()


def test_the_internal_signals_exist_and_are_named_in_errors_py() -> None:
    found = _exceptions()
    for name in INTERNAL:
        assert name in found, f"{name} is gone: drop it from INTERNAL"
        assert name.removeprefix("fqbroker.") in (errors.__doc__ or "")


def test_every_exception_of_the_tree_is_in_errors_py_and_its_drawing() -> None:
    for name, cls in _exceptions().items():
        if issubclass(cls, FqError):
            assert cls.__module__ == "fqbroker.errors", name
    drawing = (errors.__doc__ or "").split("::", 1)[1].split("\n\n")[1]
    for name in errors.__all__:
        assert re.search(rf"\b{name}\b", drawing), name


@pytest.mark.parametrize(
    ("module", "names"),
    [
        ("fqbroker.clients.fq.client", ["ClientError", "ClientClosed"]),
        ("fqbroker.clients.http.replay", ["BrokerError", "DataLost"]),
        ("fqbroker.storage.configdb.checkpoints", ["CheckpointError"]),
        ("fqbroker.storage.segments.log", ["LogFormatError"]),
        ("fqbroker.spark", ["DataLossError"]),
        ("fqbroker.protocols.figg.wire", ["FiggProtocolError"]),
        ("fqbroker.protocols.fyrehose.wire", ["FyrehoseProtocolError"]),
        ("fqbroker.protocols.opencluster.wire", ["OpenClusterProtocolError"]),
    ],
)
def test_exceptions_stay_importable_where_users_import_them(module: str, names: list[str]) -> None:
    if module.startswith("fqbroker.spark") and importlib.util.find_spec("pyspark") is None:
        pytest.skip("pyspark is not installed")
    imported = importlib.import_module(module)
    for name in names:
        assert getattr(imported, name) is getattr(errors, name)
        assert name in imported.__all__


def test_the_natural_base_classes_are_kept() -> None:
    assert issubclass(errors.ClientClosed, ConnectionError)
    assert issubclass(errors.ClientClosed, errors.ClientError)
    assert issubclass(errors.DataLost, errors.BrokerError)
    assert issubclass(errors.DataLossError, RuntimeError)
    assert issubclass(errors.FiggProtocolError, errors.ProtocolError)
    assert issubclass(errors.FyrehoseProtocolError, errors.ProtocolError)
    assert issubclass(errors.OpenClusterProtocolError, errors.ProtocolError)
