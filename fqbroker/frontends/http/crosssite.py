"""What keeps other web sites from using a browser to drive the broker's HTTP.

A browser sends a page's requests to any address it names, with whatever credentials it
holds for that address (a Basic login, a broker on loopback that needs none). Three checks
and a set of headers stop that (docs/security.md, "Cross-site requests and the admin API"):

* :func:`host_problem`: the ``Host`` of a plain request must be a name the broker answers
  to (``http_hosts``), so a DNS-rebound name (an attacker's domain pointed at 127.0.0.1)
  reads nothing; over TLS the certificate names the broker.
* :func:`cross_site_problem`: a request that may change state and says it comes from
  another origin (``Origin``, ``Sec-Fetch-Site``) is refused.
* :func:`body_type_problem`: a state-changing endpoint takes ``application/json`` only;
  no HTML form can send that type, and a page's script can send it to another origin only
  after a CORS preflight, which the broker never answers.
* :data:`SECURITY_HEADERS` (in headers.py, which the 503 of a full listener needs too):
  no page of the broker can be framed or have a reply's type guessed, and the web UI runs
  only the broker's own scripts.

Plain functions over a request's lower-cased headers: endpoints.py calls them.
"""

from __future__ import annotations

import ipaddress
import socket
from typing import Final
from urllib.parse import urlsplit

from fqbroker.frontends.http.headers import CSP, SECURITY_HEADERS
from fqbroker.settings.broker import Settings

__all__ = [
    "CHANGING_METHODS",
    "CSP",
    "SECURITY_HEADERS",
    "allowed_host",
    "body_type_problem",
    "cross_site_problem",
    "host_problem",
    "misuse_problem",
]

_DEFAULT_PORTS: Final = {"http": 80, "https": 443}

# Requests that may change state; GET and HEAD never do (fqd took any method).
CHANGING_METHODS: Final = frozenset({b"POST", b"PUT"})


def _split_host(value: str) -> tuple[str, int | None] | None:
    """(name, port) of a Host header's value, the name lower-case without a final dot;
    None when it is not a host[:port]."""
    if not value or any(c in value for c in "@/?#\\ \t"):
        return None
    try:
        parts = urlsplit("//" + value)
        name, port = parts.hostname, parts.port
    except ValueError:
        return None
    if not name:
        return None
    return name.rstrip("."), port


def _is_ip(name: str) -> bool:
    try:
        ipaddress.ip_address(name)
    except ValueError:
        return False
    return True


def allowed_host(settings: Settings, name: str) -> bool:
    """Whether the broker answers to the host name ``name`` (lower-case, no port).

    DNS rebinding needs a name the attacker publishes in DNS, which has a dot. So an IP
    address, a name without a dot (localhost, a host's short name) and the machine's own
    names are always answered to; any other name only when ``http_hosts`` lists it
    (``"*"``: every name).
    """
    hosts = settings.http_hosts
    if "*" in hosts or _is_ip(name) or "." not in name:
        return True
    own = {socket.gethostname().lower().rstrip("."), settings.bind.lower().rstrip(".")}
    return name in own or name in {h.lower().rstrip(".") for h in hosts}


def host_problem(settings: Settings, headers: dict[bytes, bytes]) -> str | None:
    """Why the request's ``Host`` is refused; None when it is fine (or absent, as an
    HTTP/1.0 tool may send no Host: a browser always sends one)."""
    raw = headers.get(b"host")
    if raw is None:
        return None
    value = raw.decode("latin-1").strip()
    split = _split_host(value)
    if split is None:
        return f"the Host header {value!r} is not a host name"
    if not allowed_host(settings, split[0]):
        return (
            f"this broker does not answer to the name {split[0]!r}: "
            "add it to http_hosts if it is the broker's"
        )
    return None


def cross_site_problem(headers: dict[bytes, bytes], *, tls: bool) -> str | None:
    """Why a request that may change state looks sent by another site's page; None: it
    does not (a tool that sends no Origin, or the broker's own web UI).

    The ``Origin`` must be the address the request went to: the scheme (https on a TLS
    connection; behind a proxy that ends TLS either), the ``Host``'s name and its port.
    """
    site = headers.get(b"sec-fetch-site")
    if site is not None and site.strip().lower() not in (b"same-origin", b"none"):
        return f"a {site.decode('latin-1').strip()} request may not change the broker's state"
    raw = headers.get(b"origin")
    if raw is None:
        return None
    origin = raw.decode("latin-1").strip()
    refused = f"requests from {origin!r} may not change the broker's state"
    host = _split_host(headers.get(b"host", b"").decode("latin-1").strip())
    try:
        parts = urlsplit(origin)
        scheme, name, port = parts.scheme, parts.hostname, parts.port
    except ValueError:
        return refused
    if host is None or scheme not in _DEFAULT_PORTS or not name or parts.path:
        return refused  # "null" (a sandboxed frame, a data: URL) and the like too
    if tls and scheme != "https":
        return refused
    host_name, host_port = host
    if name.rstrip(".") != host_name:
        return refused
    # A Host without a port came through a proxy on the scheme's own port.
    if (port or _DEFAULT_PORTS[scheme]) != (host_port or _DEFAULT_PORTS[scheme]):
        return refused
    return None


def body_type_problem(headers: dict[bytes, bytes]) -> str | None:
    """Why a state-changing request's body type is refused; None when it is JSON, or when
    there is no body and no type.

    A type given with an empty body is judged too: a form posting nothing to a URL whose
    query says what to do sends one (text/plain, or a form's type).
    """
    ctype = headers.get(b"content-type")
    if ctype is None:
        length = headers.get(b"content-length", b"0").strip()
        if b"transfer-encoding" in headers or length not in (b"", b"0"):
            return "a request body needs Content-Type: application/json"
        return None
    media = ctype.split(b";", 1)[0].strip().lower()
    if media != b"application/json":
        shown = media.decode("latin-1") or "(empty)"
        return f"Content-Type {shown} is not accepted here: send application/json"
    return None


def misuse_problem(
    path: str, method: bytes, headers: dict[bytes, bytes], post_only: bool, json_only: bool
) -> tuple[int, str] | None:
    """(status, why) for a state-changing endpoint reached the wrong way; None: it is not.

    ``post_only`` endpoints (fqd's checkpoints, /shutdown) answer GET and HEAD with a 405:
    a link or an image could otherwise change state. They and the ``json_only`` ones (the
    admin API) answer a change whose body is not JSON with a 415: what an HTML form sends.
    /submit is neither: fq tools post raw bytes of any type to it, and it needs X-Fq-*
    headers that no form, and no script of another origin without a preflight, can send.
    """
    changing = method in CHANGING_METHODS
    if post_only and not changing:
        return 405, f"{path} changes the broker's state: use POST"
    if not changing or not (post_only or json_only):
        return None
    problem = body_type_problem(headers)
    return None if problem is None else (415, problem)
