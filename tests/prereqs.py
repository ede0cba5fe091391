"""Tests that need something outside Python (Java for Spark, Chromium for the web UI, the
spark extra) skip without it on a developer's machine, saying why. On CI (``CI`` set, as
every CI service does) the same gap fails the run: a suite that passes green because its
Spark or browser tests never ran tells nobody anything."""

from __future__ import annotations

import importlib
import os
from types import ModuleType
from typing import NoReturn

import pytest


def on_ci() -> bool:
    return os.environ.get("CI", "").strip().lower() not in ("", "0", "false", "no")


def missing(reason: str) -> NoReturn:
    """Skip, or on CI fail, because ``reason`` (a prerequisite is not installed)."""
    if on_ci():
        pytest.fail(f"{reason} (CI is set: a prerequisite missing fails the run)", pytrace=False)
    pytest.skip(reason, allow_module_level=True)


def require_module(name: str, reason: str) -> ModuleType:
    """``importorskip`` that fails on CI."""
    try:
        return importlib.import_module(name)
    except ImportError as exc:
        missing(f"{reason}: {exc}")
