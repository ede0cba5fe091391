"""Certificates for TLS tests, made by trustme: a throwaway CA and a broker certificate
for 127.0.0.1 and localhost it signs, as PEM files; and client certificates whose
subject common name is a user (the login of the Lumberjack, Figg and OpenCluster
listeners under auth = "password")."""

from __future__ import annotations

import ssl
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import trustme

if TYPE_CHECKING:
    from fqbroker.settings.broker import Settings


def make_pki(ca: trustme.CA, where: Path) -> dict[str, Path]:
    """PEM files under ``where``: ``ca`` (the CA's certificate), ``cert`` (the broker's
    chain) and ``key``."""
    cert = ca.issue_cert("127.0.0.1", "localhost")
    files = {"ca": where / "ca.pem", "cert": where / "cert.pem", "key": where / "key.pem"}
    ca.cert_pem.write_to_path(str(files["ca"]))
    cert.private_key_pem.write_to_path(str(files["key"]))
    with open(files["cert"], "wb") as fh:
        for blob in cert.cert_chain_pems:
            fh.write(blob.bytes())
    return files


def client_cert(ca: trustme.CA, user: str, where: Path) -> Path:
    """A client certificate ``ca`` signs for ``user`` (its subject CN), with its key, in
    one PEM file under ``where`` (``load_cert_chain`` and ``--certfile`` take it so)."""
    cert = ca.issue_cert(f"{user}.clients.test", common_name=user)
    path = where / f"client-{user}-{id(ca):x}.pem"
    with open(path, "wb") as fh:
        fh.write(cert.private_key_pem.bytes())
        for blob in cert.cert_chain_pems:
            fh.write(blob.bytes())
    return path


@dataclass
class Logins:
    """A broker's TLS files, and client certificates as logins: ``ca`` signs both the
    broker's certificate and the clients' (it is the broker's ``tls_client_ca``);
    ``stranger`` is another CA, whose certificates the broker must refuse."""

    ca: trustme.CA
    stranger: trustme.CA
    files: dict[str, Path]
    where: Path

    @property
    def cert(self) -> Path:
        return self.files["cert"]

    @property
    def key(self) -> Path:
        return self.files["key"]

    @property
    def cafile(self) -> Path:
        return self.files["ca"]

    def client(self, user: str, ca: trustme.CA | None = None) -> Path:
        """A client certificate (and key) for ``user``, signed by our CA or ``ca``."""
        return client_cert(ca or self.ca, user, self.where)

    def context(self, user: str | None, ca: trustme.CA | None = None) -> ssl.SSLContext:
        """A client's context trusting the broker, presenting ``user``'s certificate
        (None: none)."""
        context = ssl.create_default_context(cafile=str(self.cafile))
        if user is not None:
            context.load_cert_chain(self.client(user, ca))
        return context


def password_logins(
    settings: Settings, where: Path, rights: dict[str, list[tuple[str, str]]]
) -> Logins:
    """``settings`` under auth = "password" with client certificates (``tls_client_ca``):
    a user for each key of ``rights``, allowed its ``(kind, pattern)`` pairs."""
    from fqbroker.storage.configdb.users import Users

    users = Users(settings.config_db)
    for user, allowed in rights.items():
        users.add(user, f"{user}pw")
        for kind, pattern in allowed:
            users.allow(user, kind, pattern)
    users.close()
    ca = trustme.CA()
    files = make_pki(ca, where)
    settings.auth = "password"
    settings.tls_client_ca = files["ca"]
    return Logins(ca, trustme.CA(), files, where)
