"""One TLS vocabulary for every client tool: --tls, --cafile, --cert and --key, fq-admin
included; real processes against a broker whose certificate a private CA signed."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import trustme

from fqbroker.server.broker import Broker
from fqbroker.settings.broker import Settings
from tests.conftest import on, port_of, running
from tests.pki import Logins, client_cert, make_pki, password_logins
from tests.procs import Proc

TIMEOUT = 30.0
ADMIN = ("-m", "fqbroker.cli.admin")
TOOLS = {
    "fq-send": ("-m", "fqbroker.cli.fqtools", "send"),
    "fq-recv": ("-m", "fqbroker.cli.fqtools", "recv"),
    "fq-admin": ADMIN,
    "figg": ("-m", "fqbroker.cli.figg"),
    "opencluster": ("-m", "fqbroker.cli.opencluster"),
}


@pytest.fixture
def pki(tmp_path: Path) -> dict[str, Path]:
    ca = trustme.CA()
    files = make_pki(ca, tmp_path)
    files["client"] = client_cert(ca, "someone", tmp_path)  # certificate and key in one
    return files


@pytest.fixture
async def tls_broker(settings: Settings, pki: dict[str, Path]) -> AsyncIterator[Broker]:
    """A broker whose fq and HTTP port (one port) speaks TLS with a private CA's cert."""
    settings.tls_cert, settings.tls_key = pki["cert"], pki["key"]
    async with running(settings) as broker:
        yield broker


async def run(procs: list[Proc], *args: str, stdin: bytes | None = None) -> tuple[int, str, str]:
    proc = await Proc.start(*args, stdin=asyncio.subprocess.PIPE if stdin is not None else None)
    procs.append(proc)
    async with asyncio.timeout(TIMEOUT):
        status, out, err = await proc.finish(stdin)
    return status, out.decode(), err


@pytest.mark.parametrize("tool", list(TOOLS))
async def test_each_tool_has_the_same_tls_flags(procs: list[Proc], tool: str) -> None:
    status, out, err = await run(procs, *TOOLS[tool], "--help")
    assert status == 0, err
    for flag in ("--tls", "--cafile FILE", "--cert FILE", "--key FILE"):
        assert flag in out, (flag, out)
    # The first spellings still work (below), but --help says only the one vocabulary.
    assert "--certfile" not in out and "--keyfile" not in out


async def test_fyrehose_has_no_tls_flags(procs: list[Proc]) -> None:
    status, out, _ = await run(procs, "-m", "fqbroker.cli.fyrehose", "--help")
    assert status == 0 and "--tls" not in out and "--cafile" not in out


async def test_fq_admin_reaches_a_broker_with_a_private_ca(
    tls_broker: Broker, pki: dict[str, Path], procs: list[Proc]
) -> None:
    where = f"127.0.0.1:{tls_broker.port}"
    for url in (f"https://{where}", f"http://{where}"):  # --cafile means TLS either way
        status, out, err = await run(
            procs, *ADMIN, "--url", url, "--cafile", str(pki["ca"]), "--json", "status"
        )
        assert status == 0, err
        assert '"version"' in out
    # A client certificate goes along when the broker asks; this one does not, and the
    # flags are taken all the same.
    client = str(pki["client"])
    status, out, err = await run(
        procs, *ADMIN, "--url", f"https://{where}", "--cafile", str(pki["ca"]),
        "--cert", client, "--key", client, "--json", "status",
    )  # fmt: skip
    assert status == 0, err
    # Without --cafile the system's CAs do not know the broker's: one line, exit 1.
    status, _, err = await run(procs, *ADMIN, "--url", f"https://{where}", "status")
    assert status == 1 and "Traceback" not in err
    assert err.startswith("fq-admin: ") and "certificate" in err, err


@pytest.mark.parametrize("tool", ["fq-admin", "fq-send", "figg", "opencluster"])
async def test_a_missing_tls_file_is_bad_input(procs: list[Proc], tool: str) -> None:
    args = {"fq-admin": ("status",), "fq-send": (), "figg": ("pub", "t"), "opencluster": ("ping",)}
    status, _, err = await run(procs, *TOOLS[tool], "--cafile", "/nonexistent/ca.pem", *args[tool])
    assert status == 2, err
    assert err == f"{tool}: --cafile /nonexistent/ca.pem: No such file or directory"


async def test_fq_send_and_fq_recv_over_tls_with_a_private_ca(
    tls_broker: Broker, pki: dict[str, Path], procs: list[Proc]
) -> None:
    common = ("-p", str(tls_broker.port), "--cafile", str(pki["ca"]), "-e", "ex")
    recv = await Proc.start(*TOOLS["fq-recv"], *common, "-b", "prefix:", "--count", "1")
    procs.append(recv)
    async with asyncio.timeout(TIMEOUT):
        await recv.wait_stderr("route set -> ")
        status, _, err = await run(procs, *TOOLS["fq-send"], *common, "-r", "r", stdin=b"hi\n")
        assert status == 0, err
        status, out, err = await recv.finish()
    assert status == 0, err
    assert out == b"[r] hi\n"


@pytest.fixture
def logins(settings: Settings, tmp_path: Path) -> Logins:
    logins = password_logins(settings, tmp_path, {"alice": [("publish", "*"), ("consume", "*")]})
    on(settings, "figg", tls_cert=logins.cert, tls_key=logins.key)
    on(settings, "opencluster", tls_cert=logins.cert, tls_key=logins.key)
    return logins


@pytest.mark.parametrize("spelling", [("--cert", "--key"), ("--certfile", "--keyfile")])
async def test_a_client_certificate_logs_in_with_cert_and_key(
    settings: Settings, logins: Logins, procs: list[Proc], spelling: tuple[str, str]
) -> None:
    cert = str(logins.client("alice"))  # certificate and key in one PEM file
    tls = ("--cafile", str(logins.cafile), spelling[0], cert, spelling[1], cert)
    async with running(settings) as broker:
        figg = (*TOOLS["figg"], "--port", str(port_of(broker, "figg")), *tls)
        status, _, err = await run(procs, *figg, "pub", "news", stdin=b"one\n")
        assert status == 0 and "published 1 messages" in err, err
        oc = (*TOOLS["opencluster"], "--port", str(port_of(broker, "opencluster")), *tls)
        status, _, err = await run(procs, *oc, "ping")
        assert status == 0, err
