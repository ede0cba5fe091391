"""py-spy flame graphs of a server during a run: ``python -m bench --flame DIR [--native]``.

py-spy samples the process from outside (``--pid``; ``--nonblocking``, so the broker is
never paused, at the price of a stack now and then read while it changes) and writes the
SVG when it gets SIGINT. It needs CPU of its own, on a 2-core box the one the load
generators want: the figures of a recorded run are not the table's, and a flame graph shows
shares of the broker's time, not its speed. ``--native`` adds the C frames (uvloop's
reads and writes, the interpreter's copies), pausing the broker at every sample.
"""

from __future__ import annotations

import shutil
import signal
import subprocess
import sys
from pathlib import Path

from . import harness

RATE = 250  # samples a second: a few seconds of a run give a thousand stacks or so


def py_spy() -> str | None:
    """py-spy on PATH, or beside this interpreter (a venv's bin/)."""
    beside = Path(sys.executable).with_name("py-spy")
    return shutil.which("py-spy") or (str(beside) if beside.is_file() else None)


class Flame:
    """py-spy recording ``pid`` from now until :meth:`finish`, into the SVG ``path``."""

    def __init__(self, pid: int, path: Path, rate: int = RATE, native: bool = False) -> None:
        exe = py_spy()
        if exe is None:
            raise RuntimeError("--flame: py-spy not found (pip install py-spy)")
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self.proc = harness.spawn(
            [exe, "record", "--pid", str(pid), "--output", str(path), "--format", "flamegraph",
             "--rate", str(rate),
             # C frames (uvloop, the interpreter) need the broker paused at each sample.
             *(["--native"] if native else ["--nonblocking"])],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
        )  # fmt: skip
        assert self.proc.stdout is not None
        # "py-spy> Sampling process ..." once it is attached: only then may the run start.
        line = self.proc.stdout.readline()
        if b"Sampling" not in line:
            self.stop()
            raise RuntimeError(f"py-spy did not attach to {pid}: {line.decode(errors='replace')}")

    def finish(self) -> None:
        """Stop sampling and write the SVG; a line starting ``  !`` when py-spy could not."""
        assert self.proc.stdout is not None
        self.proc.send_signal(signal.SIGINT)
        try:
            out, _ = self.proc.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            out = b"(no exit 60 s after SIGINT)"
        if self.proc.returncode != 0 or not self.path.is_file():
            print(f"  ! flame {self.path}: {out.decode(errors='replace')[-500:]}", flush=True)
        self.stop()

    def stop(self) -> None:
        harness.stop_process(self.proc, 5)
