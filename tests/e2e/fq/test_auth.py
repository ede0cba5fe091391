"""auth = "password": fq's plain auth checked against the user store, on a real broker.

Every client here is real (the Python client, raw sockets, fq-send/fq-recv processes,
fqd as a process, the npm ``fq`` client), and so is the sqlite file the users live in.
"""

from __future__ import annotations

import asyncio
import json
import logging
import shutil
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from fqbroker.clients.fq.client import Client
from fqbroker.core.permissions import Permissions
from fqbroker.errors import ClientError
from fqbroker.protocols.fq import wire
from fqbroker.server.broker import Broker
from fqbroker.settings.broker import Settings, Upstream
from fqbroker.storage.configdb.users import Users
from tests.conftest import RawConn, running, wait_for
from tests.procs import Proc

TIMEOUT = 20.0
INTEROP = Path(__file__).resolve().parents[3] / "tests" / "interop"
CMD_MAGIC = wire.Mode.CMD.to_bytes(4, "big")


def _add_users(db: Path) -> None:
    users = Users(db)
    users.add("alice", "wonderland")
    for kind in ("publish", "consume", "queue"):
        users.allow("alice", kind, "*")
    users.close()


@pytest.fixture
def password_settings(settings: Settings) -> Settings:
    _add_users(settings.config_db)
    return settings.updated({"auth": "password"})


@pytest.fixture
async def pw_broker(password_settings: Settings) -> AsyncIterator[Broker]:
    async with running(password_settings) as b:
        yield b


async def test_the_right_password_logs_in_and_messages_flow(pw_broker: Broker) -> None:
    async with asyncio.timeout(TIMEOUT):
        async with Client("127.0.0.1", pw_broker.port, "alice", "wonderland") as c:
            assert await c.bind(b"ex", b"prefix:") != wire.BIND_ILLEGAL
            c.publish(b"ex", b"a.route", b"hello")
            msg = await c.receive()
            assert msg.payload == b"hello" and msg.sender == b"alice"
            (session,) = pw_broker.clients.values()
            assert session.permissions is not None and session.permissions.may_publish(b"ex")


@pytest.mark.parametrize(
    ("user", "password"), [("alice", "wrong"), ("mallory", "wonderland"), ("alice", "")]
)
async def test_a_wrong_password_or_unknown_user_is_refused(
    pw_broker: Broker, user: str, password: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING)
    async with asyncio.timeout(TIMEOUT):
        client = Client("127.0.0.1", pw_broker.port, user, password, reconnect=False)
        with pytest.raises(ClientError) as caught:
            await client.connect()
        assert caught.value.text == "authentication failed"
    assert not pw_broker.clients
    assert pw_broker.logins.tokens("127.0.0.1") < 5  # spent one of its checks
    assert pw_broker.limits.refused["auth"] == 1  # fq_refused_total{reason="auth"}
    logged = [r.getMessage() for r in caplog.records if "authentication failed" in r.getMessage()]
    assert logged and f"user {user!r} from 127.0.0.1" in logged[0]
    assert not password or password not in logged[0]  # never the password


async def test_requests_pipelined_behind_the_auth_wait_for_it(pw_broker: Broker) -> None:
    # The password is checked in a worker thread: a bind and a status sent in the same
    # write as the auth request are answered after it, in order.
    async with asyncio.timeout(TIMEOUT):
        conn = await RawConn.open(pw_broker.port)
        conn.writer.write(
            CMD_MAGIC
            + wire.encode(wire.AuthPlain(b"alice", b"q1", b"wonderland"))
            + wire.encode(wire.BindRequest(0x100, b"ex", b"prefix:"))
            + wire.encode(wire.StatusRequest())
        )
        frames = [await conn.frame() for _ in range(4)]
        assert isinstance(frames[0], wire.AuthResponse)
        assert isinstance(frames[1], wire.Heartbeat)
        assert isinstance(frames[2], wire.BindResponse) and frames[2].route_id != wire.BIND_ILLEGAL
        assert isinstance(frames[3], wire.Status)
        await conn.close()


async def test_a_wrong_password_closes_the_connection_after_the_error(pw_broker: Broker) -> None:
    async with asyncio.timeout(TIMEOUT):
        conn = await RawConn.open(pw_broker.port)
        conn.writer.write(
            CMD_MAGIC
            + wire.encode(wire.AuthPlain(b"alice", b"q1", b"nope"))
            + wire.encode(wire.BindRequest(0x100, b"ex", b"prefix:"))
        )
        # The error frame and nothing else: the bind behind it was never answered.
        assert await conn.closed() == wire.encode(wire.ErrorReply("authentication failed"))


async def test_users_added_while_running_log_in_without_a_restart(pw_broker: Broker) -> None:
    async with asyncio.timeout(TIMEOUT):
        late = Client("127.0.0.1", pw_broker.port, "late", "pw", reconnect=False)
        with pytest.raises(ClientError):
            await late.connect()
        admin = Users(pw_broker.settings.config_db)  # fq-admin's connection, not the broker's
        admin.add("late", "pw")
        admin.allow("late", "queue", "*")  # a user without rules may attach to no queue
        async with Client("127.0.0.1", pw_broker.port, "late", "pw", reconnect=False):
            (session,) = pw_broker.clients.values()
            assert session.permissions is not None and not session.permissions.admin
        admin.remove("late")
        admin.close()
        gone = Client("127.0.0.1", pw_broker.port, "late", "pw", reconnect=False)
        with pytest.raises(ClientError):
            await gone.connect()


async def test_a_reconnect_storm_pays_pbkdf2_once(pw_broker: Broker) -> None:
    assert pw_broker.users is not None
    async with asyncio.timeout(TIMEOUT):
        clients = [Client("127.0.0.1", pw_broker.port, "alice", "wonderland") for _ in range(50)]
        await asyncio.gather(*(c.connect() for c in clients))
        assert pw_broker.users.cached("alice", b"wonderland") is not None
        assert len(pw_broker.clients) == 50
        await asyncio.gather(*(c.close() for c in clients))


async def test_auth_none_ignores_passwords_and_grants_everything(broker: Broker) -> None:
    assert broker.users is None
    async with asyncio.timeout(TIMEOUT):
        async with Client("127.0.0.1", broker.port, "anyone", "whatever", reconnect=False):
            (session,) = broker.clients.values()
            assert session.permissions is Permissions.ALL


# --- listening beyond loopback --------------------------------------------------------------


async def test_an_open_address_needs_a_password_or_an_explicit_setting(
    settings: Settings, caplog: pytest.LogCaptureFixture
) -> None:
    open_settings = settings.updated({"bind": "0.0.0.0"})
    with pytest.raises(ValueError, match="allow_open_network"):
        async with running(open_settings):
            pass
    caplog.set_level(logging.WARNING)
    async with running(open_settings.updated({"allow_open_network": True})) as b:
        assert b.port
    warned = [r.getMessage() for r in caplog.records if "open to anyone" in r.getMessage()]
    assert any(w.startswith("fq-command listening on 0.0.0.0:") for w in warned), warned
    caplog.clear()
    _add_users(settings.config_db)
    async with running(open_settings.updated({"auth": "password"})):
        pass
    assert not [r for r in caplog.records if "open to anyone" in r.getMessage()]


def test_auth_setting_is_checked(settings: Settings) -> None:
    with pytest.raises(ValueError, match="auth must be one of"):
        settings.updated({"auth": "kerberos"})
    assert settings.updated({"auth": "password"}).open_to_anyone() == []
    assert settings.updated({"bind": "::1"}).open_to_anyone() == []
    assert settings.updated({"bind": "0.0.0.0"}).open_to_anyone() == ["0.0.0.0"]


# --- processes: fqd --auth password, fq-send, fq-recv, the npm client -----------------------


@pytest.fixture
async def fqd_pw(tmp_path: Path, procs: list[Proc]) -> int:
    _add_users(tmp_path / "fqd.sqlite")
    async with asyncio.timeout(TIMEOUT):
        fqd, port = await Proc.start_fqd(tmp_path, "--auth", "password")
        procs.append(fqd)
        assert await fqd.wait_stderr("Authenticating ") == "Authenticating 1 users"
        return port


async def test_fq_send_and_fq_recv_with_passwords(fqd_pw: int, procs: list[Proc]) -> None:
    async with asyncio.timeout(TIMEOUT):
        recv = await Proc.start(
            "-m", "fqbroker.cli.fqtools", "recv", "--host", "127.0.0.1", "--port", str(fqd_pw),
            "-u", "alice", "-P", "wonderland", "--count", "2", "-e", "ex", "-b", "prefix:",
        )  # fmt: skip
        procs.append(recv)
        await recv.wait_stderr("route set -> ")
        send = await Proc.start(
            "-m", "fqbroker.cli.fqtools", "send", "-a", f"127.0.0.1:{fqd_pw}",
            "-u", "alice", "-P", "wonderland", "-x", "ex", "-r", "r",
            stdin=asyncio.subprocess.PIPE,
        )  # fmt: skip
        procs.append(send)
        status, _, err = await send.finish(b"one\ntwo\n")
        assert status == 0, err
        status, out, err = await recv.finish()
        assert status == 0, err
        assert out == b"[r] one\n[r] two\n"
        wrong = await Proc.start(
            "-m", "fqbroker.cli.fqtools", "send", "-a", f"127.0.0.1:{fqd_pw}",
            "-u", "alice", "-P", "guess", "-x", "ex", "-r", "r", stdin=asyncio.subprocess.PIPE,
        )  # fmt: skip
        procs.append(wrong)
        status, _, err = await wrong.finish(b"x\n")
        assert status == 1
        assert "refused: authentication failed" in err and "Traceback" not in err


async def test_fqd_refuses_an_open_address_without_auth(tmp_path: Path, procs: list[Proc]) -> None:
    async with asyncio.timeout(TIMEOUT):
        fqd = await Proc.start(
            "-m", "fqbroker", "-p", "0", "--bind", "0.0.0.0", "-n", "10.254.254.1",
            "-c", str(tmp_path / "fqd.sqlite"), "-q", str(tmp_path / "queues"),
        )  # fmt: skip
        procs.append(fqd)
        status, _, err = await fqd.finish()
        assert status == 2
        assert "allow_open_network" in err and "Traceback" not in err


def _node() -> str:
    node = shutil.which("node")
    if node is None or not (INTEROP / "node_modules" / "fq").is_dir():
        pytest.fail("node and the npm fq client are required: run `make node` (make test does)")
    return node


async def _npm(port: int, user: str, password: str) -> dict[str, object]:
    proc = await asyncio.create_subprocess_exec(
        _node(), str(INTEROP / "npm_fq_auth.js"), str(port), user, password, "10",
        cwd=INTEROP, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    try:
        async with asyncio.timeout(60):
            out, err = await proc.communicate()
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    assert proc.returncode == 0, err.decode(errors="replace")
    result: dict[str, object] = json.loads(out)
    return result


async def test_npm_fq_client_with_a_password(pw_broker: Broker) -> None:
    assert await _npm(pw_broker.port, "alice", "wonderland") == {"bind": 1, "received": 10}
    assert await _npm(pw_broker.port, "alice", "nope") == {"error": "authentication failed"}


# --- peering: a link logs in to its upstream with a password ----------------------------------


async def test_a_peer_link_logs_in_with_its_upstream_password(
    password_settings: Settings, tmp_path: Path
) -> None:
    def downstream(password: str, where: str) -> Settings:
        return Settings(
            port=0, node_id="10.254.254.2", config_db=tmp_path / where / "fqd.sqlite",
            queue_dir=tmp_path / where / "queues", peer_poll_seconds=0.1,
            upstream=[Upstream(
                "127.0.0.1", up.port, "alice//mem:drop,private", password, b"peered", b"prefix:",
                False,
            )],
        )  # fmt: skip

    async with asyncio.timeout(TIMEOUT), running(password_settings) as up:
        async with (
            running(downstream("wonderland", "down")) as down,
            Client("127.0.0.1", down.port, "reader", "x") as reader,
            Client("127.0.0.1", up.port, "alice", "wonderland") as writer,
        ):
            await reader.bind(b"peered", b"prefix:")
            # The link binds on the upstream once it is logged in; publish until it has.
            while not reader.received_backlog:
                writer.publish(b"peered", b"r", b"over the link")
                await writer.flush()
                await asyncio.sleep(0.05)
            assert (await reader.receive()).payload == b"over the link"
        assert up.limits.refused["auth"] == 0
        async with running(downstream("wrong", "down2")):
            await wait_for(lambda: up.limits.refused["auth"] >= 1)
