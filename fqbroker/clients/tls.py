"""The TLS options every client of ours takes: ``tls`` and a CA file.

The Python client, fq-send/fq-recv, peering links and the Spark source and sink connect
through :func:`client_ssl`, so they agree on what the options mean: the broker's
certificate and host name are always checked, against the system's CAs or only those of
``cafile``.
"""

from __future__ import annotations

import functools
import ssl
from pathlib import Path

__all__ = ["client_context", "client_ssl", "shared_client_ssl"]


def client_context(
    cafile: str | Path | None = None,
    certfile: str | Path | None = None,
    keyfile: str | Path | None = None,
) -> ssl.SSLContext:
    """A client's context: the system's trusted CAs, or only ``cafile``'s when given;
    the broker's certificate and host name are checked either way. With ``certfile``
    (and ``keyfile``, else the key is in ``certfile``) it presents that client
    certificate: the login of the Lumberjack, Figg and OpenCluster listeners under
    auth = "password"."""
    context = ssl.create_default_context(cafile=str(cafile) if cafile else None)
    if certfile:
        context.load_cert_chain(certfile, keyfile or None)
    return context


def client_ssl(
    tls: bool | ssl.SSLContext,
    cafile: str | Path | None,
    certfile: str | Path | None = None,
    keyfile: str | Path | None = None,
) -> ssl.SSLContext | None:
    """What a client passes to ``open_connection(ssl=...)``: its own context, one from
    ``cafile`` (and a client certificate), or None for a plain connection (``tls``
    False, no ``cafile`` and no ``certfile``)."""
    if isinstance(tls, ssl.SSLContext):
        return tls
    if tls or cafile or certfile:
        return client_context(cafile, certfile, keyfile)
    return None


@functools.lru_cache(maxsize=16)
def shared_client_ssl(tls: bool, cafile: str) -> ssl.SSLContext | None:
    """:func:`client_ssl` made once per option pair: a blocking client making a request
    at a time does not reload its CA file for each."""
    return client_ssl(tls, cafile or None)
