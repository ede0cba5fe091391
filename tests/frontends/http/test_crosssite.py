"""The cross-site checks alone (fqbroker.frontends.http.crosssite): which Host names, Origins,
Sec-Fetch-Site values and body types a request may carry. Over HTTP:
tests/e2e/http/test_cross_site.py."""

from __future__ import annotations

import socket

import pytest

from fqbroker.frontends.http import crosssite
from fqbroker.settings.broker import Settings


def heads(**values: str) -> dict[bytes, bytes]:
    return {k.replace("_", "-").encode(): v.encode() for k, v in values.items()}


@pytest.mark.parametrize(
    "host",
    [
        "127.0.0.1:8765",
        "[::1]:8765",
        "10.1.2.3",
        "localhost:8765",
        "LOCALHOST",
        "localhost.",
        "broker",
        socket.gethostname(),
    ],
)
def test_hosts_answered_by_default(host: str) -> None:
    assert crosssite.host_problem(Settings(), heads(host=host)) is None


@pytest.mark.parametrize(
    "host",
    ["evil.example", "evil.example:8765", "127.0.0.1.nip.io", "7f000001.rbndr.us", "a.b."],
)
def test_dotted_names_need_http_hosts(host: str) -> None:
    problem = crosssite.host_problem(Settings(), heads(host=host))
    assert problem is not None and "http_hosts" in problem
    listed = Settings(http_hosts=[host.split(":")[0].upper()])
    assert crosssite.host_problem(listed, heads(host=host)) is None
    assert crosssite.host_problem(Settings(http_hosts=["*"]), heads(host=host)) is None


def test_the_bind_name_is_answered() -> None:
    settings = Settings(bind="broker.example.com")
    assert crosssite.host_problem(settings, heads(host="broker.example.com:8765")) is None


@pytest.mark.parametrize("host", ["", "a@b", "a b", "x:notaport", "x/y", "[::1"])
def test_malformed_hosts(host: str) -> None:
    problem = crosssite.host_problem(Settings(), heads(host=host))
    assert problem is not None and "not a host name" in problem


def test_no_host_header_is_let_through() -> None:
    assert crosssite.host_problem(Settings(), {}) is None  # HTTP/1.0 tools


SAME = [
    ("127.0.0.1:8765", "http://127.0.0.1:8765", False),
    ("localhost:8765", "http://LocalHost:8765", False),
    ("[::1]:8765", "http://[::1]:8765", False),
    ("b.example", "https://b.example", False),  # a proxy ending TLS on 443
    ("b.example", "http://b.example:80", False),
    ("127.0.0.1:8765", "https://127.0.0.1:8765", True),
]


@pytest.mark.parametrize(("host", "origin", "tls"), SAME)
def test_own_origin(host: str, origin: str, tls: bool) -> None:
    assert crosssite.cross_site_problem(heads(host=host, origin=origin), tls=tls) is None


@pytest.mark.parametrize(
    ("host", "origin", "tls"),
    [
        ("127.0.0.1:8765", "http://127.0.0.1:8766", False),
        ("127.0.0.1:8765", "http://127.0.0.1", False),
        ("127.0.0.1:8765", "http://localhost:8765", False),
        ("127.0.0.1:8765", "http://127.0.0.1:8765", True),  # TLS: an https origin only
        ("127.0.0.1:8765", "null", False),
        ("127.0.0.1:8765", "", False),
        ("127.0.0.1:8765", "ftp://127.0.0.1:8765", False),
        ("127.0.0.1:8765", "http://127.0.0.1:8765/path", False),
        ("127.0.0.1:8765", "http://127.0.0.1:port", False),
        ("b.example", "http://b.example:8080", False),
        ("b.example", "https://c.example", False),
    ],
)
def test_foreign_origin(host: str, origin: str, tls: bool) -> None:
    problem = crosssite.cross_site_problem(heads(host=host, origin=origin), tls=tls)
    assert problem is not None and "may not change" in problem


def test_origin_without_host_is_foreign() -> None:
    assert crosssite.cross_site_problem(heads(origin="http://x:1"), tls=False) is not None


@pytest.mark.parametrize(("site", "refused"), [
    ("cross-site", True), ("same-site", True), ("Cross-Site", True), ("bogus", True),
    ("same-origin", False), ("none", False),
])  # fmt: skip
def test_sec_fetch_site(site: str, refused: bool) -> None:
    problem = crosssite.cross_site_problem(heads(sec_fetch_site=site), tls=False)
    assert (problem is not None) is refused


def test_tools_sending_no_origin_pass() -> None:
    assert crosssite.cross_site_problem(heads(host="127.0.0.1:8765"), tls=False) is None


@pytest.mark.parametrize(
    ("headers", "refused"),
    [
        ({}, False),
        ({"content_length": "0"}, False),
        ({"content_type": "application/json"}, False),
        ({"content_type": "Application/JSON; charset=utf-8", "content_length": "2"}, False),
        ({"content_length": "2"}, True),
        ({"transfer_encoding": "chunked"}, True),
        ({"content_type": "text/plain", "content_length": "0"}, True),
        ({"content_type": "text/plain"}, True),
        ({"content_type": "application/x-www-form-urlencoded"}, True),
        ({"content_type": "multipart/form-data; boundary=x"}, True),
        ({"content_type": "application/json-seq"}, True),
        ({"content_type": ""}, True),
    ],
)
def test_body_types(headers: dict[str, str], refused: bool) -> None:
    assert (crosssite.body_type_problem(heads(**headers)) is not None) is refused


def test_every_reply_header_is_set_once() -> None:
    names = [name for name, _ in crosssite.SECURITY_HEADERS]
    assert len(names) == len(set(names))
    assert dict(crosssite.SECURITY_HEADERS)[b"x-frame-options"] == b"DENY"
    assert b"frame-ancestors 'none'" in dict(crosssite.SECURITY_HEADERS)[b"content-security-policy"]


@pytest.mark.parametrize(
    ("method", "headers", "post_only", "json_only", "status"),
    [
        (b"GET", {}, True, False, 405),  # a checkpoint by <img src>
        (b"HEAD", {}, True, False, 405),
        (b"POST", {}, True, False, None),  # curl -X POST
        (b"POST", {"content_type": "text/plain"}, True, False, 415),  # an empty form
        (b"POST", {"content_type": "text/plain", "content_length": "9"}, False, True, 415),
        (b"PUT", {"content_type": "application/json", "content_length": "2"}, False, True, None),
        (b"GET", {}, False, True, None),  # an admin API read
        (b"POST", {"content_type": "text/plain", "content_length": "9"}, False, False, None),
    ],
)
def test_misuse(
    method: bytes, headers: dict[str, str], post_only: bool, json_only: bool, status: int | None
) -> None:
    found = crosssite.misuse_problem("/p", method, heads(**headers), post_only, json_only)
    assert (found and found[0]) == status
