"""What ships for deployment, checked as far as this machine allows (docs/deploy.md).

* The package's metadata is built by the setuptools version build-system.requires names,
  offline, and says what PyPI shows: license expression and file, authors, URLs, keywords,
  classifiers from the official list.
* conf/fqbroker.service passes ``systemd-analyze verify`` (and ``security``) where systemd
  is installed, and its ExecStart line runs as written.
* The Dockerfile is built and run when a Docker daemon answers; otherwise it is checked
  statically, and the image's settings and health check run against a real fqd here.
* Every metric the Grafana dashboard queries is one /metrics of a real fqd exposes, with
  every front end on.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import shlex
import shutil
import socket
import subprocess
import sys
import tomllib
import uuid
import zipfile
from collections.abc import Iterator
from email.parser import Parser
from pathlib import Path
from typing import Any

import pytest
from packaging.requirements import Requirement
from packaging.version import Version
from prometheus_client.parser import text_string_to_metric_families

from fqbroker.clients.figg.client import FiggClient
from fqbroker.clients.fq.client import Client
from fqbroker.settings.broker import Settings
from tests.e2e.http.test_http import get
from tests.prereqs import missing, require_module
from tests.procs import ENV, ROOT, Proc

PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
UNIT = ROOT / "conf" / "fqbroker.service"
DOCKERFILE = ROOT / "Dockerfile"
IMAGE_CONFIG = ROOT / "conf" / "docker" / "fqd.toml"
DASHBOARD = ROOT / "conf" / "grafana" / "fqbroker-dashboard.json"
INSTALLED_FQD = "/opt/fqbroker/bin/fqd"  # where docs/deploy.md installs it for the unit


# --- license, changelog, package metadata -----------------------------------------------


def test_license_changelog_and_their_declarations() -> None:
    text = (ROOT / "LICENSE").read_text()
    assert text.startswith("MIT License\n\nCopyright (c) 2026 the fqbroker authors\n")
    assert 'THE SOFTWARE IS PROVIDED "AS IS"' in text
    project = PYPROJECT["project"]
    assert project["license"] == "MIT"
    assert project["license-files"] == ["LICENSE"]
    changelog = (ROOT / "CHANGELOG.md").read_text()
    assert "keepachangelog.com" in changelog
    assert "\n## [Unreleased]\n" in changelog


PACKAGES = ("fqbroker", "pyspark_fqbroker")


def build_backend(tmp_path: Path, hook: str) -> Path:
    """Run setuptools' ``hook`` (prepare_metadata_for_build_wheel, build_wheel) on a copy of
    the checkout (nothing is written into it) with this venv's setuptools, which must
    satisfy build-system.requires (the dev extra installs it), offline; what it made."""
    import setuptools

    # mypy, the other requirement, brings mypyc for the accelerator, not built here.
    requires = [Requirement(r) for r in PYPROJECT["build-system"]["requires"]]
    (wanted,) = [r for r in requires if r.name == "setuptools"]
    if Version(setuptools.__version__) not in wanted.specifier:
        missing(f"setuptools {setuptools.__version__} here; the package needs {wanted}")
    require_module("trove_classifiers", "trove-classifiers (the dev extra)")
    src = tmp_path / "src"
    src.mkdir()
    for name in ("pyproject.toml", "setup.py", "README.md", "LICENSE"):
        shutil.copy(ROOT / name, src / name)
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info", "*.so", "_compiled.json")
    for package in PACKAGES:
        shutil.copytree(ROOT / package, src / package, ignore=ignore)
    out = tmp_path / "out"
    out.mkdir()
    code = f"import sys; from setuptools import build_meta; print(build_meta.{hook}(sys.argv[1]))"
    # Classifiers are checked against the trove-classifiers package, not PyPI's list.
    # Pure Python: compiling the accelerator (setup.py, with this venv's mypyc) takes
    # a minute and is checked by tests/test_accel.py.
    env = {
        **os.environ,
        "VALIDATE_PYPROJECT_NO_NETWORK": "1",
        "PYTHONWARNINGS": "default",
        "FQBROKER_PURE": "1",
    }
    done = subprocess.run(
        [sys.executable, "-c", code, str(out)],
        cwd=src, env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "Deprecat" not in done.stdout + done.stderr, done.stdout + done.stderr
    return out / done.stdout.strip().splitlines()[-1]


def test_metadata_builds_with_the_setuptools_it_requires(tmp_path: Path) -> None:
    """The metadata PyPI would show."""
    info = build_backend(tmp_path, "prepare_metadata_for_build_wheel")
    trove = require_module("trove_classifiers", "trove-classifiers (the dev extra)")
    meta = Parser().parsestr((info / "METADATA").read_text())
    assert meta["Name"] == "fqbroker"
    assert meta["License-Expression"] == "MIT"
    assert meta.get_all("License-File") == ["LICENSE"]
    assert (info / "licenses" / "LICENSE").read_text() == (ROOT / "LICENSE").read_text()
    assert meta["Author"] == "the fqbroker authors"
    assert meta["Description-Content-Type"] == "text/markdown"
    assert meta.get_payload().startswith("# fqbroker\n")
    assert "fq" in meta["Keywords"].split(",")
    urls = dict(u.split(", ", 1) for u in meta.get_all("Project-URL"))
    assert {"Homepage", "Documentation", "Changelog", "Issues"} <= set(urls)
    classifiers = meta.get_all("Classifier")
    assert classifiers and not [c for c in classifiers if c not in trove.classifiers]
    # PEP 639: a license expression replaces the license classifiers.
    assert not [c for c in classifiers if c.startswith("License ::")]
    assert f"Programming Language :: Python :: {sys.version_info[0]}.{sys.version_info[1]}" in (
        classifiers
    )


def test_wheel_carries_what_an_installed_fqd_needs(tmp_path: Path) -> None:
    """What `pip install` of the clone (the Dockerfile's, docs/deploy.md's) installs: every
    module, the web UI and other package data, the license and the console scripts."""
    wheel = build_backend(tmp_path, "build_wheel")
    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
        (info,) = {n.split("/")[0] for n in names if n.split("/")[0].endswith(".dist-info")}
        entry_points = archive.read(f"{info}/entry_points.txt").decode()
        license_text = archive.read(f"{info}/licenses/LICENSE").decode()
    tracked = subprocess.run(
        ["git", "ls-files", "--", *PACKAGES], cwd=ROOT, capture_output=True, text=True
    )
    if tracked.returncode != 0:
        pytest.skip(f"not a git checkout: {tracked.stderr.strip()}")
    shipped = [
        path
        for path in tracked.stdout.splitlines()
        if not path.endswith((".gitignore", ".md")) and (ROOT / path).is_file()
    ]
    assert len(shipped) > 100
    assert not [path for path in shipped if path not in names]
    assert "fqbroker/frontends/http/web/index.html" in names
    assert license_text == (ROOT / "LICENSE").read_text()
    for script, target in PYPROJECT["project"]["scripts"].items():
        assert f"{script} = {target}" in entry_points


# --- the systemd unit ---------------------------------------------------------------------


def unit_settings() -> dict[str, list[str]]:
    """Each key of conf/fqbroker.service with its values, in order (a key may repeat)."""
    settings: dict[str, list[str]] = {}
    for line in UNIT.read_text().splitlines():
        if line and not line.startswith(("#", "[")):
            key, _, value = line.partition("=")
            settings.setdefault(key, []).append(value)
    return settings


def test_unit_is_hardened_and_keeps_its_state_in_the_state_directory() -> None:
    unit = unit_settings()
    for key, value in {
        "DynamicUser": "yes",
        "StateDirectory": "fqbroker",
        "ProtectSystem": "strict",
        "ProtectHome": "yes",
        "PrivateTmp": "yes",
        "NoNewPrivileges": "yes",
        "RestrictAddressFamilies": "AF_INET AF_INET6 AF_UNIX",
        "Restart": "on-failure",
        "CapabilityBoundingSet": "",
    }.items():
        assert unit[key] == [value], key
    assert int(unit["LimitNOFILE"][0]) >= 65536
    # No path flags: fqd finds its data directory in $STATE_DIRECTORY. The only flag is
    # --config, and only when the settings file exists.
    (exec_start,) = unit["ExecStart"]
    runs = re.findall(r"exec ([^\s;']+)([^;']*)", exec_start)
    assert runs == [(INSTALLED_FQD, ' --config "$$config"'), (INSTALLED_FQD, "")]


def exec_start_argv(fqd: str) -> list[str]:
    """ExecStart as systemd runs it: ``$$`` is a literal ``$``, then split into words."""
    (line,) = unit_settings()["ExecStart"]
    return shlex.split(line.replace(INSTALLED_FQD, fqd).replace("$$", "$"))


def test_exec_start_adds_the_config_file_only_when_it_exists(tmp_path: Path) -> None:
    # A stand-in fqd that prints what it was run with.
    fqd = tmp_path / "fqd"
    fqd.write_text('#!/bin/sh\nfor arg; do echo "$arg"; done\n')
    fqd.chmod(0o755)
    etc = tmp_path / "etc"
    etc.mkdir()
    env = {"PATH": os.environ["PATH"], "CONFIGURATION_DIRECTORY": str(etc)}

    def run() -> list[str]:
        done = subprocess.run(
            exec_start_argv(str(fqd)), env=env, capture_output=True, text=True, timeout=10
        )
        assert done.returncode == 0 and not done.stderr
        return done.stdout.splitlines()

    assert run() == []
    (etc / "fqd.toml").write_text("[fqd]\n")
    assert run() == ["--config", str(etc / "fqd.toml")]


async def test_exec_start_runs_fqd_as_the_unit_does(tmp_path: Path, procs: list[Proc]) -> None:
    """ExecStart with the environment and working directory systemd gives it: a settings
    file in the configuration directory is read, and the state lands in the state
    directory without a path flag."""
    state, etc = tmp_path / "state", tmp_path / "etc"
    state.mkdir()
    etc.mkdir()
    (etc / "fqd.toml").write_text('[fqd]\nport = 0\nbind = "127.0.0.1"\nnode_id = "10.1.2.3"\n')
    fqd = tmp_path / "fqd"  # this checkout's fqd, as the installed script would run it
    fqd.write_text(f'#!/bin/sh\nexec {shlex.quote(sys.executable)} -m fqbroker "$@"\n')
    fqd.chmod(0o755)
    env = {**ENV, "STATE_DIRECTORY": str(state), "CONFIGURATION_DIRECTORY": str(etc)}
    argv = exec_start_argv(str(fqd))
    devnull, pipe = asyncio.subprocess.DEVNULL, asyncio.subprocess.PIPE
    process = await asyncio.create_subprocess_exec(
        *argv, cwd=state, env=env, stdin=devnull, stdout=devnull, stderr=pipe
    )
    child = Proc(process)
    procs.append(child)
    port = int((await child.wait_stderr("Listening on port: ")).rsplit(" ", 1)[1])
    stats = await _stats(port)
    assert stats["version"]
    child.proc.terminate()  # what systemctl stop sends
    status, _, err = await asyncio.wait_for(child.finish(), 30)
    assert status == 0, err
    assert list(state.rglob("fqd.sqlite")), sorted(state.rglob("*"))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["etc", "fqd", "state"]


def unit_copy(tmp_path: Path) -> Path:
    """The unit with ExecStart's fqd at this venv's, which exists here."""
    fqd = Path(sys.executable).with_name("fqd")
    copy = tmp_path / "fqbroker.service"
    copy.write_text(UNIT.read_text().replace(INSTALLED_FQD, str(fqd)))
    return copy


def systemd_analyze() -> str:
    found = shutil.which("systemd-analyze")
    if found is None:
        pytest.skip("systemd-analyze is not installed: the unit is checked statically only")
    return found


def test_systemd_analyze_verify(tmp_path: Path) -> None:
    analyze = systemd_analyze()
    copy = unit_copy(tmp_path)
    done = subprocess.run(
        [analyze, "verify", str(copy)], capture_output=True, text=True, timeout=60
    )
    # verify exits 0 on keys it ignores (a typo, a bad value) but names the file.
    complaints = [line for line in (done.stdout + done.stderr).splitlines() if copy.name in line]
    assert done.returncode == 0 and not complaints, done.stdout + done.stderr


def test_systemd_analyze_security_rates_the_unit_ok(tmp_path: Path) -> None:
    analyze = systemd_analyze()
    copy = unit_copy(tmp_path)
    done = subprocess.run(
        [analyze, "security", "--offline=true", "--no-pager", str(copy)],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    if "--offline" in done.stderr:
        pytest.skip(f"this systemd-analyze has no --offline: {done.stderr.strip()}")
    found = re.search(r"Overall exposure level for fqbroker\.service: ([\d.]+)", done.stdout)
    assert found, done.stdout + done.stderr
    # systemd's scale runs from 0 (locked down) to 10 (UNSAFE); up to 2 it says OK.
    assert float(found[1]) <= 2.0, done.stdout


# --- the Docker image ---------------------------------------------------------------------


def dockerfile() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) of the Dockerfile, continuation lines joined."""
    text = re.sub(r"\\\n", " ", DOCKERFILE.read_text())
    steps = []
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            word, _, rest = line.partition(" ")
            steps.append((word.upper(), rest.strip()))
    return steps


def final_stage() -> list[tuple[str, str]]:
    steps = dockerfile()
    last_from = max(i for i, (word, _) in enumerate(steps) if word == "FROM")
    return steps[last_from:]


def dockerignored(path: str) -> bool:
    """Whether .dockerignore keeps ``path`` out of the build context (its patterns here
    are plain names and **/ globs, without ! exceptions)."""
    from fnmatch import fnmatch

    patterns = [
        p.strip()
        for p in (ROOT / ".dockerignore").read_text().splitlines()
        if p.strip() and not p.startswith("#")
    ]
    assert not [p for p in patterns if p.startswith("!")]
    parts = path.split("/")
    prefixes = ["/".join(parts[: i + 1]) for i in range(len(parts))]
    for pattern in patterns:
        glob = pattern.removeprefix("**/")
        for prefix in prefixes:
            if fnmatch(prefix, pattern) or (
                glob != pattern and fnmatch(prefix.split("/")[-1], glob)
            ):
                return True
    return False


def healthcheck_code() -> str:
    (health,) = [rest for word, rest in final_stage() if word == "HEALTHCHECK"]
    command = json.loads(health.split(" CMD ", 1)[1])
    assert command[:2] == ["python", "-c"]
    code: str = command[2]
    return code


def test_dockerfile_static() -> None:
    """What the image promises, read from the Dockerfile (this runs with or without a
    Docker daemon; test_docker_image_builds_and_serves builds it where one answers)."""
    steps = dockerfile()
    args = dict(rest.split("=", 1) for word, rest in steps if word == "ARG")
    froms = [rest.split()[0] for word, rest in steps if word == "FROM"]
    images = [args.get(f.strip("${}"), f) for f in froms]
    assert images and all(re.fullmatch(r"python:3\.\d+-slim(-\w+)?", i) for i in images), images
    final = final_stage()
    words = dict(final)
    user = words["USER"].split(":")[0]
    assert user not in ("root", "0")
    assert json.loads(words["VOLUME"]) == ["/var/lib/fqbroker"]
    assert words["EXPOSE"].split() == ["8765"]
    entry = json.loads(words["ENTRYPOINT"])
    assert entry[0] == "fqd" and "fqd" in PYPROJECT["project"]["scripts"]
    assert entry[1:] == ["--config", "/etc/fqbroker/fqd.toml"]
    assert "http://127.0.0.1:8765/stats.json" in healthcheck_code()
    # pip installs the clone itself: every file it needs is in the build context.
    (install,) = [rest for word, rest in steps if word == "RUN" and "pip install" in rest]
    assert "'/src[uvloop]'" in install
    for needed in ("pyproject.toml", "README.md", "LICENSE", "fqbroker/cli/fqd.py",
                   "fqbroker/frontends/http/web/index.html", "pyspark_fqbroker",
                   "conf/docker/fqd.toml"):  # fmt: skip
        assert (ROOT / needed).exists() and not dockerignored(needed), needed
    for left_out in (".git", ".venv", "var/queues", "tests/interop/node_modules",
                     "fqbroker/__pycache__/cli.cpython-311.pyc"):  # fmt: skip
        assert dockerignored(left_out), left_out
    copied = [rest.split()[0] for word, rest in final if word == "COPY" and "--from" not in rest]
    assert copied == ["conf/docker/fqd.toml"]


def test_image_settings_serve_every_address_of_the_container() -> None:
    settings = Settings.from_toml(IMAGE_CONFIG)
    assert settings.bind == "0.0.0.0"
    assert settings.allow_open_network  # else fqd refuses 0.0.0.0 under auth = "none"
    assert settings.config_db.parent == settings.queue_dir.parent == Path("/var/lib/fqbroker")
    assert ("VOLUME", '["/var/lib/fqbroker"]') in final_stage()


async def test_image_health_check_passes_against_fqd(tmp_path: Path, procs: list[Proc]) -> None:
    """The image's settings file and its HEALTHCHECK command, run here against fqd (on
    loopback and in a temporary directory rather than the container's paths)."""
    fqd, port = await Proc.start_fqd(tmp_path, "--config", str(IMAGE_CONFIG), "--bind", "127.0.0.1")
    procs.append(fqd)
    code = healthcheck_code().replace("127.0.0.1:8765", f"127.0.0.1:{port}")
    check = await asyncio.create_subprocess_exec(sys.executable, "-c", code)
    assert await asyncio.wait_for(check.wait(), 30) == 0
    fqd.proc.terminate()
    status, _, _ = await asyncio.wait_for(fqd.finish(), 30)
    code = healthcheck_code().replace("127.0.0.1:8765", f"127.0.0.1:{port}")
    check = await asyncio.create_subprocess_exec(
        sys.executable, "-c", code, stderr=asyncio.subprocess.DEVNULL
    )
    assert status == 0 and await asyncio.wait_for(check.wait(), 30) != 0


def docker(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["docker", *args], capture_output=True, text=True, timeout=timeout)


@pytest.mark.timeout(1200)
def test_docker_image_builds_and_serves(tmp_path: Path) -> None:
    if shutil.which("docker") is None or docker("info").returncode != 0:
        pytest.skip("no Docker daemon answers `docker info`: test_dockerfile_static checked it")
    tag = f"fqbroker-test:{uuid.uuid4().hex[:12]}"
    name = f"fqbroker-test-{uuid.uuid4().hex[:12]}"
    built = docker("build", "-t", tag, str(ROOT), timeout=900)
    assert built.returncode == 0, built.stderr[-4000:]
    try:
        ran = docker("run", "-d", "--name", name, "-p", "127.0.0.1::8765", tag)
        assert ran.returncode == 0, ran.stderr
        user = docker("exec", name, "id", "-u").stdout.strip()
        assert user not in ("", "0")
        health = ""
        for _ in range(120):
            health = docker("inspect", "-f", "{{.State.Health.Status}}", name).stdout.strip()
            if health != "starting":
                break
            subprocess.run(["sleep", "1"], check=True)
        assert health == "healthy", docker("logs", name).stderr
        port = int(docker("port", name, "8765/tcp").stdout.split(":")[-1])
        stats = asyncio.run(_stats(port))
        assert stats["version"]
        stopped = docker("stop", "-t", "20", name, timeout=60)
        assert stopped.returncode == 0
        assert docker("inspect", "-f", "{{.State.ExitCode}}", name).stdout.strip() == "0"
    finally:
        docker("rm", "-f", "-v", name)
        docker("rmi", "-f", tag)


async def _stats(port: int) -> dict[str, Any]:
    response, body = await get(port, "/stats.json")
    assert response.status_code == 200
    stats: dict[str, Any] = json.loads(body)
    return stats


# --- the Grafana dashboard ------------------------------------------------------------------


def dashboard_panels() -> Iterator[dict[str, Any]]:
    """Every panel, those inside collapsed rows too."""
    for panel in json.loads(DASHBOARD.read_text())["panels"]:
        yield panel
        yield from panel.get("panels", [])


# Words of PromQL that are not metric names where they stand without a "(" after them.
_PROMQL_WORDS = {"by", "without", "on", "ignoring", "group_left", "group_right", "bool",
                 "offset", "and", "or", "unless"}  # fmt: skip
# Labels Prometheus adds to every scraped series itself.
_TARGET_LABELS = {"instance", "job"}


def promql_names(expr: str) -> tuple[set[str], set[str]]:
    """(metric names, label names) an expression uses."""
    labels = set(re.findall(r"([A-Za-z_]\w*)\s*(?:=~|!~|!=|=)\s*\"", expr))
    for group in re.findall(r"\b(?:by|without|on|ignoring)\s*\(([^)]*)\)", expr):
        labels |= {g.strip() for g in group.split(",") if g.strip()}
    bare = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)
    bare = re.sub(r"\{[^}]*\}|\[[^\]]*\]", " ", bare)
    bare = re.sub(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", bare)
    bare = re.sub(r"\$\w+|\b\d+(?:\.\d+)?(?:[eE][+-]?\d+)?\b", " ", bare)
    metrics = set()
    for found in re.finditer(r"[A-Za-z_:][\w:]*", bare):
        after = bare[found.end() :].lstrip()
        if not after.startswith("(") and found[0] not in _PROMQL_WORDS:
            metrics.add(found[0])
    return metrics, labels - _TARGET_LABELS


def test_promql_names_reads_metrics_and_labels() -> None:
    metrics, labels = promql_names(
        'topk(10, sum by (exchange, queue) (rate(fq_route_invocations_total{instance=~"$i",'
        ' exchange=~"$exchange"}[$__rate_interval]))) / 1e9 - time() + process_open_fds'
    )
    assert metrics == {"fq_route_invocations_total", "process_open_fds"}
    assert labels == {"exchange", "queue"}


async def scrape_all_front_ends(tmp_path: Path, procs: list[Proc]) -> dict[str, set[str]]:
    """/metrics of fqd with Lumberjack, Figg, fyrehose and OpenCluster listening, one
    upstream row (to a port where nobody listens: its link is down and its series are
    there), clients on a disk queue, a drop queue and a topic, a wrong admin token and
    garbage to the Lumberjack port (so the refusal and bad-input families have samples);
    each sample name with the labels it carries."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        nobody = s.getsockname()[1]
    config = tmp_path / "fqd.toml"
    config.write_text(
        '[fqd]\nadmin_token = "dash-token"\n\n[[upstream]]\n'
        f'host = "127.0.0.1"\nport = {nobody}\nsource = "down//mem:drop"\n'
        'exchange = "upstream-ex"\nprogram = "prefix:"\n'
    )
    listen = "127.0.0.1:0"
    fqd, port = await Proc.start_fqd(
        tmp_path, "--config", str(config), "--lumberjack", listen, "--figg", listen,
        "--fyrehose", listen, "--opencluster", listen,
    )  # fmt: skip
    procs.append(fqd)
    ports = {}
    for name in ("Lumberjack", "Figg"):
        line = await fqd.wait_stderr(f"{name} listening on port: ")
        ports[name] = int(line.rsplit(" ", 1)[1])
    reader, writer = await asyncio.open_connection("127.0.0.1", ports["Lumberjack"])
    writer.write(b"not lumberjack at all\n")
    assert await asyncio.wait_for(reader.read(), 10) == b""  # closed for bad input
    writer.close()
    refused, _ = await get(port, "/submit", [("X-Fq-Token", "wrong")])
    assert refused.status_code == 403
    async with (
        Client(port=port, source="dash/diskq/disk:fsync=always,public") as disk,
        Client(port=port, source="dash/dropq/mem:drop,backlog=1") as drop,
        Client(port=port, source="dash-pub") as pub,
        FiggClient(port=ports["Figg"]) as figg,
    ):
        await disk.bind(b"ex", b"prefix:")
        await drop.bind(b"ex", b"prefix:")
        for i in range(5):
            pub.publish(b"ex", b"route", b"m%d" % i)
        await pub.confirm()
        await figg.publish("dash-topic", b"retained")
        await figg.flush()
        response, body = await get(port, "/metrics")
    assert response.status_code == 200
    exposed: dict[str, set[str]] = {}
    for family in text_string_to_metric_families(body.decode()):
        for sample in family.samples:
            exposed.setdefault(sample.name, set()).update(sample.labels)
    return exposed


async def test_every_dashboard_metric_is_exposed(tmp_path: Path, procs: list[Proc]) -> None:
    exposed = await scrape_all_front_ends(tmp_path, procs)
    checked = 0
    for panel in dashboard_panels():
        for target in panel.get("targets", []):
            metrics, labels = promql_names(target["expr"])
            labels |= set(re.findall(r"\{\{\s*(\w+)\s*\}\}", target.get("legendFormat", "")))
            labels -= _TARGET_LABELS
            where = f"panel {panel['title']!r}: {target['expr']}"
            assert metrics, where
            assert not metrics - set(exposed), f"{where}: not exposed {metrics - set(exposed)}"
            have = set().union(*(exposed[m] for m in metrics))
            assert labels <= have, f"{where}: no label {labels - have}"
            checked += 1
    variables = json.loads(DASHBOARD.read_text())["templating"]["list"]
    for variable in variables:
        if variable["type"] == "query":
            found = re.fullmatch(r"label_values\((\w+)(?:\{.*\})?, (\w+)\)", variable["definition"])
            assert found, variable["definition"]
            metric, label = found.groups()
            assert label in exposed[metric] | _TARGET_LABELS, variable["definition"]
    assert checked >= 40


def test_dashboard_is_importable() -> None:
    """The shape Grafana imports: unique panel ids, one data source variable every query
    uses, and no panel overlapping another on the grid."""
    dash = json.loads(DASHBOARD.read_text())
    assert dash["uid"] and dash["title"] == "fqbroker" and dash["schemaVersion"] >= 36
    panels = list(dashboard_panels())
    ids = [p["id"] for p in panels]
    assert len(ids) == len(set(ids))
    (source,) = [v for v in dash["templating"]["list"] if v["type"] == "datasource"]
    uid = "${" + source["name"] + "}"
    cells: set[tuple[int, int]] = set()
    for panel in panels:
        if panel["type"] != "row":
            assert panel["datasource"]["uid"] == uid
            assert all(t["datasource"]["uid"] == uid for t in panel["targets"])
        pos = panel["gridPos"]
        assert pos["x"] + pos["w"] <= 24
        mine = {(pos["x"] + dx, pos["y"] + dy) for dx in range(pos["w"]) for dy in range(pos["h"])}
        assert not cells & mine, panel["title"]
        cells |= mine
