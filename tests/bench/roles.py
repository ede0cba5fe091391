"""Running a load generator's role in the test's process, against a scripted server."""

from __future__ import annotations

import io
import json
import sys
from collections.abc import Callable
from typing import Any

import pytest


def run_role(
    main: Callable[[list[str]], None],
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    *argv: str,
) -> dict[str, Any]:
    """``main(argv)`` told to go at once: its READY line, then its JSON line, returned."""
    monkeypatch.setattr(sys, "stdin", io.StringIO("go\n"))
    main(list(argv))
    ready, result = capsys.readouterr().out.splitlines()
    assert ready == "READY"
    figures: dict[str, Any] = json.loads(result)
    return figures
