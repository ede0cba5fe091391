"""The login throttle (fqbroker/frontends/kit/logins.py): checks per network, on a fake clock."""

from __future__ import annotations

import asyncio

import pytest

from fqbroker.frontends.kit.logins import RULES, LoginThrottle, networks

ADDRESS_BURST, ADDRESS_EVERY = RULES[4][0].burst, RULES[4][0].seconds_per_check


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def guess(throttle: LoginThrottle, address: str) -> bool:
    """One wrong password from ``address``: whether it was checked at all."""
    check = throttle.try_check(address)
    if check is None:
        return False
    check.failed()
    return True


def test_the_networks_an_address_is_counted_in() -> None:
    assert [key for key, _ in networks("192.0.2.7")] == ["192.0.2.7/32", "192.0.2.0/24"]
    assert [key for key, _ in networks("2001:db8:1:2:aaaa::1")] == [
        "2001:db8:1:2::/64",
        "2001:db8:1::/48",
    ]
    # An IPv4 client on a dual-stack socket is the IPv4 address it is.
    assert networks("::ffff:192.0.2.7") == networks("192.0.2.7")
    assert [key for key, _ in networks("fe80::1%eth0")] == ["fe80::/64", "fe80::/48"]
    assert [key for key, _ in networks("?")] == ["?"]  # no IP address: counted alone


def test_a_mistyped_password_is_not_slowed_a_guesser_gets_the_burst_then_the_rate() -> None:
    clock = Clock()
    throttle = LoginThrottle(clock)
    assert [guess(throttle, "192.0.2.7") for _ in range(ADDRESS_BURST + 3)] == [True] * 5 + [
        False
    ] * 3
    assert throttle.retry_after("192.0.2.7") == pytest.approx(ADDRESS_EVERY)
    clock.now += ADDRESS_EVERY
    assert throttle.retry_after("192.0.2.7") == 0.0
    assert [guess(throttle, "192.0.2.7") for _ in range(2)] == [True, False]
    assert guess(throttle, "192.0.2.8")  # another address of the /24 has its own
    assert guess(throttle, "198.51.100.1")


def test_the_right_password_gives_its_check_back() -> None:
    # A reconnect storm of right passwords from one address is never throttled.
    throttle = LoginThrottle(Clock())
    for _ in range(1000):
        check = throttle.try_check("192.0.2.7")
        assert check is not None
        check.passed()
    assert throttle.tokens("192.0.2.7") == ADDRESS_BURST
    assert len(throttle) == 0  # full buckets are not remembered


def test_while_throttled_no_attempt_is_checked_so_the_right_password_learns_nothing() -> None:
    # The throttle is asked before the password is looked at: once a network's checks are
    # spent the answer is the same refusal whatever the password, right away, and a right
    # password that got through earlier does not win the address its checks back.
    clock = Clock()
    throttle = LoginThrottle(clock)
    ok = throttle.try_check("192.0.2.7")
    assert ok is not None
    ok.passed()
    while guess(throttle, "192.0.2.7"):
        pass
    assert throttle.try_check("192.0.2.7") is None  # right or wrong: not checked
    assert throttle.try_check("::ffff:192.0.2.7") is None  # nor over a dual-stack socket
    clock.now += ADDRESS_EVERY - 0.01
    assert throttle.try_check("192.0.2.7") is None


def test_a_guesser_gets_fewer_than_10_checks_a_minute_from_one_address() -> None:
    clock = Clock()
    throttle = LoginThrottle(clock)
    checked = 0
    for _ in range(600):  # ten tries a second for a minute
        checked += guess(throttle, "192.0.2.7")
        clock.now += 0.1
    assert checked < 10
    for _ in range(6000):  # and ten minutes more: the rate, not the burst
        checked += guess(throttle, "192.0.2.7")
        clock.now += 0.1
    assert checked <= ADDRESS_BURST + 11 * 60 / ADDRESS_EVERY


def test_a_guesser_gets_fewer_than_100_checks_a_minute_from_a_whole_24() -> None:
    clock = Clock()
    throttle = LoginThrottle(clock)
    checked = 0
    for tick in range(600):  # every address of the /24 in turn, ten a second
        checked += guess(throttle, f"192.0.2.{tick % 256}")
        clock.now += 0.1
    assert checked < 100
    assert guess(throttle, "192.0.3.1")  # the next /24 is not held back


def test_an_ipv6_64_counts_as_one_address_and_a_48_as_a_24() -> None:
    clock = Clock()
    throttle = LoginThrottle(clock)
    checked = sum(guess(throttle, f"2001:db8:1:2::{n:x}") for n in range(1, 1000))
    assert checked == ADDRESS_BURST  # every address of the /64 shares its checks
    checked = 0
    for tick in range(600):
        checked += guess(throttle, f"2001:db8:1:{tick:x}::1")  # a /64 each, one /48
        clock.now += 0.1
    assert checked < 100
    assert guess(throttle, "2001:db8:2::1")


def test_memory_is_bounded_and_idle_networks_are_forgotten() -> None:
    clock = Clock()
    throttle = LoginThrottle(clock, max_networks=50)
    for a in range(100):
        for b in range(10):
            guess(throttle, f"10.{a}.{b}.1")
    assert len(throttle) <= 50
    clock.now += 3600  # every bucket full again
    guess(throttle, "10.200.0.1")
    assert len(throttle) == 2  # that address and its /24


def test_no_overflow_however_many_failures_or_however_long() -> None:
    # The old doubling delay overflowed past about 1,025 failures from one address, and
    # the login that raised was never answered.
    clock = Clock()
    throttle = LoginThrottle(clock)
    for _ in range(100_000):
        guess(throttle, "192.0.2.7")
        clock.now += 0.001
    assert 0 < throttle.retry_after("192.0.2.7") <= ADDRESS_EVERY
    clock.now = 1e300
    assert guess(throttle, "192.0.2.7")
    assert throttle.tokens("192.0.2.7") == ADDRESS_BURST - 1


def test_a_check_that_raises_counts_as_failed() -> None:
    throttle = LoginThrottle(Clock())
    check = throttle.try_check("192.0.2.7")
    assert check is not None
    with pytest.raises(RuntimeError), check:
        raise RuntimeError("the check broke")
    check.passed()  # settled already: no effect
    assert throttle.tokens("192.0.2.7") == ADDRESS_BURST - 1


async def test_checks_under_way_hold_their_tokens_and_the_next_attempt_waits() -> None:
    # A guesser's parallel connections get no more checks than there are tokens; a storm
    # of right passwords waits for the checks ahead of it, then goes through.
    throttle = LoginThrottle(Clock())
    held = [throttle.try_check("192.0.2.7") for _ in range(ADDRESS_BURST)]
    assert all(held) and throttle.try_check("192.0.2.7") is None
    waiting = asyncio.ensure_future(throttle.check("192.0.2.7"))
    await asyncio.sleep(0)
    assert not waiting.done()
    assert held[0] is not None
    held[0].passed()  # the right password: its token is free again
    check = await asyncio.wait_for(waiting, 5)
    assert check is not None
    check.failed()
    waiting = asyncio.ensure_future(throttle.check("192.0.2.7"))
    await asyncio.sleep(0)
    for spent in held[1:]:
        assert spent is not None
        spent.failed()  # every token spent: the waiter is refused, unchecked
    assert await asyncio.wait_for(waiting, 5) is None
    assert await throttle.check("192.0.2.7") is None  # at once: nothing to wait for
