"""The user store and fq-admin, on real sqlite files (the login throttle:
tests/frontends/kit/test_logins.py)."""

from __future__ import annotations

import asyncio
import sqlite3
from pathlib import Path

import pytest

from fqbroker.cli.admin import main as fq_admin
from fqbroker.storage.configdb.state import ConfigStore
from fqbroker.storage.configdb.users import Users, check_password, hash_password
from tests.procs import Proc

TIMEOUT = 20.0


@pytest.fixture
def db(tmp_path: Path) -> Path:
    return tmp_path / "fqd.sqlite"


def test_hash_format_and_check() -> None:
    stored = hash_password(b"s3cret", iterations=2000)
    scheme, iterations, salt, digest = stored.split("$")
    assert (scheme, iterations) == ("pbkdf2-sha256", "2000")
    assert len(salt) == 24 and len(digest) == 44  # base64 of 16 and 32 bytes
    assert check_password(stored, b"s3cret")
    assert not check_password(stored, b"s3cret ")
    assert hash_password(b"s3cret") != hash_password(b"s3cret")  # a fresh salt each time
    assert not check_password("md5$nonsense", b"s3cret")  # malformed: matches nothing
    with pytest.raises(ValueError, match="iterations"):
        hash_password(b"x", iterations=10)


def test_users_live_beside_fqds_tables_without_touching_them(db: Path) -> None:
    store = ConfigStore(db)
    store.close()
    users = Users(db)
    # '!' and a space are outside base64, so the stored hash cannot contain this by chance.
    users.add("alice", "open sesame!")
    users.allow("alice", "publish", "logs.*")
    users.deny("alice", "publish", "logs.secret")
    users.close()
    with sqlite3.connect(db) as conn:
        tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")}
        hashed = conn.execute("SELECT hash FROM fqbroker_users").fetchone()[0]
    assert {"queue", "binding", "upstream", "fqbroker_users", "fqbroker_permissions"} <= tables
    assert "open sesame!" not in hashed and hashed.startswith("pbkdf2-sha256$4096$")
    ConfigStore(db).close()  # fqd's schema still opens


def test_verify_and_permissions(db: Path) -> None:
    users = Users(db)
    users.add("alice", "pw")
    users.allow("alice", "publish", "logs.*")
    users.deny("alice", "publish", "logs.secret")
    users.allow("alice", "queue", "alice-*")
    assert users.verify("alice", b"wrong") is None
    assert users.verify("nobody", b"pw") is None
    perms = users.verify("alice", b"pw")
    assert perms is not None and not perms.admin
    assert perms.may_publish(b"logs.web") and not perms.may_publish(b"logs.secret")
    assert not perms.may_consume(b"logs.web")
    assert perms.may_attach(b"alice-q") and not perms.may_attach(b"bob-q")
    assert users.rules("alice") == [
        ("publish", "logs.*", True),
        ("publish", "logs.secret", False),
        ("queue", "alice-*", True),
    ]
    users.add("root", "r00t")
    users.allow("root", "admin", "*")
    root = users.verify("root", b"r00t")
    assert root is not None and root.admin and root.may_consume(b"anything")
    assert users.names() == ["alice", "root"]
    users.close()


def test_a_verified_password_is_cached_and_forgotten_when_it_changes(db: Path) -> None:
    users = Users(db)
    users.add("alice", "pw")
    assert users.cached("alice", b"pw") is None  # never verified: no shortcut
    assert users.verify("alice", b"pw") is not None
    assert users.cached("alice", b"pw") is not None
    assert users.cached("alice", b"other") is None
    users.add("alice", "new")  # a new password: the old one is forgotten at once
    assert users.cached("alice", b"pw") is None
    assert users.verify("alice", b"pw") is None
    assert users.verify("alice", b"new") is not None
    users.close()


def test_changes_from_another_connection_apply_without_a_restart(db: Path) -> None:
    broker_side = Users(db)
    admin_side = Users(db)
    admin_side.add("bob", "pw")
    perms = broker_side.verify("bob", b"pw")
    assert perms is not None and not perms.may_publish(b"ex")
    admin_side.allow("bob", "publish", "ex")
    perms = broker_side.verify("bob", b"pw")  # cached password, fresh rules
    assert perms is not None and perms.may_publish(b"ex")
    assert admin_side.remove("bob")
    assert broker_side.verify("bob", b"pw") is None
    assert broker_side.cached("bob", b"pw") is None
    assert not admin_side.remove("bob")
    broker_side.close()
    admin_side.close()


async def test_verify_async_agrees_with_verify(db: Path) -> None:
    users = Users(db)
    users.add("alice", "pw")
    results = await asyncio.gather(
        users.verify_async("alice", b"pw"),
        users.verify_async("alice", b"no"),
        users.verify_async("ghost", b"pw"),
    )
    assert [r is not None for r in results] == [True, False, False]
    users.close()


def test_bad_rules_are_refused(db: Path) -> None:
    users = Users(db)
    users.add("alice", "pw")
    with pytest.raises(ValueError, match="unknown permission kind"):
        users.allow("alice", "write", "*")
    with pytest.raises(ValueError, match="admin kind"):
        users.allow("alice", "admin", "logs.*")
    with pytest.raises(ValueError, match="no user"):
        users.allow("ghost", "publish", "*")
    with pytest.raises(ValueError, match="user name"):
        users.add("", "pw")
    users.close()


def test_a_hand_written_bad_row_denies_rather_than_breaks(db: Path) -> None:
    users = Users(db)
    users.add("alice", "pw")
    users.close()
    with sqlite3.connect(db) as conn:
        conn.execute("INSERT INTO fqbroker_permissions VALUES ('alice', 'bogus', '*', 1)")
        conn.execute("INSERT INTO fqbroker_users VALUES ('mangled', 'not a hash')")
    users = Users(db)
    perms = users.verify("alice", b"pw")
    assert perms is not None and not perms.may_publish(b"ex")
    assert users.verify("mangled", b"not a hash") is None
    users.close()


# --- fq-admin -------------------------------------------------------------------------------


def test_fq_admin_in_process(
    db: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import io

    monkeypatch.setattr("sys.stdin", io.StringIO("s3cret\n"))
    assert fq_admin(["-c", str(db), "user", "add", "alice", "--password-stdin"]) == 0
    assert fq_admin(["-c", str(db), "user", "allow", "alice", "publish", "logs.*"]) == 0
    assert fq_admin(["-c", str(db), "user", "deny", "alice", "consume", "*"]) == 0
    capsys.readouterr()
    assert fq_admin(["-c", str(db), "user", "list"]) == 0
    assert capsys.readouterr().out == "alice\tdeny:consume:* allow:publish:logs.*\n"
    users = Users(db)
    assert users.verify("alice", b"s3cret") is not None
    users.close()
    assert fq_admin(["-c", str(db), "user", "allow", "ghost", "publish", "*"]) == 2
    assert "no user 'ghost'" in capsys.readouterr().err
    assert fq_admin(["-c", str(db), "user", "remove", "ghost"]) == 1
    assert fq_admin(["-c", str(db), "user", "remove", "alice"]) == 0
    monkeypatch.setattr("sys.stdin", io.StringIO("\n"))
    assert fq_admin(["-c", str(db), "user", "add", "bob", "--password-stdin"]) == 2
    assert "empty password" in capsys.readouterr().err
    missing = db.parent / "missing.sqlite"
    assert fq_admin(["-c", str(missing), "user", "list"]) == 2
    assert not missing.exists()


async def test_fq_admin_as_a_process(db: Path, procs: list[Proc]) -> None:
    async with asyncio.timeout(TIMEOUT):
        add = await Proc.start(
            "-m", "fqbroker.cli.admin", "-c", str(db), "user", "add", "carol",
            "--password-stdin", "--iterations", "5000", stdin=asyncio.subprocess.PIPE,
        )  # fmt: skip
        procs.append(add)
        status, _, err = await add.finish(b"pa ss\n")
        assert status == 0, err
        bad = await Proc.start("-m", "fqbroker.cli.admin", "-c", str(db), "user", "frobnicate")
        procs.append(bad)
        status, _, err = await bad.finish()
        assert status == 2 and "invalid choice" in err and "Traceback" not in err
    users = Users(db)
    assert users.verify("carol", b"pa ss") is not None
    with sqlite3.connect(db) as conn:
        assert (
            conn.execute("SELECT hash FROM fqbroker_users")
            .fetchone()[0]
            .startswith("pbkdf2-sha256$5000$")
        )
    users.close()


# --- checks at once ---------------------------------------------------------------------------


async def test_logins_of_one_user_at_once_share_one_check(db: Path) -> None:
    users = Users(db)
    users.add("svc", "pw")
    logins = [asyncio.ensure_future(users.verify_async("svc", b"pw")) for _ in range(20)]
    wrong = asyncio.ensure_future(users.verify_async("svc", b"guess"))
    await asyncio.sleep(0)  # every login has started and waits on a check
    assert len(users._checking) == 2  # one for the right password, one for the guess
    results = await asyncio.gather(*logins, wrong)
    assert all(r is not None for r in results[:-1]) and results[-1] is None
    assert not users._checking
    users.close()


async def test_a_password_replaced_during_its_check_no_longer_logs_in(db: Path) -> None:
    broker_side = Users(db)
    admin_side = Users(db)
    admin_side.add("alice", "old")
    login = asyncio.ensure_future(broker_side.verify_async("alice", b"old"))
    await asyncio.sleep(0)  # the check has started in a worker thread
    admin_side.add("alice", "new")
    assert await login is None
    assert broker_side.cached("alice", b"old") is None
    assert await broker_side.verify_async("alice", b"new") is not None
    broker_side.close()
    admin_side.close()
