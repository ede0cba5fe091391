"""NATS JetStream as a durable peer: nats-server with JetStream on, its store on disk.

The rows that compare acknowledged, durable publishes (and a replay of what was kept) run
it through bench/jsload.py, a raw-protocol generator (docs/bench.md, "Durable peers:
JetStream").
"""

from __future__ import annotations

import contextlib
import shutil
import subprocess

from .harness import System


class JetStream(System):
    """nats-server with ``-js``: its store in the System's workdir, under ./var/bench (a
    real disk: /tmp may be tmpfs, where a write to the store would cost nothing)."""

    loadgen = "bench.jsload"  # the generator module the suite hands to harness.Client

    def __init__(self) -> None:
        super().__init__("jetstream", "jetstream")

    def available(self) -> str | None:
        if shutil.which("nats-server") is None:
            return "skipped: nats-server not installed (make bench-peers)"
        return None

    def command(self) -> list[str]:
        assert self.workdir is not None
        return [
            "nats-server", "-a", "127.0.0.1", "-p", str(self.port), "-js",
            "-sd", str(self.workdir / "jetstream"),
            # Its log in a file: a full stderr pipe nobody reads would stall the server.
            "-l", str(self.workdir / "nats-server.log"),
        ]  # fmt: skip

    def _wait_listening(self) -> None:
        try:
            super()._wait_listening()
        except RuntimeError as exc:  # its own words are in the log file, not on stderr
            assert self.workdir is not None
            log = self.workdir / "nats-server.log"
            tail = log.read_text(errors="replace")[-2000:] if log.exists() else ""
            raise RuntimeError(f"{exc}\n{tail}".strip()) from None

    def version(self) -> str:
        """The server's release as the table prints it ("2.9.10"), or "" when unknown."""
        with contextlib.suppress(OSError, subprocess.SubprocessError):
            out = subprocess.run(
                ["nats-server", "--version"], capture_output=True, text=True, timeout=5
            )
            for word in (out.stdout or out.stderr).split():
                if word[:2] == "v2" or word[:1].isdigit():
                    return word.removeprefix("v")
        return ""
