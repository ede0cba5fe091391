"""Users, their password hashes and permissions, in tables of our own in the config DB.

``fqbroker_users(name, hash)`` and ``fqbroker_permissions(user, kind, pattern, allow)`` sit
beside fqd's tables in ``settings.config_db``, created if missing and never read by fqd,
so the file still opens in fqd. docs/security.md says how a password is stored and why at
that cost, how a check stays constant-time and is remembered per user, and how changes
made by ``fq-admin`` from another process reach the next connection without a restart.
"""

from __future__ import annotations

import asyncio
import base64
import logging
import os
import sqlite3
import threading
from dataclasses import dataclass
from pathlib import Path

from fqbroker.core.permissions import KINDS, Permissions
from fqbroker.storage.files import private_file

# hashlib and hmac are imported where a password is hashed or checked, not by every
# broker: they load OpenSSL's digests, memory an idle broker without users would carry
# (bench/RESULTS.md, the idle row).

__all__ = ["DEFAULT_ITERATIONS", "Users", "check_password", "hash_password"]

log = logging.getLogger(__name__)

DEFAULT_ITERATIONS = 4096
MIN_ITERATIONS = 1000
MAX_ITERATIONS = 10_000_000
SALT_BYTES = 16
SCHEME = "pbkdf2-sha256"
# Verified passwords remembered, over all users, before the memory starts over.
VERIFIED_LIMIT = 65536
MAX_NAME_BYTES = 255

SCHEMA = """
CREATE TABLE IF NOT EXISTS fqbroker_users (name TEXT PRIMARY KEY, hash TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS fqbroker_permissions (
    user TEXT NOT NULL, kind TEXT NOT NULL, pattern TEXT NOT NULL, allow INTEGER NOT NULL,
    PRIMARY KEY (user, kind, pattern));
"""


def hash_password(password: bytes, iterations: int = DEFAULT_ITERATIONS) -> str:
    """The stored form of ``password`` with a fresh salt."""
    if not MIN_ITERATIONS <= iterations <= MAX_ITERATIONS:
        raise ValueError(f"iterations must be {MIN_ITERATIONS} to {MAX_ITERATIONS}")
    import hashlib

    salt = os.urandom(SALT_BYTES)
    digest = hashlib.pbkdf2_hmac("sha256", password, salt, iterations)
    return "$".join(
        (
            SCHEME,
            str(iterations),
            base64.b64encode(salt).decode(),
            base64.b64encode(digest).decode(),
        )
    )


def _parse(stored: str) -> tuple[int, bytes, bytes]:
    scheme, iterations, salt, digest = stored.split("$")
    if scheme != SCHEME:
        raise ValueError(f"unknown scheme {scheme!r}")
    count = int(iterations)
    if not MIN_ITERATIONS <= count <= MAX_ITERATIONS:
        raise ValueError("iterations out of range")
    return count, base64.b64decode(salt, validate=True), base64.b64decode(digest, validate=True)


def check_password(stored: str, password: bytes) -> bool:
    """Whether ``password`` matches ``stored``, compared in constant time; a malformed
    ``stored`` hash matches nothing (and costs a dummy PBKDF2 all the same)."""
    try:
        iterations, salt, expected = _parse(stored)
    except ValueError:
        iterations, salt, expected = DEFAULT_ITERATIONS, b"\0" * SALT_BYTES, b""
        log.warning("a user's password hash is malformed: that user cannot log in")
    import hashlib
    import hmac

    actual = hashlib.pbkdf2_hmac("sha256", password, salt, iterations)
    return hmac.compare_digest(actual, expected)


def check_name(name: str) -> str:
    """``name`` if a user may bear it, else ValueError (what fq-admin says)."""
    raw = name.encode("utf-8", "surrogateescape")
    if not raw or len(raw) > MAX_NAME_BYTES or b"\0" in raw:
        raise ValueError(f"a user name is 1 to {MAX_NAME_BYTES} bytes without NUL: {name!r}")
    return name


@dataclass(slots=True)
class _User:
    hash: str
    permissions: Permissions


class Users:
    """The user store of one config database; safe to verify from worker threads."""

    def __init__(self, db_path: Path | str) -> None:
        self.path = Path(db_path)
        if str(db_path) != ":memory:":
            private_file(self.path)
        # The PBKDF2 work runs in threads; the database is read in the caller's thread.
        self._db = sqlite3.connect(self.path, check_same_thread=False, isolation_level=None)
        self._lock = threading.Lock()
        with self._lock:
            self._db.executescript(SCHEMA)
        self._version = -1
        self._users: dict[str, _User] = {}
        # Keyed digests of verified passwords: the key lives only in this process.
        self._key = os.urandom(32)
        self._verified: dict[str, bytes] = {}
        self._checking: dict[tuple[str, bytes], asyncio.Future[bool]] = {}
        self._dummy = hash_password(os.urandom(16))
        self._refresh()

    def close(self) -> None:
        with self._lock:
            self._db.close()

    # --- administration (fq-admin) --------------------------------------------------------

    def add(self, name: str, password: str, iterations: int = DEFAULT_ITERATIONS) -> None:
        """Create ``name``, or give it a new password (its permissions stay)."""
        stored = hash_password(password.encode(), iterations)
        self._write(
            "INSERT OR REPLACE INTO fqbroker_users (name, hash) VALUES (?, ?)",
            (check_name(name), stored),
        )

    def remove(self, name: str) -> bool:
        """Delete ``name`` and its permissions; False when there was no such user."""
        with self._lock:
            self._db.execute("BEGIN")
            cur = self._db.execute("DELETE FROM fqbroker_users WHERE name = ?", (name,))
            self._db.execute("DELETE FROM fqbroker_permissions WHERE user = ?", (name,))
            self._db.execute("COMMIT")
        self._refresh(force=True)
        return cur.rowcount > 0

    def names(self) -> list[str]:
        with self._lock:
            rows = self._db.execute("SELECT name FROM fqbroker_users ORDER BY name").fetchall()
        return [row[0] for row in rows]

    def rules(self, name: str) -> list[tuple[str, str, bool]]:
        """``(kind, pattern, allow)`` of ``name``, in a stable order."""
        with self._lock:
            rows = self._db.execute(
                "SELECT kind, pattern, allow FROM fqbroker_permissions WHERE user = ?"
                " ORDER BY kind, pattern",
                (name,),
            ).fetchall()
        return [(kind, pattern, bool(allow)) for kind, pattern, allow in rows]

    def allow(self, name: str, kind: str, pattern: str) -> None:
        self._rule(name, kind, pattern, True)

    def deny(self, name: str, kind: str, pattern: str) -> None:
        self._rule(name, kind, pattern, False)

    def _rule(self, name: str, kind: str, pattern: str, allow: bool) -> None:
        if kind not in KINDS:
            raise ValueError(f"unknown permission kind {kind!r} (one of {', '.join(KINDS)})")
        if not pattern:
            raise ValueError("a permission pattern cannot be empty")
        if kind == "admin" and pattern != "*":
            raise ValueError("the admin kind takes the pattern '*' only")
        if name not in self.names():
            raise ValueError(f"no user {name!r}: add it first")
        self._write(
            "INSERT OR REPLACE INTO fqbroker_permissions (user, kind, pattern, allow)"
            " VALUES (?, ?, ?, ?)",
            (name, kind, pattern, int(allow)),
        )

    def _write(self, sql: str, args: tuple[object, ...]) -> None:
        with self._lock:
            self._db.execute(sql, args)
        # Our own commits do not move our data_version: reload by hand.
        self._refresh(force=True)

    # --- verification ---------------------------------------------------------------------

    def _refresh(self, force: bool = False) -> None:
        """Reload the tables if another connection (fq-admin) committed since last time."""
        with self._lock:
            version = self._db.execute("PRAGMA data_version").fetchone()[0]
            if version == self._version and not force:
                return
            self._version = version
            hashes = dict(self._db.execute("SELECT name, hash FROM fqbroker_users").fetchall())
            rules: dict[str, list[tuple[str, str, bool]]] = {}
            for user, kind, pattern, allow in self._db.execute(
                "SELECT user, kind, pattern, allow FROM fqbroker_permissions"
            ):
                rules.setdefault(user, []).append((kind, pattern, bool(allow)))
        users: dict[str, _User] = {}
        for name, stored in hashes.items():
            try:
                permissions = Permissions.from_rules(rules.get(name, ()))
            except ValueError as exc:  # a row written by hand: the user gets no rights
                log.warning("user %r: %s; the user has no permissions", name, exc)
                permissions = Permissions.from_rules(())
            old = self._users.get(name)
            if (
                old is not None
                and old.hash == stored
                and old.permissions.rules == permissions.rules
            ):
                users[name] = old  # unchanged: keep its answers cached
            else:
                users[name] = _User(stored, permissions)
        for name in list(self._verified):
            old = self._users.get(name)
            new = users.get(name)
            if old is None or new is None or old.hash != new.hash:
                del self._verified[name]
        self._users = users

    def _digest(self, name: str, password: bytes) -> bytes:
        import hmac

        return hmac.digest(
            self._key, name.encode("utf-8", "surrogateescape") + b"\0" + password, "sha256"
        )

    def _lookup(self, name: str, password: bytes) -> tuple[_User | None, bytes, bool]:
        """(the user, the password's keyed digest, whether it was verified before)."""
        import hmac

        self._refresh()
        user = self._users.get(name)
        digest = self._digest(name, password)
        known = self._verified.get(name)
        cached = user is not None and known is not None and hmac.compare_digest(known, digest)
        return user, digest, cached

    def _settle(self, name: str, user: _User, digest: bytes, ok: bool) -> Permissions | None:
        if not ok:
            return None
        # fq-admin may have changed the user while the hash was computed: a password
        # removed or replaced meanwhile no longer logs in; new rules apply at once.
        self._refresh()
        current = self._users.get(name)
        if current is None or current.hash != user.hash:
            return None
        if len(self._verified) >= VERIFIED_LIMIT:
            self._verified.clear()
        self._verified[name] = digest
        return current.permissions

    def verify(self, name: str, password: bytes) -> Permissions | None:
        """The user's permissions, or None for an unknown user or a wrong password."""
        user, digest, cached = self._lookup(name, password)
        if cached:
            assert user is not None
            return user.permissions
        ok = check_password(self._dummy if user is None else user.hash, password)
        return None if user is None else self._settle(name, user, digest, ok)

    async def verify_async(self, name: str, password: bytes) -> Permissions | None:
        """As :meth:`verify`, with the PBKDF2 work in a worker thread unless cached."""
        user, digest, cached = self._lookup(name, password)
        if cached:
            assert user is not None
            return user.permissions
        if user is None:
            await asyncio.to_thread(check_password, self._dummy, password)
            return None
        # Many clients of one user logging in at once (a restarted broker's reconnect
        # storm) share one PBKDF2 check of the same password instead of one each.
        key = (name, digest)
        check = self._checking.get(key)
        if check is None:
            check = asyncio.ensure_future(asyncio.to_thread(check_password, user.hash, password))
            self._checking[key] = check
            check.add_done_callback(lambda _: self._checking.pop(key, None))
        ok = await asyncio.shield(check)
        return self._settle(name, user, digest, ok)

    def permissions(self, name: str) -> Permissions | None:
        """A user's permissions for a login without a password (a client certificate the
        TLS handshake verified); None for an unknown user."""
        self._refresh()
        user = self._users.get(name)
        return None if user is None else user.permissions

    def cached(self, name: str, password: bytes) -> Permissions | None:
        """The permissions when this password was verified before, else None (no PBKDF2)."""
        user, _digest, cached = self._lookup(name, password)
        return user.permissions if cached and user is not None else None
