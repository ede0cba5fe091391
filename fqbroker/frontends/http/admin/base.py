"""What the admin API's modules share: a request's parameters, refusals, the route table.

routes.py answers the requests; it and the modules beside it (queues.py,
config.py) file their endpoints in :data:`ROUTES` with :func:`route`, and read their
parameters through :class:`Params`, which refuses a missing or mistyped field with a 400.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from fqbroker.frontends.http.host import HttpHost
from fqbroker.protocols.fq import wire

__all__ = ["PREFIX", "ROUTES", "Params", "Refused", "Route", "changed", "route", "text"]

log = logging.getLogger("fqbroker.frontends.http.admin.routes")

PREFIX = "/admin/"


class Refused(Exception):
    """A request answered with an error status and one line saying why."""

    def __init__(self, status: int, text: str) -> None:
        super().__init__(text)
        self.status = status
        self.text = text


class Params:
    """A request's parameters (query string or JSON body), read with type checks."""

    def __init__(self, values: dict[str, Any], *, from_query: bool) -> None:
        self.values = values
        self.from_query = from_query

    def text(self, key: str, *, default: str | None = None, allow_empty: bool = False) -> str:
        value = self.values.get(key, default)
        if value is None:
            raise Refused(400, f"'{key}' is required")
        if not isinstance(value, str):
            raise Refused(400, f"'{key}' must be a string")
        if not value and not allow_empty:
            raise Refused(400, f"'{key}' must not be empty")
        return value

    def name(self, key: str, *, limit: int = wire.MAX_RK_LEN, allow_empty: bool = False) -> bytes:
        """A name field as the bytes fq carries (UTF-8), at most ``limit`` bytes."""
        raw = self.raw(key, allow_empty=allow_empty)
        if len(raw) > limit:
            raise Refused(400, f"'{key}' is longer than {limit} bytes")
        return raw

    def raw(self, key: str, *, allow_empty: bool = False) -> bytes:
        """A text field's UTF-8 bytes (a JSON string may hold a lone surrogate: refused)."""
        try:
            return self.text(key, allow_empty=allow_empty).encode("utf-8", "surrogateescape")
        except UnicodeEncodeError:
            raise Refused(400, f"'{key}' is not valid Unicode text") from None

    def flag(self, key: str, default: bool) -> bool:
        value = self.values.get(key, default)
        if self.from_query and isinstance(value, str):
            if value.lower() in ("1", "true", "yes"):
                return True
            if value.lower() in ("0", "false", "no", ""):
                return False
        if not isinstance(value, bool):
            raise Refused(400, f"'{key}' must be true or false")
        return value

    def number(self, key: str, default: int | None, *, low: int = 0, high: int = 2**63) -> int:
        value = self.values.get(key, default)
        if value is None:
            raise Refused(400, f"'{key}' is required")
        if self.from_query and isinstance(value, str):
            try:
                value = int(value)
            except ValueError:
                raise Refused(400, f"'{key}' must be a whole number") from None
        if isinstance(value, bool) or not isinstance(value, int):
            raise Refused(400, f"'{key}' must be a whole number")
        if not low <= value <= high:
            raise Refused(400, f"'{key}' must be between {low} and {high}")
        return value

    def choice(self, key: str, default: str, options: tuple[str, ...]) -> str:
        value = self.text(key, default=default)
        if value not in options:
            raise Refused(400, f"'{key}' must be one of {', '.join(options)}")
        return value


Handler = Callable[[HttpHost, Params, str], Awaitable[dict[str, Any]]]


@dataclass(frozen=True, slots=True)
class Route:
    method: str  # GET (HEAD too) or POST
    handler: Handler


ROUTES: dict[str, Route] = {}


def route(method: str, path: str) -> Callable[[Handler], Handler]:
    """File ``handler`` as the answer to ``method`` on ``/admin/`` + ``path``."""

    def register(handler: Handler) -> Handler:
        ROUTES[PREFIX + path] = Route(method, handler)
        return handler

    return register


def text(name: bytes) -> str:
    """A name for JSON: UTF-8 as fq-admin sends it; other bytes kept as escapes."""
    return name.decode("utf-8", "backslashreplace")


def changed(who: str, what: str, *args: object) -> None:
    """Every change is logged with who made it: the audit trail an operator reads."""
    log.info("admin (%s): " + what, who, *args)
