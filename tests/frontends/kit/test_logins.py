"""Failed logins per address (fqbroker/frontends/kit/logins.py): the delay a failure earns."""

from __future__ import annotations

from fqbroker.frontends.kit.logins import FIRST_DELAY, MAX_DELAY, FailedLogins


def test_a_flood_of_failures_is_answered_at_the_cap_and_never_raises() -> None:
    # The delay doubled without bound in floating point: past about 1,025 failures from
    # one address 2 ** count overflowed, the login task raised, and the connection was
    # never answered nor closed (a lock-out for everyone once max_connections filled).
    now = [0.0]
    logins = FailedLogins(clock=lambda: now[0])
    delays = [logins.failed("192.0.2.1") for _ in range(1_100)]
    assert delays[0] == FIRST_DELAY
    assert delays[1] == 2 * FIRST_DELAY
    assert max(delays) == delays[-1] == MAX_DELAY
    assert logins.failures("192.0.2.1") > 1_024
    assert logins.failed("192.0.2.2") == FIRST_DELAY  # another address starts afresh
