"""A connection's share of the memory budget (fqbroker/core/budget.py, docs/memory.md):
the per-connection and per-user caps, and who waits for whom."""

from __future__ import annotations

import asyncio

from fqbroker.core.budget import MemoryBudget

MiB = 1 << 20


def test_a_share_holds_and_gives_back_through_the_budget() -> None:
    budget = MemoryBudget(8 * MiB, per_connection=4 * MiB, per_user=6 * MiB)
    share = budget.share(b"u")
    assert share.cap == 4 * MiB
    assert share.resize(3 * MiB) is None
    assert share.held == budget.used == budget.held_by(b"u") == 3 * MiB
    assert share.resize(1 * MiB) is None  # shrinking gives back
    assert budget.used == budget.held_by(b"u") == 1 * MiB
    share.close()
    assert budget.used == budget.held_by(b"u") == 0
    assert b"u" not in budget._users  # forgotten with its last share


async def test_over_the_users_cap_a_share_waits_for_its_user_only() -> None:
    """u's second share waits for u's first, outside the budget's line: v is granted at
    once meanwhile, and the second is granted once the first gives back."""
    budget = MemoryBudget(16 * MiB, per_user=4 * MiB)
    first, second = budget.share(b"u"), budget.share(b"u")
    assert first.resize(3 * MiB) is None
    grow = second.resize(3 * MiB)
    assert grow == 3 * MiB and second.held == 0
    waiter = asyncio.ensure_future(second.acquire(grow))
    await asyncio.sleep(0)
    assert not waiter.done() and budget.waiting == 0  # not in the budget's line
    other = budget.share(b"v")
    assert other.resize(3 * MiB) is None  # another user is not held up
    first.release()
    await asyncio.wait_for(waiter, 1)
    assert second.held == budget.held_by(b"u") == 3 * MiB
    for share in (first, second, other):
        share.close()
    assert budget.used == 0


def test_a_share_alone_may_take_more_than_its_users_cap() -> None:
    """One large message is made to wait for its user's others, never refused for the
    user's cap: alone, a share grows to its own cap."""
    budget = MemoryBudget(16 * MiB, per_connection=8 * MiB, per_user=4 * MiB)
    share = budget.share(b"u")
    assert share.resize(6 * MiB) is None
    share.close()


def test_a_share_waiting_for_its_user_holds_nothing_unless_its_bytes_are_in() -> None:
    """An announced reservation lets go of what it held while it waits for the user, so
    two of a user's connections never wait for each other; a gradual one (bytes already
    in memory) grows past the user's cap instead."""
    budget = MemoryBudget(16 * MiB, per_user=4 * MiB)
    a, b = budget.share(b"u"), budget.share(b"u")
    assert a.resize(2 * MiB) is None and b.resize(2 * MiB) is None
    assert a.resize(3 * MiB) == 3 * MiB  # announced: waits, holding nothing
    assert a.held == 0 and budget.held_by(b"u") == 2 * MiB
    assert b.resize(3 * MiB, gradual=True) is None  # its bytes are in memory: it grows
    assert budget.held_by(b"u") == 3 * MiB
    a.close()
    b.close()
    assert budget.used == 0


async def test_a_cancelled_wait_for_the_user_gives_back_its_claim() -> None:
    budget = MemoryBudget(16 * MiB, per_user=4 * MiB)
    first, second = budget.share(b"u"), budget.share(b"u")
    assert first.resize(3 * MiB) is None
    waiter = asyncio.ensure_future(second.acquire(3 * MiB))
    await asyncio.sleep(0)
    waiter.cancel()
    await asyncio.gather(waiter, return_exceptions=True)
    assert budget.held_by(b"u") == 3 * MiB and second.held == 0
    first.close()
    second.close()
    assert budget.used == 0 and not budget._users


async def test_a_user_waiter_granted_by_the_user_then_waits_in_the_budgets_line() -> None:
    budget = MemoryBudget(4 * MiB, per_user=4 * MiB)
    hog = budget.share(b"v")
    assert hog.resize(3 * MiB) is None
    share = budget.share(b"u")
    grow = share.resize(2 * MiB)
    assert grow == 2 * MiB  # the budget has 1 MiB: it waits in the line
    waiter = asyncio.ensure_future(share.acquire(grow))
    await asyncio.sleep(0)
    assert budget.waiting == 1 and budget.held_by(b"u") == 2 * MiB  # claimed of its user
    hog.close()
    await asyncio.wait_for(waiter, 1)
    assert share.held == budget.used == 2 * MiB
    share.close()
    assert budget.used == 0


async def test_a_share_closed_while_it_waits_leaves_nothing_behind() -> None:
    budget = MemoryBudget(4 * MiB)
    hog = budget.share(b"v")
    assert hog.resize(4 * MiB) is None
    share = budget.share(b"u")
    waiter = asyncio.ensure_future(share.acquire(1 * MiB))
    await asyncio.sleep(0)
    share.close()  # the connection is gone; its wait is cancelled after
    waiter.cancel()
    await asyncio.gather(waiter, return_exceptions=True)
    assert b"u" not in budget._users and budget.used == 4 * MiB
    hog.close()
    assert budget.used == 0 and not budget._users
