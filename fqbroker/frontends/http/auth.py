"""Who may use an HTTP endpoint: the admin token, the read token, or a user (Basic).

Two levels (docs/security.md): admin for what acts on the broker, read for the rest
(:class:`Level`). Under ``auth = "password"`` two more questions, whatever the levels say:
message contents (``/queue/*``, ``/topic/*``) need a user with the right on that name
(:func:`content_outcome`), and who is connected and where files are is shown only to a
user or the admin token (:func:`sees_names`). The deciding is plain functions over the
headers (:func:`credentials`, :func:`needs`, :func:`check`, :func:`identify`); the only
wait is the password check. Credentials are checked through the broker's login throttle
(:func:`attempt`), the one fq's port uses, so guessing over HTTP is as slow as over fq and
a failure on either counts on both.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum
from typing import Protocol

from fqbroker.frontends.kit.logins import THROTTLED_TEXT, LoginThrottle
from fqbroker.settings.broker import Settings

__all__ = [
    "ADMIN",
    "READ",
    "THROTTLED_TEXT",
    "Credentials",
    "Identity",
    "Level",
    "Outcome",
    "PermissionsView",
    "UsersView",
    "Who",
    "attempt",
    "challenge",
    "check",
    "content_outcome",
    "credentials",
    "identify",
    "identify_attempt",
    "needs",
    "sees_names",
]

REALM = "fqbroker"


class PermissionsView(Protocol):
    """What HTTP reads of a user's Permissions (fqbroker.core.permissions)."""

    @property
    def admin(self) -> bool: ...
    @property
    def may_attach(self) -> Callable[[bytes], bool]: ...
    @property
    def may_consume(self) -> Callable[[bytes], bool]: ...


class UsersView(Protocol):
    """The user table (fqbroker.storage.configdb.users.Users) as HTTP uses it."""

    async def verify_async(self, name: str, password: bytes) -> PermissionsView | None: ...


class Level(Enum):
    """What a path needs.

    * **admin**: /submit, the checkpoint endpoints and /shutdown. Protected once users exist
      (``auth = "password"``) or ``admin_token`` is set. The admin token, or a user whose
      permissions say ``admin``.
    * **read**: everything else (/stats.json, /frontends.json, /metrics, /queue/*, /topic/*,
      the web UI). Protected only with ``http_auth_reads``. The read token, the admin token,
      or any user whose password checks out. Under ``auth = "password"`` /queue/* and
      /topic/* also need what :func:`content_outcome` says, with or without
      ``http_auth_reads``.
    * **open**: what is not protected under the settings.
    """

    OPEN = "open"
    READ = "read"
    ADMIN = "admin"


READ = Level.READ
ADMIN = Level.ADMIN


class Outcome(Enum):
    """How a request's credentials fare.

    No credentials, or credentials that do not check out, get 401 with ``WWW-Authenticate``
    (:func:`challenge`); a user who is known but not an admin gets 403. Both with JSON
    bodies.
    """

    ALLOWED = "allowed"
    UNAUTHENTICATED = "unauthenticated"  # 401: none given, or they do not check out
    FORBIDDEN = "forbidden"  # 403: a known user without the right
    THROTTLED = "throttled"  # 429: too many failed logins from the source's network


@dataclass(frozen=True, slots=True)
class Credentials:
    """What a request presents; at most one of token and user is set."""

    token: bytes | None = None
    user: str | None = None
    password: bytes = b""
    malformed: bool = False  # an Authorization header we could not read


def needs(settings: Settings, users: UsersView | None, *, admin_path: bool) -> Level:
    """The level a request for an admin or other path needs under these settings."""
    if admin_path and (users is not None or settings.admin_token):
        return Level.ADMIN
    if settings.http_auth_reads:
        return Level.ADMIN if admin_path else Level.READ
    return Level.OPEN


def credentials(headers: dict[bytes, bytes]) -> Credentials:
    """The credentials in a request's (lower-cased) headers.

    Tokens come as ``Authorization: Bearer TOKEN`` (what Prometheus' ``authorization``
    scrape setting sends) or ``X-Fq-Token: TOKEN``; users as ``Authorization: Basic``, which
    is what a browser asks for after a 401 naming the Basic scheme, so the web UI prompts for
    a login.
    """
    token = headers.get(b"x-fq-token")
    if token is not None:
        return Credentials(token=token.strip())
    value = headers.get(b"authorization")
    if value is None:
        return Credentials()
    scheme, _, rest = value.strip().partition(b" ")
    scheme = scheme.lower()
    rest = rest.strip()
    if scheme == b"bearer" and rest:
        return Credentials(token=rest)
    if scheme == b"basic":
        try:
            decoded = base64.b64decode(rest, validate=True)
            name, sep, password = decoded.partition(b":")
            # RFC 7617: the user id holds no colon; names are UTF-8 as fq-admin stores them.
            if sep and name:
                return Credentials(user=name.decode("utf-8"), password=password)
        except (binascii.Error, UnicodeDecodeError):
            pass
    return Credentials(malformed=True)


def _token_matches(given: bytes, *configured: str) -> bool:
    # Every configured token is compared, so the time taken does not say which one exists.
    # hmac here, not by every broker: it loads OpenSSL's digests (bench/RESULTS.md, idle).
    import hmac

    ok = False
    for token in configured:
        if token and hmac.compare_digest(given, token.encode()):
            ok = True
    return ok


async def check(
    level: Level, creds: Credentials, settings: Settings, users: UsersView | None
) -> Outcome:
    """Whether ``creds`` reach ``level``.

    The only wait is a user's password check, whose PBKDF2 runs in a thread unless
    ``Users`` has the user and password cached, so a UI polling with Basic costs a dict
    lookup per request.
    """
    if level is Level.OPEN:
        return Outcome.ALLOWED
    if creds.token is not None:
        tokens = [settings.admin_token]
        if level is Level.READ:
            tokens.append(settings.read_token)
        if _token_matches(creds.token, *tokens):
            return Outcome.ALLOWED
        # A read token on an admin path is a known token without the right.
        if level is Level.ADMIN and _token_matches(creds.token, settings.read_token):
            return Outcome.FORBIDDEN
        return Outcome.UNAUTHENTICATED
    if creds.user is None or users is None:
        return Outcome.UNAUTHENTICATED
    perms = await users.verify_async(creds.user, creds.password)
    if perms is None:
        return Outcome.UNAUTHENTICATED
    if level is Level.ADMIN and not perms.admin:
        return Outcome.FORBIDDEN
    return Outcome.ALLOWED


class Who(Enum):
    """Who a request's credentials say it comes from (:func:`identify`)."""

    ANONYMOUS = "anonymous"  # no credentials at all
    INVALID = "invalid"  # credentials that do not check out, or a header we cannot read
    READ_TOKEN = "read token"
    ADMIN_TOKEN = "admin token"
    USER = "user"  # a user whose password checks out; Identity.perms says what it may do


@dataclass(frozen=True, slots=True)
class Identity:
    who: Who
    perms: PermissionsView | None = None  # set for Who.USER
    user: bytes = b""  # the user's name, for Who.USER


async def identify(creds: Credentials, settings: Settings, users: UsersView | None) -> Identity:
    """Who ``creds`` come from. The password check is the one :func:`check` makes, cached
    by ``Users``, so asking both costs a dict lookup."""
    if creds.token is not None:
        # Both compared every time, so the time taken does not say which one matched.
        is_admin = _token_matches(creds.token, settings.admin_token)
        is_read = _token_matches(creds.token, settings.read_token)
        if is_admin:
            return Identity(Who.ADMIN_TOKEN)
        return Identity(Who.READ_TOKEN if is_read else Who.INVALID)
    if creds.user is not None:
        perms = None if users is None else await users.verify_async(creds.user, creds.password)
        if perms is None:
            return Identity(Who.INVALID)
        return Identity(Who.USER, perms, creds.user.encode())
    return Identity(Who.INVALID if creds.malformed else Who.ANONYMOUS)


async def identify_attempt(
    creds: Credentials,
    settings: Settings,
    users: UsersView | None,
    logins: LoginThrottle,
    source: str,
) -> Identity | None:
    """:func:`identify` through the broker's login throttle, as :func:`attempt` checks;
    None: throttled, the credentials not looked at."""
    if creds.token is None and creds.user is None:
        return await identify(creds, settings, users)  # nothing secret to guess
    held = await logins.check(source)
    if held is None:
        return None
    with held:  # failed if the check raises
        identity = await identify(creds, settings, users)
        if identity.who is Who.INVALID:
            held.failed()
        else:
            held.passed()
    return identity


def content_outcome(
    identity: Identity,
    users: UsersView | None,
    kind: str,
    name: bytes,
    owner: bytes | None = None,
) -> Outcome:
    """Whether ``identity`` may read messages of queue or topic ``name`` (``kind`` is
    "queue" or "topic") over HTTP; ``owner`` is the user a private queue of that name
    belongs to (None: public, unowned, or no such queue).

    Under ``auth = "password"`` HTTP is no wider than the fq socket: a queue's messages need
    the ``queue`` right on it and, when it is another user's private queue, admin (what
    attaching needs: fqbroker.frontends.fq.registry), a topic's the ``consume`` right (what
    binding needs); an admin user or the admin token may read all. The read token is for
    statistics and never reads contents. Under ``auth = "none"`` anyone may, as anyone may
    attach over fq.
    """
    if users is None:
        return Outcome.ALLOWED
    who = identity.who
    if who is Who.ADMIN_TOKEN:
        return Outcome.ALLOWED
    if who is Who.READ_TOKEN:
        return Outcome.FORBIDDEN
    perms = identity.perms
    if who is not Who.USER or perms is None:
        return Outcome.UNAUTHENTICATED
    if perms.admin:
        return Outcome.ALLOWED
    if kind == "queue":
        mine = owner is None or owner == identity.user
        return Outcome.ALLOWED if mine and perms.may_attach(name) else Outcome.FORBIDDEN
    return Outcome.ALLOWED if perms.may_consume(name) else Outcome.FORBIDDEN


def sees_names(identity: Identity, users: UsersView | None) -> bool:
    """Whether the statistics shown to ``identity`` name users, client addresses and files.

    Under ``auth = "password"``, only for a user or the admin token: the read token (a
    scraper needs counts, not names) and anonymous readers get the same documents with
    those left blank. Under ``auth = "none"`` the names are whatever clients claimed, and
    shown to all, as fqd does.
    """
    return users is None or identity.who in (Who.USER, Who.ADMIN_TOKEN)


def challenge(settings: Settings, users: UsersView | None) -> list[tuple[bytes, bytes]]:
    """The WWW-Authenticate headers of a 401: the schemes this broker would accept."""
    out: list[tuple[bytes, bytes]] = []
    if users is not None:
        out.append((b"www-authenticate", f'Basic realm="{REALM}", charset="UTF-8"'.encode()))
    if settings.admin_token or settings.read_token or users is None:
        out.append((b"www-authenticate", f'Bearer realm="{REALM}"'.encode()))
    return out


async def attempt(
    level: Level,
    creds: Credentials,
    settings: Settings,
    users: UsersView | None,
    logins: LoginThrottle,
    source: str,
) -> Outcome:
    """:func:`check` through the broker's login throttle (docs/security.md).

    A token or a user's password is checked only when the throttle lets ``source`` have
    one more check: otherwise the answer is THROTTLED, the right credentials as the wrong
    ones, before they are looked at. A failure spends one of the source's checks.
    """
    if level is Level.OPEN or (creds.token is None and creds.user is None):
        return await check(level, creds, settings, users)  # nothing secret to guess
    held = await logins.check(source)
    if held is None:
        return Outcome.THROTTLED
    with held:  # failed if the check raises
        outcome = await check(level, creds, settings, users)
        if outcome is Outcome.UNAUTHENTICATED:
            held.failed()
        else:
            held.passed()
    return outcome
