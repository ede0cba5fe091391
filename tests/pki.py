"""Certificates for TLS tests, made by trustme: a throwaway CA and a broker certificate
for 127.0.0.1 and localhost it signs, as PEM files."""

from __future__ import annotations

from pathlib import Path

import trustme


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
