"""The broker's one login throttle: how many passwords a network may have checked.

Every listener that checks passwords (fq's command channel, HTTP) asks the same
:class:`LoginThrottle`, made once by the broker, before it looks at a password. A source
is counted in the networks it belongs to (:func:`networks`): its own address and the /24
around it for IPv4, its /64 and the /48 around it for IPv6 (an IPv4-mapped address is
IPv4). Each network has a token bucket (:data:`RULES`): a password check takes a token;
the right password gives it back, a wrong one spends it. While any of its networks has no
token left, an attempt from the source is refused before its password is looked at, the
right password as the wrong one, so neither the answer nor its timing says anything about
the password; a wrong password is answered at once otherwise, as the right one is. A
guesser thus gets its networks' burst, then their rate; a user who mistyped once is not
slowed at all.

Checks under way hold their token: while every token of a network is held, the next
attempt from it waits for one to come back (:meth:`LoginThrottle.check`) rather than
being refused, so a reconnect storm of right passwords from one address goes through,
a few checks at a time, while a guesser's parallel connections get no more checks than
its tokens.

Memory is bounded: a network is remembered only while its bucket is not full, at most
``max_networks`` of them (past that the least recently used is forgotten, as if it had
waited its bucket full).
"""

from __future__ import annotations

import asyncio
import collections
import functools
import ipaddress
import time
from collections.abc import Callable
from dataclasses import dataclass
from types import TracebackType

__all__ = [
    "MAX_NETWORKS",
    "RULES",
    "THROTTLED_TEXT",
    "Check",
    "LoginThrottle",
    "Rule",
    "networks",
]

# The error text of a refused attempt (lowercase, as fq's own error frames).
THROTTLED_TEXT = "too many failed logins: try again later"
MAX_NETWORKS = 8192
# How long an attempt waits for a token held by a check under way before it is refused:
# a check takes milliseconds, so this is reached only if the checks are stuck.
WAIT_SECONDS = 10.0


@dataclass(frozen=True, slots=True)
class Rule:
    """A network size and its bucket: ``burst`` checks at once, then one every
    ``seconds_per_check``."""

    prefix: int
    burst: int
    seconds_per_check: float


# Per minute at most: one address or /64 5 + 60/15 = 9 checks (then 4 a minute); a /24 or
# /48, whatever number of addresses in it, 20 + 60 = 80 (then 60 a minute).
RULES: dict[int, tuple[Rule, ...]] = {
    4: (Rule(32, 5, 15.0), Rule(24, 20, 1.0)),
    6: (Rule(64, 5, 15.0), Rule(48, 20, 1.0)),
}
# A source that is no IP address (a Unix socket's path, "?"): counted as one address.
_OTHER = Rule(0, 5, 15.0)


@functools.lru_cache(maxsize=1024)
def networks(address: str) -> tuple[tuple[str, Rule], ...]:
    """The networks ``address`` is counted in, smallest first, each with its rule (kept
    for the addresses seen last: attempts waiting for a token ask again at each check's
    end)."""
    try:
        ip = ipaddress.ip_address(address.partition("%")[0])  # no IPv6 zone
    except ValueError:
        return ((address, _OTHER),)
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return tuple(
        (str(ipaddress.ip_network((ip, rule.prefix), strict=False)), rule)
        for rule in RULES[ip.version]
    )


class _Bucket:
    """One network's tokens, as of ``when``, and the checks under way holding one each
    (``tokens`` counts those held: a check that fails spends its token, one that passes
    lets go of it)."""

    __slots__ = ("checking", "rule", "tokens", "when")

    def __init__(self, rule: Rule, now: float) -> None:
        self.rule = rule
        self.tokens = float(rule.burst)
        self.when = now
        self.checking = 0

    def refill(self, now: float) -> None:
        rule = self.rule
        if now > self.when:
            gained = (now - self.when) / rule.seconds_per_check
            self.tokens = min(float(rule.burst), self.tokens + gained)
        self.when = now

    def idle(self) -> bool:
        """Full and nothing under way: as good as forgotten."""
        return self.checking == 0 and self.tokens >= self.rule.burst


class Check:
    """A password check under way, holding a token of each of its source's networks.

    Settle it with :meth:`passed` (the token comes back), :meth:`failed` (it is spent) or
    :meth:`cancel` (nothing was checked: it comes back). Used as a context manager, a
    check left unsettled by an exception counts as failed.
    """

    __slots__ = ("_buckets", "_throttle")

    def __init__(self, throttle: LoginThrottle, buckets: list[_Bucket]) -> None:
        self._throttle = throttle
        self._buckets: list[_Bucket] | None = buckets

    @property
    def settled(self) -> bool:
        return self._buckets is None

    def passed(self) -> None:
        """The right password: the tokens it held go back."""
        self._settle(refund=True)

    def cancel(self) -> None:
        """No password was checked after all (the client left): as :meth:`passed`."""
        self._settle(refund=True)

    def failed(self) -> None:
        """A wrong password (or an unknown user): the tokens it held are spent."""
        self._settle(refund=False)

    def _settle(self, *, refund: bool) -> None:
        buckets, self._buckets = self._buckets, None
        if buckets is not None:
            self._throttle._settled(buckets, refund)

    def __enter__(self) -> Check:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.failed()  # a no-op once settled


class LoginThrottle:
    """Token buckets of the networks passwords were checked from (module docstring)."""

    __slots__ = ("_buckets", "_clock", "_waiters", "max_networks")

    def __init__(
        self, clock: Callable[[], float] = time.monotonic, max_networks: int = MAX_NETWORKS
    ) -> None:
        self._clock = clock
        self.max_networks = max_networks
        # Least recently used first; only buckets that are not idle are kept.
        self._buckets: collections.OrderedDict[str, _Bucket] = collections.OrderedDict()
        self._waiters: set[asyncio.Future[None]] = set()

    def __len__(self) -> int:
        """The networks remembered now (bounded by ``max_networks``)."""
        return len(self._buckets)

    def tokens(self, address: str) -> float:
        """The fewest checks any network of ``address`` has left now (without those under
        way): below 1, an attempt from it is not checked."""
        now = self._clock()
        left = float("inf")
        for key, rule in networks(address):
            bucket = self._buckets.get(key)
            if bucket is None:
                left = min(left, float(rule.burst))
            else:
                bucket.refill(now)
                left = min(left, bucket.tokens - bucket.checking)
        return left

    def retry_after(self, address: str) -> float:
        """Seconds until an attempt from ``address`` would be checked (0: now, or as soon
        as a check under way is done)."""
        now = self._clock()
        wait = 0.0
        for key, _rule in networks(address):
            bucket = self._buckets.get(key)
            if bucket is not None:
                bucket.refill(now)
                short = 1.0 - (bucket.tokens - bucket.checking)
                if short > 0 and bucket.checking == 0:
                    wait = max(wait, short * bucket.rule.seconds_per_check)
        return wait

    def try_check(self, address: str) -> Check | None:
        """A :class:`Check` holding a token of each network of ``address``, if every one
        has a token free now; None otherwise (see :meth:`check`)."""
        now = self._clock()
        found = networks(address)
        buckets = [self._buckets.get(key) for key, _rule in found]
        for bucket in buckets:
            if bucket is not None:
                bucket.refill(now)
                if bucket.tokens - bucket.checking < 1.0:
                    return None
        held: list[_Bucket] = []
        for (key, rule), bucket in zip(found, buckets, strict=True):
            if bucket is None:
                bucket = _Bucket(rule, now)
            else:
                del self._buckets[key]  # to the most recently used end
            self._buckets[key] = bucket
            bucket.checking += 1
            held.append(bucket)
        self._forget(now)
        return Check(self, held)

    async def check(self, address: str) -> Check | None:
        """As :meth:`try_check`, waiting while the tokens it lacks are held by checks
        under way; None when a network of ``address`` has spent its tokens: refuse the
        attempt without looking at its password."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + WAIT_SECONDS
        while True:
            check = self.try_check(address)
            if check is not None:
                return check
            if not self._held(address) or loop.time() >= deadline:
                return None
            waiter = loop.create_future()
            self._waiters.add(waiter)
            try:
                async with asyncio.timeout_at(deadline):
                    await waiter
            except TimeoutError:
                return None
            finally:
                self._waiters.discard(waiter)

    def _held(self, address: str) -> bool:
        """Whether every network of ``address`` short of a token has checks under way
        that may give one back."""
        for key, _rule in networks(address):
            bucket = self._buckets.get(key)
            if bucket is None or bucket.tokens - bucket.checking >= 1.0:
                continue  # a token free here
            if bucket.checking == 0 or bucket.tokens < 1.0:
                return False  # spent: no check under way can give one back
        return True

    def _settled(self, buckets: list[_Bucket], refund: bool) -> None:
        now = self._clock()
        for bucket in buckets:
            bucket.refill(now)
            bucket.checking -= 1
            if not refund:
                bucket.tokens -= 1.0
        self._forget(now)
        # Whoever waits for a token looks again.
        for waiter in self._waiters:
            if not waiter.done():
                waiter.set_result(None)

    def _forget(self, now: float) -> None:
        """Drop idle buckets from the least recently used end, then any past the bound."""
        buckets = self._buckets
        while buckets:
            bucket = next(iter(buckets.values()))
            bucket.refill(now)
            if not bucket.idle():
                break
            buckets.popitem(last=False)
        while len(buckets) > self.max_networks:
            buckets.popitem(last=False)
