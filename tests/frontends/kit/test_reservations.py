"""The shared rules of reservations (fqbroker/frontends/kit/reservations.py): who may
reserve, and the watch that closes a partial message that stopped arriving."""

from __future__ import annotations

import asyncio

from fqbroker.frontends.kit.reservations import StallWatch, may_reserve
from fqbroker.settings.broker import Settings


def test_only_a_connection_with_a_user_reserves_under_password_auth() -> None:
    settings = Settings()
    assert may_reserve(settings, None)  # auth = "none": as always
    settings.auth = "password"
    assert not may_reserve(settings, None)
    assert may_reserve(settings, b"bob")


async def test_a_watch_expires_once_progress_stands_still() -> None:
    progress = [0]
    expired: list[bool] = []
    watch = StallWatch(0.05, lambda: progress[0], lambda: expired.append(True))
    watch.arm()
    for i in range(1, 6):  # bytes keep coming: never expires
        await asyncio.sleep(0.03)
        progress[0] = i
        watch.arm()  # arming again while armed changes nothing
    assert not expired
    async with asyncio.timeout(1):
        while not expired:
            await asyncio.sleep(0.01)
    assert expired == [True]


async def test_a_watch_stops_when_nothing_is_held_or_the_broker_holds_it_back() -> None:
    state: list[int | None] = [0]
    expired: list[bool] = []
    watch = StallWatch(0.02, lambda: state[0], lambda: expired.append(True))
    watch.arm()
    state[0] = None  # nothing partial held any more, or paused by us
    await asyncio.sleep(0.1)
    assert not expired and watch._handle is None
    watch.cancel()


async def test_zero_seconds_never_watches() -> None:
    expired: list[bool] = []
    watch = StallWatch(0, lambda: 1, lambda: expired.append(True))
    watch.arm()
    assert watch._handle is None
    await asyncio.sleep(0.01)
    assert not expired


async def test_a_cancelled_watch_never_expires() -> None:
    expired: list[bool] = []
    watch = StallWatch(0.01, lambda: 1, lambda: expired.append(True))
    watch.arm()
    watch.cancel()
    await asyncio.sleep(0.05)
    assert not expired
