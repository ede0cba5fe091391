"""Client certificates as logins, for front ends whose protocols carry no password.

Under auth = "password" a Lumberjack, Figg or OpenCluster client logs in with a TLS client
certificate that the broker's ``tls_client_ca`` signed: the TLS handshake proves it holds
the key, its subject's common name is its user, and that user's permissions
(:mod:`fqbroker.core.permissions`) say what it may do (docs/security.md, "Every listener
authenticated"). :func:`unauthenticated` is the check at start: under auth = "password" a
front end that cannot tell who its clients are keeps fqd from starting, unless its table
says ``anonymous = true``. :func:`certificate_login` is the check per connection.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any, Protocol

from fqbroker.core.permissions import Permissions
from fqbroker.frontends.kit.component import Datagrams, FrontEnd, OwnPort
from fqbroker.frontends.kit.connections import peer_address
from fqbroker.frontends.kit.tls import peer_user

if TYPE_CHECKING:
    from fqbroker.frontends.kit.component import LiveFrontEnd
    from fqbroker.frontends.kit.limits import Limits as BrokerLimits
    from fqbroker.settings.broker import Settings
    from fqbroker.storage.configdb.users import Users

__all__ = [
    "CertificateHost",
    "Refused",
    "anonymous",
    "certificate_login",
    "plain_under_tls_required",
    "refuse",
    "unauthenticated",
]


class CertificateHost(Protocol):
    """What a certificate login needs of the broker."""

    settings: Settings
    limits: BrokerLimits
    users: Users | None

    def closed(self, transport: asyncio.Transport) -> None: ...


def anonymous(spec: FrontEnd[Any], settings: Settings) -> bool:
    """Whether the operator opened ``spec`` to anyone under auth = "password": its
    table's ``anonymous = true``."""
    if spec.settings is None:
        return False
    return getattr(settings.section(spec.settings), "anonymous", False) is True


def _table(spec: FrontEnd[Any]) -> str:
    return f"[{spec.settings.NAME}]" if spec.settings is not None else spec.name


def _tls(spec: FrontEnd[Any], settings: Settings) -> bool:
    reach = spec.reach
    return isinstance(reach, OwnPort) and reach.tls is not None and reach.tls(settings) is not None


def unauthenticated(spec: FrontEnd[Any], settings: Settings) -> str | None:
    """Why fqd must not start ``spec`` with ``settings``: under auth = "password" it is on
    and cannot tell who its clients are (one line naming it and the fix); else None."""
    if settings.auth != "password" or not spec.claims(settings):
        return None
    if spec.auth.credentials or anonymous(spec, settings):
        return None
    table = _table(spec)
    if spec.auth.certificates:
        if settings.tls_client_ca is not None and _tls(spec, settings):
            return None
        return (
            f'{spec.name}: auth = "password", but its clients cannot log in: set tls_client_ca'
            f" (the CA that signs client certificates) and {table} tls_cert, or {table}"
            " anonymous = true to serve anyone who reaches it"
        )
    return (
        f'{spec.name}: auth = "password", but its protocol carries no credentials: set'
        f" {table} anonymous = true to serve anyone who reaches it, or turn it off"
    )


def plain_under_tls_required(spec: FrontEnd[Any], settings: Settings) -> str | None:
    """Why fqd must not start ``spec``: ``tls_required`` is set and it would open a TCP
    port of its own without TLS (one line naming it and the fix); else None. UDP ports
    (fyrehose) have no TLS to require."""
    if not settings.tls_required or isinstance(spec.reach, Datagrams):
        return None
    if not isinstance(spec.reach, OwnPort) or spec.reach.address(settings) is None:
        return None
    if _tls(spec, settings):
        return None
    return (
        f"{spec.name}: tls_required, but its port has no TLS: set {_table(spec)} tls_cert"
        " (and tls_key), or turn it off"
    )


def certificate_login(
    host: CertificateHost, live: LiveFrontEnd, transport: asyncio.BaseTransport
) -> tuple[str | None, Permissions | None]:
    """Who a new connection is and what it may do: ``(None, Permissions.ALL)`` under
    auth = "none" or for a front end opened with ``anonymous = true``; the user its
    verified client certificate names and that user's permissions; ``(name, None)`` for a
    connection to refuse (no certificate, or a name that is no user), logged and counted
    (:func:`refuse`)."""
    settings = host.settings
    if settings.auth != "password" or host.users is None or anonymous(live.spec, settings):
        return None, Permissions.ALL
    user = peer_user(transport)
    if user is None:
        refuse(host, live, transport, "no client certificate")
        return None, None
    permissions = host.users.permissions(user)
    if permissions is None:
        refuse(host, live, transport, f"the certificate's user {user!r} does not exist")
    return user, permissions


def refuse(
    host: CertificateHost, live: LiveFrontEnd, transport: asyncio.BaseTransport, why: str
) -> None:
    """Say in one rate-limited line why a connection is refused, counted as a failed
    login (``fq_refused_total{reason="auth"}``)."""
    addr, port = peer_address(transport)
    title = live.spec.title or live.name
    host.limits.refuse("auth", "refusing %s connection from %s:%d: %s", title, addr, port, why)


class Refused(asyncio.Protocol):
    """A connection refused at login: ``answer`` (the protocol's error, if it has one) is
    written, then the connection closes; whatever the client sends meanwhile is dropped."""

    __slots__ = ("host", "transport")

    def __init__(
        self, host: CertificateHost, transport: asyncio.Transport, answer: bytes = b""
    ) -> None:
        self.host = host
        self.transport = transport
        if answer:
            transport.write(answer)
        transport.close()

    def last_input(self) -> float | None:
        return None  # closing already: no idle limit to apply

    def data_received(self, data: bytes) -> None:
        pass

    def eof_received(self) -> bool:
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        self.host.closed(self.transport)
