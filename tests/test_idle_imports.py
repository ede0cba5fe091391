"""What an idle broker imports: nothing that only a request, a configured listener or a
password needs (bench/RESULTS.md, the idle row: every module is RSS of every broker).

fqd runs in a child process as it does from the command line; once it listens it writes
its sys.modules and stops. The modules made lazy then load when first used: the front
ends' own tests, tests/test_http*.py and tests/storage/configdb/test_users.py run those paths.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

# Imported once the broker listens, by what needs them: a listener of its own
# configured, an HTTP request, a password checked, a read behind a disk queue's memory.
LAZY = (
    "fqbroker.frontends.lumberjack.session",
    "fqbroker.frontends.lumberjack.machine",
    "fqbroker.protocols.lumberjack.wire",
    "fqbroker.frontends.lumberjack.mapping",
    "fqbroker.frontends.figg.session",
    "fqbroker.frontends.figg.machine",
    "fqbroker.protocols.figg.wire",
    "fqbroker.frontends.kit.publishing",
    "fqbroker.frontends.fyrehose.endpoint",
    "fqbroker.frontends.fyrehose.backbone",
    "fqbroker.protocols.fyrehose.wire",
    "fqbroker.frontends.opencluster.session",
    "fqbroker.frontends.opencluster.machine",
    "fqbroker.storage.kv.store",
    "fqbroker.storage.topics.retained",
    "fqbroker.storage.topics.topic",
    "fqbroker.storage.topics.retention",
    "fqbroker.peering.link",
    "fqbroker.frontends.http.host",
    "fqbroker.frontends.http.auth",
    "fqbroker.frontends.http.endpoints",
    "fqbroker.frontends.http.submit",
    "fqbroker.frontends.http.stats.snapshot",
    "fqbroker.frontends.http.stats.metrics",
    "fqbroker.frontends.http.stats.frontends",
    "fqbroker.frontends.figg.stats",
    "fqbroker.frontends.fyrehose.stats",
    "fqbroker.frontends.opencluster.stats",
    "fqbroker.frontends.kit.panel",
    "h11",
    "prometheus_client",
    "aiofiles",
    "hashlib",
    "hmac",
    "importlib.resources",
    "tempfile",
    "hypothesis",
)

# fqd as its console script runs it; when it listens (right after its malloc trim), the
# modules go to stdout and the broker is asked to stop as SIGTERM would.
_CHILD = """
import json, os, signal, sys
from fqbroker.cli import fqd as cli
trim = cli._trim_malloc
def listening():
    trim()
    print(json.dumps(sorted(sys.modules)), flush=True)
    os.kill(os.getpid(), signal.SIGTERM)
cli._trim_malloc = listening
sys.exit(cli.fqd(sys.argv[1:]))
"""


def _modules_of_idle_broker(tmp_path: Path, *args: str) -> set[str]:
    fqd = ["-p", "0", "-n", "10.0.0.1", "--data-dir", str(tmp_path), *args]
    done = subprocess.run(
        [sys.executable, "-c", _CHILD, *fqd],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return set(json.loads(done.stdout.splitlines()[0]))


def test_an_idle_broker_does_not_import_what_it_does_not_use(tmp_path: Path) -> None:
    modules = _modules_of_idle_broker(tmp_path)
    assert "fqbroker.server.broker" in modules  # it did start
    assert "fqbroker.frontends.fq.command" in modules
    assert sorted(m for m in LAZY if m in modules) == []


def test_a_configured_listener_imports_its_front_end(tmp_path: Path) -> None:
    modules = _modules_of_idle_broker(tmp_path, "--lumberjack", "127.0.0.1:0")
    assert "fqbroker.frontends.lumberjack.session" in modules
    assert "fqbroker.frontends.figg.session" not in modules


def test_a_figg_listener_imports_the_topic_logs(tmp_path: Path) -> None:
    modules = _modules_of_idle_broker(tmp_path, "--figg", "127.0.0.1:0")
    assert "fqbroker.storage.topics.retained" in modules
