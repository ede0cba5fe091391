"""fq-send and fq-recv: output formats in-process, then as processes around a real fqd."""

from __future__ import annotations

import asyncio
import json
import signal
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from fqbroker.cli.fqtools import format_json, format_line, main
from fqbroker.cli.stdin import lines
from fqbroker.core.message import Message
from tests.procs import ENV, Proc

NODE_ID = "10.254.254.1"
TIMEOUT = 20.0


# --- formats, in-process ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("route", "payload", "line"),
    [
        (b"a.b", b"hello\n", b"[a.b] hello\n"),
        (b"a.b", b"hello", b"[a.b] hello\n"),
        (b"a.b", b"two\n\n", b"[a.b] two\n\n"),  # only one trailing newline is dropped
        (b"a.b", b"cut\0here\n", b"[a.b] cut\n"),  # printing stops at a NUL
        (b"a.b", b"nl\n\0", b"[a.b] nl\n\n"),  # the newline goes only when it is last
        (b"a\0b", b"", b"[a] \n"),
    ],
)
def test_format_line_is_fq_rcvr_s(route: bytes, payload: bytes, line: bytes) -> None:
    assert format_line(Message(b"ex", route, payload)) == line


def test_format_json() -> None:
    msg = Message(
        b"ex",
        b"r",
        b"caf\xc3\xa9 \xff\n",
        bytes(range(16)),
        b"alice",
        bytes([10, 254, 254, 1, 127, 0, 0, 1]),
    )
    line = format_json(msg)
    assert line.endswith(b"\n") and line.count(b"\n") == 1
    assert json.loads(line) == {
        "route": "r",
        "exchange": "ex",
        "sender": "alice",
        "hops": [NODE_ID, "127.0.0.1"],
        "msgid": "000102030405060708090a0b0c0d0e0f",
        "payload_base64": "Y2Fmw6kg/wo=",  # not UTF-8: base64, exactly
    }
    assert json.loads(format_json(Message(b"ex", b"r", "café\n".encode())))["payload"] == "café\n"


async def test_lines_keep_newlines_across_chunks() -> None:
    async def chunks() -> AsyncIterator[bytes]:
        for chunk in (b"on", b"e\ntw", b"o\n\nthr", b"ee"):
            yield chunk

    assert [line async for line in lines(chunks(), max_line=100, keep_newline=True)] == [
        b"one\n",
        b"two\n",
        b"\n",
        b"three",
    ]


def test_main_needs_a_tool_name(capsys: pytest.CaptureFixture[str]) -> None:
    assert main([]) == 2
    assert "usage" in capsys.readouterr().err


# --- processes ----------------------------------------------------------------------------


@pytest.fixture
async def fqd_port(tmp_path: Path, procs: list[Proc]) -> int:
    async with asyncio.timeout(TIMEOUT):
        fqd = await Proc.start(
            "-m", "fqbroker", "-p", "0", "-n", NODE_ID,
            "-c", str(tmp_path / "fqd.sqlite"), "-q", str(tmp_path / "queues"),
        )  # fmt: skip
        procs.append(fqd)
        line = await fqd.wait_stderr("Listening on port: ")
        return int(line.rsplit(" ", 1)[1])


async def start_recv(procs: list[Proc], port: int, *args: str) -> Proc:
    recv = await Proc.start(
        "-m", "fqbroker.cli.fqtools", "recv", "--host", "127.0.0.1", "--port", str(port), *args
    )
    procs.append(recv)
    await recv.wait_stderr("route set -> ")
    return recv


async def send(procs: list[Proc], port: int, *args: str, stdin: bytes = b"") -> str:
    sender = await Proc.start(
        "-m", "fqbroker.cli.fqtools", "send", "-a", f"127.0.0.1:{port}", *args,
        stdin=asyncio.subprocess.PIPE,
    )  # fmt: skip
    procs.append(sender)
    status, out, err = await sender.finish(stdin)
    assert status == 0, err
    assert out == b""
    return err


async def test_lines_piped_into_fq_send_come_out_of_fq_recv(
    fqd_port: int, procs: list[Proc]
) -> None:
    async with asyncio.timeout(TIMEOUT):
        recv = await start_recv(procs, fqd_port, "--count", "3", "-e", "ex", "-b", "prefix:")
        err = await send(
            procs, fqd_port, "-x", "ex", "-r", "test.route", stdin=b"one\ntwo\nthree\n"
        )
        assert "sent 3 messages in " in err
        status, out, err = await recv.finish()
        assert status == 0, err
        assert out == b"[test.route] one\n[test.route] two\n[test.route] three\n"


async def test_fq_recv_sees_each_line_as_it_arrives(fqd_port: int, procs: list[Proc]) -> None:
    async with asyncio.timeout(TIMEOUT):
        recv = await start_recv(procs, fqd_port, "--count", "2", "-e", "ex", "-b", "prefix:")
        assert recv.proc.stdout is not None
        for word in (b"first", b"second"):
            await send(procs, fqd_port, "-x", "ex", "-r", "r", stdin=word + b"\n")
            assert await recv.proc.stdout.readline() == b"[r] " + word + b"\n"
        assert (await recv.finish())[0] == 0


async def test_json_output(fqd_port: int, procs: list[Proc]) -> None:
    async with asyncio.timeout(TIMEOUT):
        recv = await start_recv(
            procs, fqd_port, "--json", "--count", "2", "-e", "ex", "-b", 'prefix:"a."'
        )
        await send(
            procs, fqd_port, "-u", "alice", "-x", "ex", "-r", "a.b",
            stdin="héllo\nno newline".encode(),
        )  # fmt: skip
        status, out, err = await recv.finish()
        assert status == 0, err
        first, second = (json.loads(line) for line in out.splitlines())
        assert first["payload"] == "héllo\n" and second["payload"] == "no newline"
        assert first["route"] == "a.b" and first["exchange"] == "ex"
        assert first["sender"] == "alice"
        assert first["hops"] == [NODE_ID, "127.0.0.1"]
        assert len(first["msgid"]) == 32 and first["msgid"] != second["msgid"]


async def test_count_and_size_mode(fqd_port: int, procs: list[Proc]) -> None:
    async with asyncio.timeout(TIMEOUT):
        recv = await start_recv(procs, fqd_port, "--json", "--count", "2000")
        err = await send(procs, fqd_port, "--count", "2000", "--size", "10")
        assert "message count -> 2000" in err and "sent 2000 messages in " in err
        status, out, _ = await recv.finish()
        assert status == 0
        lines = [json.loads(line) for line in out.splitlines()]
        assert len(lines) == 2000
        assert {(m["exchange"], m["route"], m["payload"]) for m in lines} == {
            ("maryland", "test.prefix.boo", "\0" * 10)
        }


async def test_fq_send_confirm(fqd_port: int, procs: list[Proc]) -> None:
    async with asyncio.timeout(TIMEOUT):
        recv = await start_recv(procs, fqd_port, "-u", "r/dq/disk", "--count", "2500")
        err = await send(procs, fqd_port, "--count", "2500", "--confirm", "--confirm-every", "1000")
        assert "confirmed 2500 messages" in err
        status, out, _ = await recv.finish()
        assert status == 0 and len(out.splitlines()) == 2500


async def test_rate_mode_prints_the_total(fqd_port: int, procs: list[Proc]) -> None:
    async with asyncio.timeout(TIMEOUT):
        recv = await start_recv(procs, fqd_port, "-s", "--count", "100")
        await send(procs, fqd_port, "--count", "100")
        status, out, _ = await recv.finish()
        assert status == 0
        assert out.decode().splitlines()[-1] == "total: 100"


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
async def test_signals_end_fq_recv_cleanly(
    fqd_port: int, procs: list[Proc], sig: signal.Signals
) -> None:
    async with asyncio.timeout(TIMEOUT):
        recv = await start_recv(procs, fqd_port)
        recv.proc.send_signal(sig)
        status, _, err = await recv.finish()
        assert status == 128 + sig, err  # as a shell reports a command the signal ended
        assert "Traceback" not in err


async def test_refusal_is_reported(fqd_port: int, procs: list[Proc]) -> None:
    async with asyncio.timeout(TIMEOUT):
        recv = await Proc.start(
            "-m", "fqbroker.cli.fqtools", "recv", "--port", str(fqd_port), "-u", "u/q/bogus"
        )
        procs.append(recv)
        status, _, err = await recv.finish()
        assert status == 1
        assert "invalid queue type: bogus" in err


# --- the password, out of the process list -----------------------------------------------


@pytest.fixture
async def password_fqd_port(tmp_path: Path, procs: list[Proc]) -> int:
    from fqbroker.storage.configdb.users import Users

    users = Users(tmp_path / "fqd.sqlite")
    users.add("bob", "bobpw")
    for kind in ("publish", "consume", "queue"):
        users.allow("bob", kind, "*")
    users.close()
    async with asyncio.timeout(TIMEOUT):
        fqd = await Proc.start(
            "-m", "fqbroker", "-p", "0", "-n", NODE_ID, "--auth", "password",
            "-c", str(tmp_path / "fqd.sqlite"), "-q", str(tmp_path / "queues"),
        )  # fmt: skip
        procs.append(fqd)
        line = await fqd.wait_stderr("Listening on port: ")
        return int(line.rsplit(" ", 1)[1])


async def send_as_bob(
    procs: list[Proc], port: int, *args: str, stdin: bytes, password: str | None
) -> tuple[int, str]:
    env = {k: v for k, v in ENV.items() if k != "FQ_PASSWORD"}
    if password is not None:
        env["FQ_PASSWORD"] = password
    sender = await Proc.start(
        "-m", "fqbroker.cli.fqtools", "send", "-a", f"127.0.0.1:{port}", "-u", "bob",
        "-x", "ex", "-r", "r", *args, stdin=asyncio.subprocess.PIPE, env=env,
    )  # fmt: skip
    procs.append(sender)
    status, _, err = await sender.finish(stdin)
    return status, err


async def test_the_password_comes_from_the_environment(
    password_fqd_port: int, procs: list[Proc]
) -> None:
    async with asyncio.timeout(TIMEOUT):
        status, err = await send_as_bob(
            procs, password_fqd_port, stdin=b"hello\n", password="bobpw"
        )
        assert status == 0 and "sent 1 message" in err, err
        status, err = await send_as_bob(
            procs, password_fqd_port, stdin=b"hello\n", password="wrong"
        )
        assert status != 0 and "sent 1 message" not in err, err


async def test_the_password_comes_from_the_first_line_of_stdin(
    password_fqd_port: int, procs: list[Proc]
) -> None:
    async with asyncio.timeout(TIMEOUT):
        recv = await start_recv(
            procs, password_fqd_port, "-u", "bob", "-P", "bobpw", "--count", "2", "-e", "ex",
            "-b", "prefix:",
        )  # fmt: skip
        status, err = await send_as_bob(
            procs, password_fqd_port, "--password-stdin", stdin=b"bobpw\none\ntwo\n",
            password="wrong",
        )  # fmt: skip
        assert status == 0 and "sent 2 messages" in err, err
        status, out, err = await recv.finish()
        assert status == 0, err
        assert out == b"[r] one\n[r] two\n"  # the password line is not a message
