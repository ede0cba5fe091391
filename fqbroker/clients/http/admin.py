"""A client of the admin API (docs/admin.md): what ``fq-admin`` calls, usable from scripts.

Blocking, standard library only (``http.client``), one connection per request: an admin
tool makes a handful of calls, and a fresh connection never trips over one the broker
closed meanwhile. Every answer is the broker's JSON object; a refusal raises
:class:`~fqbroker.errors.AdminError`, an unreachable broker ``OSError``::

    AdminClient("http://127.0.0.1:8765", token="s3cret").create_queue("jobs", type="disk")
"""

from __future__ import annotations

import base64
import http.client
import json
import ssl
from typing import Any
from urllib.parse import urlencode, urlsplit

from fqbroker.clients.tls import client_context
from fqbroker.errors import AdminError

__all__ = ["DEFAULT_URL", "AdminClient", "AdminError"]

DEFAULT_URL = "http://127.0.0.1:8765"
PREFIX = "/admin/"


class AdminClient:
    """The admin API of one broker, reached at ``url`` (http or https)."""

    def __init__(
        self,
        url: str = DEFAULT_URL,
        *,
        token: str | None = None,
        user: str | None = None,
        password: str | None = None,
        timeout: float = 30.0,
        cafile: str | None = None,
        certfile: str | None = None,
        keyfile: str | None = None,
        tls: bool = False,
    ) -> None:
        parts = urlsplit(url if "://" in url else "http://" + url)
        if parts.scheme not in ("http", "https"):
            raise ValueError(f"--url: {url!r} is not an http:// or https:// URL")
        if not parts.hostname:
            raise ValueError(f"--url: {url!r} names no host")
        try:
            port = parts.port
        except ValueError:
            raise ValueError(f"--url: {url!r} has a bad port") from None
        # TLS asked for by the options: https, whatever the URL's scheme said.
        self.scheme = "https" if tls or cafile or certfile else parts.scheme
        self.host = parts.hostname
        self.port = port or (443 if parts.scheme == "https" else 8765)
        self.base = parts.path.rstrip("/")  # a broker behind a proxy's path prefix
        self.timeout = timeout
        self.context: ssl.SSLContext | None = None
        if self.scheme == "https":
            try:
                self.context = client_context(cafile, certfile, keyfile)
            except (OSError, ssl.SSLError) as exc:
                # A CA file or certificate that does not load: the options were wrong.
                raise ValueError(f"TLS: {exc.strerror or exc}") from None
        self.headers = {"Accept": "application/json"}
        self.who: str | None = None  # whose credentials, for the refusals' texts
        if token:
            self.headers["Authorization"] = f"Bearer {token}"
            self.who = "token"
        elif user is not None:
            self.who = user
            pair = f"{user}:{password or ''}".encode()
            self.headers["Authorization"] = "Basic " + base64.b64encode(pair).decode("ascii")

    @property
    def url(self) -> str:
        return f"{self.scheme}://{self.host}:{self.port}{self.base}"

    # --- requests -------------------------------------------------------------------------

    def get(self, endpoint: str, **params: object) -> dict[str, Any]:
        """GET ``/admin/<endpoint>`` with ``params`` (None values left out)."""
        query = urlencode({k: _query_value(v) for k, v in params.items() if v is not None})
        return self._request("GET", endpoint + ("?" + query if query else ""), None)

    def post(self, endpoint: str, body: dict[str, Any]) -> dict[str, Any]:
        """POST a JSON object to ``/admin/<endpoint>``."""
        return self._request("POST", endpoint, json.dumps(body).encode())

    def _request(self, method: str, endpoint: str, body: bytes | None) -> dict[str, Any]:
        conn: http.client.HTTPConnection
        if self.context is not None:
            conn = http.client.HTTPSConnection(
                self.host, self.port, timeout=self.timeout, context=self.context
            )
        else:
            conn = http.client.HTTPConnection(self.host, self.port, timeout=self.timeout)
        headers = dict(self.headers)
        if body is not None:
            headers["Content-Type"] = "application/json"
        try:
            conn.request(method, self.base + PREFIX + endpoint, body, headers)
            response = conn.getresponse()
            data = response.read()
            status = response.status
        except http.client.HTTPException as exc:
            raise ConnectionError(f"{self.url}: {exc or type(exc).__name__}") from None
        except TimeoutError:
            raise TimeoutError(f"{self.url}: no answer in {self.timeout:g} seconds") from None
        except OSError as exc:
            # "[Errno 111] Connection refused" says nothing of where: name the broker.
            raise ConnectionError(f"cannot reach {self.url}: {exc.strerror or exc}") from None
        finally:
            conn.close()
        try:
            answer = json.loads(data)
        except ValueError:
            answer = None
        if not isinstance(answer, dict):
            what = data[:80].decode("utf-8", "replace").strip() or "no body"
            raise AdminError(f"{self.url}: HTTP {status}, not the admin API: {what}", status)
        if status != 200 or answer.get("status") == "error":
            text = _refusal_text(status, answer, self.who)
            raise AdminError(text, status)
        return answer

    # --- the endpoints --------------------------------------------------------------------

    def status(self) -> dict[str, Any]:
        node: dict[str, Any] = self.get("status")["node"]
        return node

    def queues(self) -> list[dict[str, Any]]:
        rows: list[dict[str, Any]] = self.get("queues")["queues"]
        return rows

    def create_queue(
        self,
        name: str,
        *,
        type: str = "mem",  # the API's field name
        policy: str = "drop",
        public: bool = False,
        permanent: bool = False,
        backlog_limit: int | None = None,
        fsync: str | None = None,
    ) -> dict[str, Any]:
        body: dict[str, Any] = {
            "name": name,
            "type": type,
            "policy": policy,
            "public": public,
            "permanent": permanent,
        }
        if backlog_limit is not None:
            body["backlog_limit"] = backlog_limit
        if fsync is not None:
            body["fsync"] = fsync
        return self.post("queues/create", body)

    def delete_queue(self, name: str, *, force: bool = False) -> dict[str, Any]:
        return self.post("queues/delete", {"name": name, "force": force})

    def purge_queue(self, name: str) -> int:
        purged: int = self.post("queues/purge", {"name": name})["purged"]
        return purged

    def peek(self, name: str, count: int = 10) -> list[dict[str, Any]]:
        messages: list[dict[str, Any]] = self.get("queues/peek", name=name, count=count)["messages"]
        return messages

    def bindings(self) -> list[dict[str, Any]]:
        rows: list[dict[str, Any]] = self.get("bindings")["bindings"]
        return rows

    def bind(
        self, exchange: str, program: str, queue: str, *, permanent: bool = False
    ) -> dict[str, Any]:
        body = {"exchange": exchange, "program": program, "queue": queue, "permanent": permanent}
        return self.post("bindings/add", body)

    def unbind(self, exchange: str, program: str, queue: str) -> dict[str, Any]:
        return self.post(
            "bindings/remove", {"exchange": exchange, "program": program, "queue": queue}
        )

    def publish(
        self, exchange: str, route: str, payload: str | bytes, *, sender: str | None = None
    ) -> dict[str, Any]:
        body: dict[str, Any] = {"exchange": exchange, "route": route}
        if isinstance(payload, bytes):
            body["payload_base64"] = base64.b64encode(payload).decode("ascii")
        else:
            body["payload"] = payload
        if sender is not None:
            body["sender"] = sender
        return self.post("publish", body)

    def checkpoints(self, queue: str | None = None) -> list[dict[str, Any]]:
        """Each disk queue's checkpoints (only ``queue``'s when given)."""
        rows: list[dict[str, Any]] = self.get("checkpoints", queue=queue)["queues"]
        return rows

    def add_checkpoint(self, queue: str, name: str, position: str | None = None) -> dict[str, Any]:
        body = {"queue": queue, "name": name}
        if position is not None:
            body["position"] = position
        return self.post("checkpoints/add", body)

    def remove_checkpoint(self, queue: str, name: str) -> dict[str, Any]:
        return self.post("checkpoints/remove", {"queue": queue, "name": name})

    def reset_checkpoint(self, queue: str, name: str) -> dict[str, Any]:
        return self.post("checkpoints/reset", {"queue": queue, "name": name})

    def peers(self) -> list[dict[str, Any]]:
        rows: list[dict[str, Any]] = self.get("peers")["peers"]
        return rows

    def add_peer(
        self,
        host: str,
        exchange: str,
        source: str,
        *,
        port: int = 8765,
        password: str = "",
        program: str = "prefix:",
        permanent: bool = False,
    ) -> dict[str, Any]:
        body = {
            "host": host,
            "port": port,
            "source": source,
            "password": password,
            "exchange": exchange,
            "program": program,
            "permanent": permanent,
        }
        return self.post("peers/add", body)

    def remove_peer(
        self,
        host: str,
        exchange: str,
        *,
        port: int = 8765,
        program: str | None = None,
        source: str | None = None,
    ) -> int:
        body: dict[str, Any] = {"host": host, "port": port, "exchange": exchange}
        if program is not None:
            body["program"] = program
        if source is not None:
            body["source"] = source
        removed: int = self.post("peers/remove", body)["removed"]
        return removed

    def users(self) -> list[dict[str, Any]]:
        rows: list[dict[str, Any]] = self.get("users")["users"]
        return rows

    def add_user(
        self, name: str, password: str, *, iterations: int | None = None
    ) -> dict[str, Any]:
        body: dict[str, Any] = {"name": name, "password": password}
        if iterations is not None:
            body["iterations"] = iterations
        return self.post("users/add", body)

    def remove_user(self, name: str) -> dict[str, Any]:
        return self.post("users/remove", {"name": name})

    def allow(self, name: str, kind: str, pattern: str) -> dict[str, Any]:
        return self.post("users/allow", {"name": name, "kind": kind, "pattern": pattern})

    def deny(self, name: str, kind: str, pattern: str) -> dict[str, Any]:
        return self.post("users/deny", {"name": name, "kind": kind, "pattern": pattern})

    def topics(self) -> dict[str, Any]:
        """``{"configured": bool, "topics": [...]}``."""
        return self.get("topics")


def _query_value(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def _refusal_text(status: int, answer: dict[str, Any], creds: str | None) -> str:
    """The broker's line, and what it means for the credentials given (``creds``: "token",
    a user name, or None)."""
    error = answer.get("error") or answer.get("message") or f"HTTP {status}"
    if status not in (401, 403):
        return str(error)
    if creds is None:
        return f"{error}: the admin token, or an admin user and password, is needed"
    if creds == "token":
        # A wrong token is a 401, or a 403 where only admin_token guards (docs/http.md).
        return f"{error}: the token is not the admin token"
    if status == 401:
        return f"{error}: wrong user name or password"
    return f"{error}: {creds} is not an admin"
