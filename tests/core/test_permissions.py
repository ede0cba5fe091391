"""Permissions (sans-IO): globs over names, deny wins, admin grants everything."""

from __future__ import annotations

import pytest

from fqbroker.core import permissions
from fqbroker.core.permissions import Permissions


def test_all_allows_everything() -> None:
    p = Permissions.ALL
    assert p.admin and p.everything
    assert p.may_publish(b"x") and p.may_consume(b"\xff") and p.may_attach(b"q")


def test_no_rules_denies_everything() -> None:
    p = Permissions.from_rules([])
    assert not p.admin and not p.everything
    assert not p.may_publish(b"logs") and not p.may_consume(b"logs") and not p.may_attach(b"q")


def test_globs_and_exact_names() -> None:
    p = Permissions.from_rules(
        [("publish", "logs.*", True), ("consume", "metrics", True), ("queue", "app-*", True)]
    )
    assert p.may_publish(b"logs.web") and not p.may_publish(b"logs") and not p.may_publish(b"x")
    assert p.may_consume(b"metrics") and not p.may_consume(b"metrics2")
    assert p.may_attach(b"app-1") and not p.may_attach(b"other")
    # Kinds are separate: a publish rule does not let one consume.
    assert not p.may_consume(b"logs.web")
    # Case-sensitive, and any bytes are a valid name.
    assert not p.may_publish(b"LOGS.web")
    assert p.may_publish(b"logs.\xff\x00")


def test_non_ascii_patterns_match_the_utf8_names_clients_send() -> None:
    p = Permissions.from_rules([("publish", "logs.ä*", True), ("queue", "q?", True)])
    assert p.may_publish("logs.äpfel".encode()) and not p.may_publish(b"logs.a")
    # ? is one byte of the name, as fq's names are bytes: "é" is two.
    assert p.may_attach(b"q1") and not p.may_attach("qé".encode())


def test_deny_wins_over_allow() -> None:
    p = Permissions.from_rules(
        [("publish", "*", True), ("publish", "secret*", False), ("publish", "secret", True)]
    )
    assert p.may_publish(b"public")
    assert not p.may_publish(b"secret") and not p.may_publish(b"secrets")


def test_admin_grants_everything_unless_denied() -> None:
    p = Permissions.from_rules([("admin", "*", True), ("publish", "x", False)])
    assert p.admin and p.may_publish(b"x") and p.may_attach(b"any")
    q = Permissions.from_rules([("admin", "*", True), ("admin", "*", False)])
    assert not q.admin and not q.may_publish(b"x")


def test_unknown_kind_refused() -> None:
    with pytest.raises(ValueError, match="unknown permission kind 'write'"):
        Permissions.from_rules([("write", "*", True)])


def test_answers_cached_and_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(permissions, "CACHE_LIMIT", 8)
    p = Permissions.from_rules([("publish", "a*", True)])
    for i in range(100):
        assert p.may_publish(b"a%d" % i)
        assert not p.may_publish(b"b%d" % i)
    closure = p.may_publish.__closure__
    assert closure is not None
    (cache,) = [c.cell_contents for c in closure if isinstance(c.cell_contents, dict)]
    assert 0 < len(cache) <= 8


def test_peer_is_a_right_of_its_own() -> None:
    assert Permissions.ALL.may_peer
    assert Permissions.from_rules([("admin", "*", True)]).may_peer
    assert not Permissions.from_rules([("publish", "*", True)]).may_peer
    assert Permissions.from_rules([("peer", "*", True)]).may_peer
    assert not Permissions.from_rules([("peer", "*", True), ("peer", "*", False)]).may_peer
