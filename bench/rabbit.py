"""RabbitMQ as a durable peer: a private node of Debian's rabbitmq-server, one per System.

The node lives in the System's workdir under ./var/bench (a real disk: its confirms wait
for fsync), listens for AMQP on 127.0.0.1 only, on the System's free port, and keeps its
own distribution port, epmd, Erlang cookie (HOME is the workdir), mnesia and log
directories, and an empty plugin list, so it touches nothing of a system-wide install
(/etc/rabbitmq, /var/lib/rabbitmq) and a second node could run beside it. Load generators
speak AMQP 0-9-1 to it from bench/amqpload.py (docs/bench.md, "Durable peers").
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import time
from pathlib import Path

from .amqpload import AmqpError, Connection
from .harness import ENV, System, free_port, spawn, stop_process

BOOT_SECONDS = 60.0  # a cold node boots in several seconds; a busy 2-core box takes longer


def server_script() -> Path | None:
    """The rabbitmq-server script that runs the node in this process, or None.

    Debian's /usr/sbin/rabbitmq-server is a wrapper that changes to /var/lib/rabbitmq and
    runs the real script as the rabbitmq user; the real one sits beside the wrapper.
    """
    found = shutil.which("rabbitmq-server")
    if found is None:
        return None
    real = Path(os.path.realpath(found))
    if real.name == "rabbitmq-script-wrapper":
        real = real.parent / "rabbitmq-server"
    return real if real.is_file() else None


class RabbitMQ(System):
    """A RabbitMQ node for the durable rows; ``queue_type`` is what the generators declare
    ("classic": a durable classic queue, "quorum": a quorum queue on this one node)."""

    loadgen = "bench.amqpload"

    def __init__(self, queue_type: str = "classic") -> None:
        if queue_type not in ("classic", "quorum"):
            raise ValueError(f"queue_type must be classic or quorum, not {queue_type!r}")
        super().__init__(f"rabbitmq {queue_type}", "amqp")
        self.queue_type = queue_type
        self.dist_port = 0
        self.epmd_port = 0
        self.epmd: subprocess.Popen[bytes] | None = None
        self.boot_seconds = 0.0

    def version(self) -> str:
        """The release installed ("3.10.8"): Debian's lib/rabbitmq_server-X beside the
        script, read without starting a node (rabbitmqctl would need one)."""
        script = server_script()
        found = sorted(script.parent.parent.glob("lib/rabbitmq_server-*")) if script else []
        return found[-1].name.removeprefix("rabbitmq_server-") if found else ""

    def available(self) -> str | None:
        if server_script() is None or shutil.which("epmd") is None:
            return "skipped: rabbitmq-server not installed (make bench-peers)"
        return None

    def command(self) -> list[str]:
        """The server script; first the node's files in the workdir, which System.start()
        has just made and spawns this in."""
        script = server_script()
        assert script is not None
        self._write_config()
        return [str(script)]

    def environment(self) -> dict[str, str]:
        assert self.workdir is not None
        work = self.workdir
        # Kernel arguments: no epmd of the node's own (ours runs already, see start()), and
        # the distribution listener on loopback only.
        erl_args = "-noinput -start_epmd false -kernel inet_dist_use_interface {127,0,0,1}"
        return {
            **ENV,
            "HOME": str(work),  # the Erlang cookie, .erlang.cookie, is written here
            # The script then execs erl, and erl execs beam.smp: the process spawn() started
            # is the server (its CPU is what the suite reads). Without it the script stays,
            # a parent that forwards signals. -noinput keeps the Erlang shell off stdin.
            "RABBITMQ_ALLOW_INPUT": "1",
            "RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS": erl_args,
            "ERL_EPMD_PORT": str(self.epmd_port),
            "ERL_EPMD_ADDRESS": "127.0.0.1",
            "RABBITMQ_NODENAME": f"bench{self.port}@localhost",
            "RABBITMQ_NODE_IP_ADDRESS": "127.0.0.1",
            "RABBITMQ_NODE_PORT": str(self.port),
            "RABBITMQ_DIST_PORT": str(self.dist_port),
            "RABBITMQ_CONF_ENV_FILE": str(work / "rabbitmq-env.conf"),  # none: not /etc's
            "RABBITMQ_CONFIG_FILE": str(work / "rabbitmq.conf"),
            "RABBITMQ_CONFIG_FILES": str(work / "conf.d"),
            "RABBITMQ_ADVANCED_CONFIG_FILE": str(work / "advanced.config"),
            "RABBITMQ_ENABLED_PLUGINS_FILE": str(work / "enabled_plugins"),
            "RABBITMQ_MNESIA_BASE": str(work / "mnesia"),
            "RABBITMQ_LOG_BASE": str(work / "log"),
            "RABBITMQ_LOGS": str(work / "log" / "rabbit.log"),
            "RABBITMQ_PID_FILE": str(work / "rabbit.pid"),
            "RABBITMQ_MOTD_FILE": str(work / "motd"),
        }

    def _write_config(self) -> None:
        assert self.workdir is not None
        work = self.workdir
        for sub in ("mnesia", "log", "conf.d"):
            (work / sub).mkdir()
        (work / "enabled_plugins").write_text("[].\n")
        # Defaults otherwise: persistent messages on a durable classic queue (v1 index,
        # bodies under 4 KiB embedded in it) or a quorum queue are confirmed once fsynced.
        (work / "rabbitmq.conf").write_text("log.file.level = info\nlog.console = false\n")

    def start(self) -> None:
        # The ports are picked here rather than in System.start(): the environment, read
        # there, needs them all; System.start() takes its own free port for AMQP after.
        self.dist_port = free_port()
        self.epmd_port = free_port()
        try:
            # epmd first, in the foreground and in a process group of its own, so that
            # stop() ends it: an epmd the node started would daemonise and outlive the run.
            self.epmd = spawn(
                ["epmd", "-port", str(self.epmd_port), "-address", "127.0.0.1"],
                env={**ENV, "ERL_EPMD_PORT": str(self.epmd_port)},
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
            self._wait_epmd()
            super().start()
        except BaseException:
            self.stop()
            raise

    def _wait_epmd(self) -> None:
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            with contextlib.suppress(OSError):
                socket.create_connection(("127.0.0.1", self.epmd_port), timeout=1).close()
                return
            if self.epmd is not None and self.epmd.poll() is not None:
                raise RuntimeError(f"epmd exited ({self.epmd.returncode})")
            time.sleep(0.02)
        raise RuntimeError(f"epmd did not listen on {self.epmd_port}")

    def _wait_listening(self) -> None:
        """Until guest can log in on the AMQP port: the listener opens last in the boot,
        so the node is then ready for clients."""
        began = time.monotonic()
        deadline = began + BOOT_SECONDS
        while time.monotonic() < deadline:
            if self.proc is not None and self.proc.poll() is not None:
                err = self.proc.stderr.read().decode() if self.proc.stderr else ""
                raise RuntimeError(f"{self.name} exited: {err[-2000:]}{self._log_tail()}")
            if _answers_amqp(self.port):
                self.boot_seconds = time.monotonic() - began
                return
            time.sleep(0.1)
        raise RuntimeError(f"{self.name} did not answer AMQP on {self.port}{self._log_tail()}")

    def _log_tail(self) -> str:
        if self.workdir is None:
            return ""
        with contextlib.suppress(OSError):
            text = (self.workdir / "log" / "rabbit.log").read_text(errors="replace")
            return "\nrabbit.log: " + text[-2000:]
        return ""

    def stop(self) -> None:
        """The node (SIGTERM: it stops cleanly), then its epmd, then the workdir."""
        if self.proc is not None:
            stop_process(self.proc, 30)  # a clean stop takes a few seconds
        self.proc = None
        if self.epmd is not None:
            stop_process(self.epmd)
        self.epmd = None
        super().stop()


def _answers_amqp(port: int) -> bool:
    """Whether a guest can log in; then a clean close (a probe that hung up after
    connection.start would leave a warning in the node's log)."""
    try:
        conn = Connection(port, timeout=5)
    except OSError:
        return False
    try:
        conn.login()
    except (OSError, AmqpError):
        conn.sock.close()
        return False
    conn.close()
    return True
