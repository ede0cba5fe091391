"""fq-recv says why a bind fails: a program that does not compile before it connects
(exit 2), a bind the broker refuses after (exit 1); and the broker logs each refusal
with its reason, a few lines a second at most."""

from __future__ import annotations

import asyncio
import logging

import pytest

from fqbroker.clients.fq.client import Client
from fqbroker.core.bindflags import BIND_ILLEGAL
from fqbroker.settings.broker import Settings
from fqbroker.storage.configdb.users import Users
from tests.conftest import running
from tests.procs import Proc

TIMEOUT = 30.0
RECV = ("-m", "fqbroker.cli.fqtools", "recv")
LIMITS_LOG = "fqbroker.frontends.kit.limits"


async def recv(procs: list[Proc], *args: str) -> tuple[int, str]:
    proc = await Proc.start(*RECV, *args)
    procs.append(proc)
    async with asyncio.timeout(TIMEOUT):
        status, _, err = await proc.finish()
    return status, err


def refusals(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.getMessage().startswith("refused bind")]


@pytest.mark.parametrize(
    ("program", "reason"),
    [
        ("garbage", 'program must start with "prefix:" or "exact:" at offset 0'),
        ('prefix:"a" route_contains(', "at offset 26"),
        ('prefix:"a', "at offset"),
        ("prefix:" + "x" * 200, "over the limit of 127"),
    ],
)
async def test_a_bad_program_is_named_before_connecting(
    procs: list[Proc], closed_port: int, program: str, reason: str
) -> None:
    # Nothing listens on closed_port: the program is refused before any connect.
    status, err = await recv(procs, "--port", str(closed_port), "-b", program)
    assert status == 2, err
    (line,) = err.splitlines()
    assert line.startswith(f"fq-recv: bad program {program!r}: "), line
    assert reason in line


async def test_a_program_the_broker_cannot_compile_is_refused_and_logged(
    settings: Settings, procs: list[Proc], caplog: pytest.LogCaptureFixture
) -> None:
    # An unknown function may be a -m module's on the broker: only the broker can say.
    caplog.set_level(logging.INFO, LIMITS_LOG)
    async with running(settings) as broker:
        program = 'prefix:"a" nosuch()'
        status, err = await recv(procs, "--port", str(broker.port), "-e", "ex", "-b", program)
    assert status == 1, err
    assert f"route set -> {BIND_ILLEGAL}" in err and "Failure to bind..." in err
    assert (
        f"fq-recv: the broker refused to bind {program!r} on 'ex': guest may not consume from"
        " it, a binding limit was reached, or a rule function is unknown there" in err
    )
    (line,) = refusals(caplog)
    assert line.startswith(f"refused bind of {program!r} on exchange 'ex' to user 'guest' (")
    assert line.endswith("): bad program: unknown function nosuch() at offset 11"), line


async def test_a_bind_without_the_right_is_refused_and_logged(
    settings: Settings, procs: list[Proc], caplog: pytest.LogCaptureFixture
) -> None:
    users = Users(settings.config_db)
    users.add("carol", "carolpw")
    users.allow("carol", "queue", "*")
    users.allow("carol", "consume", "logs.*")
    users.close()
    settings.auth = "password"
    caplog.set_level(logging.INFO, LIMITS_LOG)
    async with running(settings) as broker:
        status, err = await recv(
            procs, "--port", str(broker.port), "-u", "carol", "-P", "carolpw", "-e", "logs",
            "-b", "prefix:",
        )  # fmt: skip
    assert status == 1, err
    assert "the broker refused to bind 'prefix:' on 'logs': carol may not consume" in err
    (line,) = refusals(caplog)
    assert line.startswith("refused bind of 'prefix:' on exchange 'logs' to user 'carol' (")
    assert line.endswith("): not permitted to consume from it"), line


async def test_a_bind_over_a_limit_is_refused_and_logged(
    settings: Settings, procs: list[Proc], caplog: pytest.LogCaptureFixture
) -> None:
    settings.max_bindings_per_user = 1
    caplog.set_level(logging.INFO, LIMITS_LOG)
    async with running(settings) as broker:
        first = await Proc.start(*RECV, "--port", str(broker.port), "-u", "dave")
        procs.append(first)
        async with asyncio.timeout(TIMEOUT):
            assert await first.wait_stderr("route set -> ") != f"route set -> {BIND_ILLEGAL}"
        status, err = await recv(procs, "--port", str(broker.port), "-u", "dave", "-b", "exact:x")
    assert status == 1, err
    assert "a binding limit was reached" in err
    (line,) = refusals(caplog)
    assert "to user 'dave'" in line and line.endswith("over a binding limit (docs/limits.md)")


async def test_refused_binds_are_logged_a_few_lines_a_second(
    settings: Settings, caplog: pytest.LogCaptureFixture
) -> None:
    settings.log_lines_per_second = 2
    caplog.set_level(logging.INFO, LIMITS_LOG)
    async with running(settings) as broker, Client("127.0.0.1", broker.port) as client:
        async with asyncio.timeout(TIMEOUT):
            answers = [await client.bind(b"ex", b"prefix: nosuch()") for _ in range(20)]
    assert answers == [BIND_ILLEGAL] * 20
    # 20 refusals in a second or two: far fewer lines than that.
    assert 1 <= len(refusals(caplog)) <= 2 * 3
