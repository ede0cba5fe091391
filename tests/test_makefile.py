"""The Makefile: `make help` names every target a user may type, one line each."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.skipif(shutil.which("make") is None, reason="make is not installed")
def test_make_help_lists_every_phony_target_once() -> None:
    text = (ROOT / "Makefile").read_text()
    phony = {t for line in re.findall(r"^\.PHONY:(.*)$", text, re.M) for t in line.split()}
    out = subprocess.run(
        ["make", "--no-print-directory", "-C", str(ROOT), "help"],
        capture_output=True, text=True, timeout=30, check=True,
    ).stdout  # fmt: skip
    listed = [line.split()[0] for line in out.splitlines()]
    assert sorted(listed) == sorted(phony)
    assert all(len(line.split(maxsplit=1)) == 2 for line in out.splitlines())  # with its text
    assert "PORT=" in out and "VARDIR=" in out  # how to run a second broker


def test_the_readme_runs_a_second_broker_with_the_run_targets_variables() -> None:
    text = (ROOT / "Makefile").read_text()
    run = re.search(r"^run:.*\n((?:\t.*\n)+)", text, re.M)
    assert run is not None
    assert "-p $(PORT)" in run.group(1) and "$(VARDIR)/" in run.group(1)
    readme = (ROOT / "README.md").read_text()
    assert "make run PORT=8766 VARDIR=var2" in readme
    assert "fqd -p 8766 --data-dir var2" in readme
