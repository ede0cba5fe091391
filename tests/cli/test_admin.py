"""fq-admin over the admin API: each command against a running broker, as a table for
people and as ``--json`` for scripts, and refused without credentials when auth is on.

Most commands run in-process (``main`` in a thread, the broker on the test's loop, real
sockets between them); the last tests run ``python -m fqbroker.cli.admin`` against an
``fqd`` process, as an operator would.
"""

from __future__ import annotations

import asyncio
import io
import json
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from fqbroker.cli.admin import main as fq_admin
from fqbroker.frontends.figg.settings import Figg
from fqbroker.server.broker import Broker
from fqbroker.settings.broker import Settings
from fqbroker.storage.configdb.users import Users
from tests.conftest import TIMEOUT, open_session, running
from tests.procs import Proc


class Admin:
    """fq-admin pointed at one broker, its output captured."""

    def __init__(self, broker: Broker, capsys: pytest.CaptureFixture[str], *creds: str) -> None:
        self.base = ["--url", f"http://127.0.0.1:{broker.port}", "--timeout", str(TIMEOUT), *creds]
        self.capsys = capsys

    async def run(self, *args: str, stdin: str = "") -> tuple[int, str, str]:
        self.capsys.readouterr()
        real_stdin = sys.stdin
        sys.stdin = io.TextIOWrapper(io.BytesIO(stdin.encode()))
        try:
            code = await asyncio.to_thread(_exit_code, [*self.base, *args])
        finally:
            sys.stdin = real_stdin
        out, err = self.capsys.readouterr()
        return code, out, err

    async def table(self, *args: str, stdin: str = "") -> str:
        code, out, err = await self.run(*args, stdin=stdin)
        assert code == 0, err
        assert not out.lstrip().startswith("{"), out
        return out

    async def json(self, *args: str, stdin: str = "") -> dict[str, Any]:
        code, out, err = await self.run("--json", *args, stdin=stdin)
        assert code == 0, err
        answer: dict[str, Any] = json.loads(out)
        assert answer["status"] == "success"
        return answer


def _exit_code(argv: list[str]) -> int:
    try:
        return fq_admin(argv)
    except SystemExit as exc:  # argparse's way out: what the shell would see
        return int(exc.code or 0)


def lines(out: str) -> list[list[str]]:
    return [line.split() for line in out.splitlines() if line.strip()]


@pytest.fixture
async def admin(settings: Settings, capsys: pytest.CaptureFixture[str]) -> AsyncIterator[Admin]:
    async with running(settings) as broker:
        yield Admin(broker, capsys)


async def test_status(admin: Admin) -> None:
    out = await admin.table("status")
    assert out.startswith("fqbroker ") and "node 10.254.254.1" in out
    assert "FRONT END" in out and "fq-command" in out
    node = (await admin.json("status"))["node"]
    assert node["node_id"] == "10.254.254.1" and node["listeners"]


async def test_queue_commands(admin: Admin) -> None:
    assert await admin.table("queues") == "no queues\n"
    out = await admin.table("queue", "create", "jobs", "--public", "--backlog-limit", "100")
    assert out == "created transient mem queue jobs\n"
    made = await admin.json("queue", "create", "disky", "--type", "disk", "--permanent")
    assert made["queue"]["type"] == "disk" and made["queue"]["permanent"] is True
    rows = lines(await admin.table("queues"))
    assert rows[0][:3] == ["NAME", "TYPE", "POLICY"]
    assert ["jobs", "mem", "drop", "public", "transient", "0", "100", "0", "0"] in rows
    queues = {q["name"]: q for q in (await admin.json("queues"))["queues"]}
    assert queues["jobs"]["backlog_limit"] == 100 and queues["disky"]["type"] == "disk"

    await admin.table("binding", "add", "ex", "prefix:", "jobs")
    assert (await admin.table("publish", "ex", "r.1", "first")).startswith("published: routed to 1")
    published = await admin.json("publish", "ex", "r.2", "second")
    assert published["published"] == 1 and published["routed"] == 1

    out = await admin.table("queue", "peek", "jobs")
    assert out.splitlines()[0] == "jobs: 2 waiting"
    assert ["ex", "r.1", "_admin", "5", "first"] in lines(out)
    peeked = await admin.json("queue", "peek", "jobs", "--count", "1")
    assert [m["payload"] for m in peeked["messages"]] == ["first"]

    assert await admin.table("queue", "purge", "jobs") == "purged 2 message(s)\n"
    assert (await admin.json("queue", "purge", "jobs"))["purged"] == 0
    assert await admin.table("queue", "delete", "jobs") == "deleted queue jobs\n"
    assert (await admin.json("queue", "delete", "disky"))["deleted"] == "disky"
    assert (await admin.json("queues"))["queues"] == []


async def test_refusals_are_one_line(admin: Admin, closed_port: int) -> None:
    code, out, err = await admin.run("queue", "purge", "nope")
    assert (code, out, err) == (1, "", "fq-admin: no queue 'nope'\n")
    code, _, err = await admin.run("queue", "create", "q", "--type", "tape")
    assert code == 2 and err.count("\n") == 1 and "invalid choice" in err
    code, _, err = await admin.run("binding", "add", "ex", "nonsense:(", "q")
    assert code == 1 and err == "fq-admin: no queue 'q'\n"
    await admin.table("queue", "create", "q")
    code, _, err = await admin.run("binding", "add", "ex", "nonsense:(", "q")
    assert code == 2 and err.startswith("fq-admin: the program does not compile")
    assert err.count("\n") == 1 and "Traceback" not in err
    code, _, err = await admin.run("--url", f"http://127.0.0.1:{closed_port}", "status")
    assert code == 1 and err.startswith(f"fq-admin: cannot reach http://127.0.0.1:{closed_port}")


async def test_binding_commands_route_to_an_fq_client(settings: Settings, capsys: Any) -> None:
    async with running(settings) as broker:
        admin = Admin(broker, capsys)
        session = await open_session(broker.port, queue_field=b"q1\x00mem:public")
        try:
            out = await admin.table("binding", "add", "logs", 'prefix:"app."', "q1")
            assert out.startswith('bound prefix:"app." on logs to q1, id ')
            assert lines(await admin.table("bindings"))[1][:3] == ["logs", 'prefix:"app."', "q1"]
            (row,) = (await admin.json("bindings"))["bindings"]
            assert row["queue"] == "q1" and row["permanent"] is False
            await admin.table("publish", "logs", "app.web", "hello")
            (msg,) = await session.receive(1)
            assert msg.payload == b"hello"
            removed = await admin.json("binding", "remove", "logs", 'prefix:"app."', "q1")
            assert removed["removed"] == row["id"]
            await admin.json("binding", "add", "logs", "prefix:", "q1")
            out = await admin.table("binding", "remove", "logs", "prefix:", "q1")
            assert out.startswith("removed binding ")
            assert await admin.table("bindings") == "no bindings\n"
        finally:
            await session.close()


async def test_publish_from_a_file_and_binary_payloads(admin: Admin, tmp_path: Path) -> None:
    await admin.table("queue", "create", "q", "--public")
    await admin.table("binding", "add", "ex", "prefix:", "q")
    blob = tmp_path / "blob"
    blob.write_bytes(b"\x00\xffbinary")
    await admin.table("publish", "ex", "r", "--file", str(blob))
    await admin.table("publish", "ex", "r", "--file", "-", stdin="from stdin")
    out = await admin.table("queue", "peek", "q")
    assert "(binary)" in out
    messages = (await admin.json("queue", "peek", "q"))["messages"]
    assert messages[0]["payload_base64"] == "AP9iaW5hcnk=" and "payload" not in messages[0]
    assert messages[1]["payload"] == "from stdin"


async def test_checkpoint_commands(admin: Admin) -> None:
    await admin.table("queue", "create", "dq", "--type", "disk", "--permanent", "--public")
    await admin.table("binding", "add", "ex", "prefix:", "dq")
    for i in range(3):
        await admin.table("publish", "ex", "r", f"m{i}")
    assert await admin.table("checkpoint", "add", "dq", "start") == "Checkpoint added\n"
    await admin.json("checkpoint", "add", "dq", "later", "--position", "0:2")
    rows = lines(await admin.table("checkpoints"))
    assert rows[0] == ["QUEUE", "CHECKPOINT", "POSITION", "BEHIND"]
    assert ["dq", "start", "0:1", "3"] in rows and ["dq", "later", "0:2", "2"] in rows
    (queue,) = (await admin.json("checkpoints", "dq"))["queues"]
    assert {c["name"] for c in queue["checkpoints"]} == {"start", "later"}
    await admin.table("queue", "purge", "dq")
    assert "'dq' reset to checkpoint 'later'" in await admin.table(
        "checkpoint", "reset", "dq", "later"
    )
    assert (await admin.json("queue", "peek", "dq"))["backlog"] == 2
    assert (await admin.json("checkpoint", "reset", "dq", "start"))["backlog"] == 3
    await admin.table("checkpoint", "remove", "dq", "later")
    assert (await admin.json("checkpoint", "remove", "dq", "start"))["message"]
    # Left: the broker's own reader, which the purge and the resets moved.
    assert lines(await admin.table("checkpoints", "dq"))[1:] == [
        ["dq", "fq", "(broker)", "0:1", "3"]
    ]


async def test_peer_commands(admin: Admin) -> None:
    assert await admin.table("peers") == "no upstream rows\n"
    out = await admin.table("peer", "add", "127.0.0.1", "ex", "--source", "me", "--port", "1")
    assert out == "added upstream 127.0.0.1:1 exchange ex\n"
    await admin.json(
        "peer", "add", "127.0.0.1", "ex2", "--source", "me", "--port", "1",
        "--peer-password-stdin", stdin="secret\n",
    )  # fmt: skip
    rows = lines(await admin.table("peers"))
    assert rows[0][:4] == ["HOST", "PORT", "AS", "EXCHANGE"]
    assert rows[1][:5] == ["127.0.0.1", "1", "me", "ex", "prefix:"]
    peers = (await admin.json("peers"))["peers"]
    assert [(p["exchange"], p["password_set"]) for p in peers] == [("ex", False), ("ex2", True)]
    assert "secret" not in json.dumps(peers)
    assert await admin.table("peer", "remove", "127.0.0.1", "ex", "--port", "1") == (
        "removed 1 upstream row(s)\n"
    )
    assert (await admin.json("peer", "remove", "127.0.0.1", "ex2", "--port", "1"))["removed"] == 1
    assert (await admin.json("peers"))["peers"] == []


async def test_user_commands_over_http(admin: Admin) -> None:
    out = await admin.table("user", "add", "alice", "--password-stdin", stdin="pw\n")
    assert out == "added alice\n"
    assert (await admin.json("user", "add", "bob", "--password-stdin", stdin="pw2\n"))["created"]
    assert await admin.table("user", "allow", "alice", "publish", "logs.*") == (
        "alice: allowed publish on logs.*\n"
    )
    await admin.json("user", "deny", "alice", "consume", "*")
    await admin.json("user", "allow", "bob", "admin", "*")
    out = await admin.table("users")
    assert ["alice", "no", "deny:consume:*", "allow:publish:logs.*"] in lines(out)
    assert ["bob", "yes", "allow:admin:*"] in lines(out)
    users = {u["name"]: u for u in (await admin.json("user", "list"))["users"]}
    assert users["bob"]["admin"] is True
    assert (await admin.json("users"))["users"] == list(users.values())
    assert await admin.table("user", "list") == out
    assert await admin.table("user", "deny", "bob", "publish", "secret") == (
        "bob: denied publish on secret\n"
    )
    assert await admin.table("user", "remove", "alice") == "removed user alice\n"
    assert (await admin.json("user", "remove", "bob"))["removed"] == "bob"
    code, _, err = await admin.run("user", "remove", "bob")
    assert code == 1 and err == "fq-admin: no user 'bob'\n"


async def test_topic_command(settings: Settings, capsys: Any) -> None:
    async with running(settings) as broker:
        out = await Admin(broker, capsys).table("topics")
        assert out == "no topics: the Figg listener is not configured\n"
    settings.set_section(Figg(listen="127.0.0.1:0"))
    async with running(settings) as broker:
        admin = Admin(broker, capsys)
        await admin.table("publish", "figg", "t1", "kept")
        rows = lines(await admin.table("topics"))
        assert rows[0][:2] == ["TOPIC", "MESSAGES"] and rows[1][:2] == ["t1", "1"]
        (topic,) = (await admin.json("topics"))["topics"]
        assert topic["name"] == "t1"


# --- with auth on ------------------------------------------------------------------------------

COMMANDS = [
    ["status"],
    ["queues"],
    ["queue", "create", "x"],
    ["queue", "delete", "x"],
    ["queue", "purge", "x"],
    ["queue", "peek", "x"],
    ["bindings"],
    ["binding", "add", "e", "prefix:", "x"],
    ["binding", "remove", "e", "prefix:", "x"],
    ["publish", "e", "r", "p"],
    ["checkpoints"],
    ["checkpoint", "add", "x", "c"],
    ["checkpoint", "remove", "x", "c"],
    ["checkpoint", "reset", "x", "c"],
    ["peers"],
    ["peer", "add", "h", "e", "--source", "s"],
    ["peer", "remove", "h", "e"],
    ["users"],
    ["user", "remove", "x"],
    ["user", "allow", "x", "publish", "*"],
    ["user", "deny", "x", "publish", "*"],
    ["topics"],
]


async def test_every_command_refused_without_admin_credentials(
    settings: Settings, capsys: Any
) -> None:
    users = Users(settings.config_db)
    users.add("root", "rootpw")
    users.allow("root", "admin", "*")
    users.add("bob", "bobpw")
    users.close()
    settings.auth = "password"
    async with running(settings) as broker:
        for creds, status in (
            ((), "authentication required"),
            (("--user", "bob", "--password-stdin"), "forbidden: bob is not an admin"),
        ):
            admin = Admin(broker, capsys, *creds)
            for command in COMMANDS:
                for form in ((), ("--json",)):
                    code, out, err = await admin.run(*form, *command, stdin="bobpw\n")
                    assert code == 1 and out == "", (command, err)
                    assert err.startswith(f"fq-admin: {status}") and err.count("\n") == 1
        assert b"x" not in broker.queues
        root = Admin(broker, capsys, "--user", "root", "--password-stdin")
        assert (await root.json("queue", "create", "x", stdin="rootpw\n"))["queue"]["name"] == "x"


async def test_fq_admin_processes_against_fqd(tmp_path: Path, procs: list[Proc]) -> None:
    """The console script as an operator runs it, on an fqd started with an admin token."""
    conf = tmp_path / "fqd.toml"
    conf.write_text('[fqd]\nadmin_token = "s3cret"\n')
    async with asyncio.timeout(60):
        fqd, port = await Proc.start_fqd(tmp_path, "--config", str(conf))
        procs.append(fqd)
        url = f"http://127.0.0.1:{port}"

        async def fq_admin_proc(*args: str) -> tuple[int, str, str]:
            proc = await Proc.start("-m", "fqbroker.cli.admin", "--url", url, *args)
            procs.append(proc)
            status, out, err = await proc.finish()
            return status, out.decode(), err

        # With only an admin token set, fqd's answer to none given is a 403 (docs/http.md).
        status, out, err = await fq_admin_proc("queues")
        assert status == 1 and out == "" and "Traceback" not in err
        assert (
            err == "fq-admin: forbidden: the admin token, or an admin user and password, is needed"
        )
        status, out, err = await fq_admin_proc("--token", "wrong", "--json", "status")
        assert status == 1 and err == "fq-admin: forbidden: the token is not the admin token"
        status, out, err = await fq_admin_proc("--token", "s3cret", "queue", "create", "jobs")
        assert status == 0, err
        assert out == "created transient mem queue jobs\n"
        status, out, err = await fq_admin_proc("--token", "s3cret", "queues", "--json")
        assert status == 0, err
        assert [q["name"] for q in json.loads(out)["queues"]] == ["jobs"]


async def test_token_from_the_environment(
    admin: Admin, settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    settings.admin_token = "from-env"  # the broker reads its settings on each request
    code, _, err = await admin.run("queues")
    assert code == 1 and "the admin token, or an admin user and password, is needed" in err
    monkeypatch.setenv("FQ_ADMIN_TOKEN", "from-env")
    assert await admin.table("queues") == "no queues\n"
