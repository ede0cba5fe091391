"""The fyrehose client: its sans-IO core driven by hand (datagrams and clocks in, datagrams
and events out), then the asyncio shell against a real broker on loopback."""

from __future__ import annotations

import asyncio
import json
import socket

import pytest

from fqbroker.clients.fyrehose.client import FyrehoseClient
from fqbroker.clients.fyrehose.machine import Confirmed, Delivered, FyrehoseMachine, Lost
from fqbroker.errors import FyrehoseClosed
from fqbroker.protocols.fyrehose import wire
from fqbroker.settings.broker import Settings
from tests.conftest import TIMEOUT, wait_for
from tests.e2e.fyrehose.test_loss import backbone, fyrehose_address
from tests.procs import Proc

BROKER = ("127.0.0.1", 2323)
TOKEN = bytes(range(16))
PEER = ("127.0.0.1", 5555)


def machine(now: float = 0.0, **kw: object) -> FyrehoseMachine:
    return FyrehoseMachine(BROKER, now=now, token=TOKEN, **kw)  # type: ignore[arg-type]


def deliver(m: FyrehoseMachine, seq: int, data: bytes | None = None, now: float = 0.0) -> None:
    m.receive(wire.encode(wire.Deliver(seq, data or b"m%d" % seq)), BROKER, now)


def events(m: FyrehoseMachine) -> list[object]:
    out: list[object] = []
    while (e := m.next_event()) is not None:
        out.append(e)
    return out


def sent(m: FyrehoseMachine) -> list[tuple[wire.Datagram, tuple[str, int]]]:
    return [(wire.decode(d), to) for d, to in m.datagrams_to_send()]


def requests(m: FyrehoseMachine) -> list[tuple[int, int]]:
    return [
        (d.from_seq, d.to_seq) for d, to in sent(m) if isinstance(d, wire.Request) and to == BROKER
    ]


def seqs(evs: list[object]) -> list[int]:
    return [e.seq for e in evs if isinstance(e, Delivered)]


# --- keepalives ---------------------------------------------------------------------------


def test_keepalive_is_the_final_form_every_second() -> None:
    m = machine()
    m.tick(0.0)
    (out,) = m.datagrams_to_send()
    # The final 29-byte form: 0.0.0.0:0 (the broker answers the source), NOJOURNAL, token.
    assert out == (bytes.fromhex("10 00000000 0000 000000000002") + TOKEN, BROKER)
    assert m.next_tick() == 1.0
    m.tick(0.5)
    assert m.datagrams_to_send() == []
    m.tick(1.0)
    assert [d for d, _ in sent(m)] == [wire.Keepalive("0.0.0.0", 0, wire.Flags.NOJOURNAL, TOKEN)]
    assert m.stats.keepalives == 2


def test_keepalive_flags_follow_the_settings() -> None:
    journaling = machine(journal_messages=10, advertise=("127.0.0.1", 2323))
    assert journaling.keepalive() == bytes.fromhex("10 7f000001 0913 000000000000") + TOKEN
    publisher = machine(subscribe=False)
    flags = wire.Flags.NOSUBSCRIBE | wire.Flags.NOJOURNAL
    assert wire.decode(publisher.keepalive()) == wire.Keepalive("0.0.0.0", 0, flags, TOKEN)
    with pytest.raises(ValueError, match="journal needs a subscription"):
        machine(subscribe=False, journal_messages=1)


def test_only_our_keepalive_ack_counts() -> None:
    m = machine()
    m.receive(wire.encode(wire.KeepaliveAck(TOKEN)), BROKER, 0.0)
    m.receive(wire.encode(wire.KeepaliveAck(bytes(16))), BROKER, 0.0)
    m.receive(b"\x20short", BROKER, 0.0)
    m.receive(wire.encode(wire.Push(b"x")), BROKER, 0.0)
    assert (m.stats.acks, m.stats.unexpected, m.stats.malformed) == (1, 2, 1)


# --- in-order delivery --------------------------------------------------------------------


def test_the_stream_starts_at_the_first_sequence_seen_and_stays_in_order() -> None:
    m = machine()
    deliver(m, 7)
    deliver(m, 8)
    assert events(m) == [Delivered(7, b"m7"), Delivered(8, b"m8")]
    deliver(m, 6)  # before where we came in: an old one, not a gap
    deliver(m, 8)
    assert events(m) == []
    assert m.stats.duplicates == 2 and m.gaps == []


def test_out_of_order_messages_are_held_and_released_in_order() -> None:
    m = machine()
    deliver(m, 1)
    for seq in (4, 3, 6):
        deliver(m, seq)
    assert seqs(events(m)) == [1]
    assert m.gaps == [(2, 2), (5, 5)] and m.held == 3
    deliver(m, 3)  # held already
    deliver(m, 2)
    assert seqs(events(m)) == [2, 3, 4]
    deliver(m, 5)
    assert seqs(events(m)) == [5, 6]
    assert m.gaps == [] and m.held == 0
    assert m.stats.reordered == 3 and m.stats.duplicates == 1 and m.stats.recovered == 0


def test_a_gap_is_requested_after_a_short_delay_then_every_interval() -> None:
    m = machine()
    m.tick(0.0)
    m.datagrams_to_send()
    deliver(m, 1, now=0.0)
    deliver(m, 5, now=0.0)
    assert m.next_tick() == pytest.approx(0.05)
    m.tick(0.05)
    assert requests(m) == [(2, 4)]
    m.tick(0.1)
    assert requests(m) == []
    deliver(m, 3, now=0.12)  # recovered: the gap splits, both halves keep their clock
    m.tick(0.25)
    assert requests(m) == [(2, 2), (4, 4)]
    deliver(m, 2, now=0.3)
    deliver(m, 4, now=0.3)
    assert seqs(events(m)) == [1, 2, 3, 4, 5]
    assert m.stats.recovered == 3
    assert m.next_tick() == 1.0  # nothing left but the keepalive (and the probe at 1.3)


def test_requests_are_capped_at_the_request_limit_and_budget() -> None:
    m = machine(request_limit=4096, request_budget=5000)
    deliver(m, 1)
    deliver(m, 10_002)  # 10,000 missing
    m.tick(0.05)
    assert requests(m) == [(2, 4097), (4098, 5001)]
    # The budget is spent: the rest waits a whole interval, no spinning.
    assert m.next_tick() == pytest.approx(0.25)


def test_the_rest_of_a_large_gap_is_asked_once_half_the_budget_came_back() -> None:
    m = machine(request_limit=1000, request_budget=2000)
    deliver(m, 1)
    deliver(m, 10_002)  # 10,000 missing
    m.tick(0.05)
    assert requests(m) == [(2, 1001), (1002, 2001)]
    deliver(m, 20_000, now=0.06)  # a new gap: it waits its request_delay
    for seq in range(2, 1001):
        deliver(m, seq, now=0.07)
    assert m.next_tick() > 0.07
    deliver(m, 1001, now=0.07)  # half the budget back: the next round is due now
    assert m.next_tick() == 0.07
    m.tick(0.07)
    assert requests(m) == [(2002, 3001), (3002, 4001)]  # never asked yet; no re-asking
    m.tick(0.11)
    assert requests(m) == []  # the budget is spent again
    for seq in range(1002, 3002):
        deliver(m, seq, now=0.12)
    m.tick(0.12)
    assert requests(m) == [(4002, 5001), (5002, 6001)]
    m.tick(0.31)
    assert requests(m) == []  # a spent budget waits a whole interval
    m.tick(0.32)  # the first gap is due again: asked from its start
    assert requests(m) == [(3002, 4001), (4002, 5001)]


def test_an_unfilled_gap_is_lost_after_gap_seconds_and_delivery_moves_on() -> None:
    m = machine(gap_seconds=3.0)
    deliver(m, 1, now=0.0)
    deliver(m, 4, now=0.0)
    deliver(m, 5, now=0.0)
    assert seqs(events(m)) == [1]
    m.tick(2.9)
    assert events(m) == []
    m.tick(3.0)
    assert events(m) == [Lost(2, 3), Delivered(4, b"m4"), Delivered(5, b"m5")]
    assert m.lost == [(2, 3)] and m.stats.lost == 2
    deliver(m, 2, now=3.1)  # too late
    assert events(m) == [] and m.stats.duplicates == 1


def test_holding_is_bounded_the_oldest_gap_goes_first() -> None:
    m = machine(hold_limit=3)
    deliver(m, 1)
    for seq in (3, 5, 6, 7):
        deliver(m, seq)
    assert events(m) == [Delivered(1, b"m1"), Lost(2, 2), Delivered(3, b"m3")]
    assert m.gaps == [(4, 4)] and m.held == 3


def test_start_asks_for_history_at_once() -> None:
    m = machine(start=10)
    m.tick(0.0)
    assert requests(m) == [(10, 73)]  # the tail probe, before any DELIVER
    deliver(m, 9)
    deliver(m, 20, now=0.1)
    assert m.stats.ignored == 1 and m.gaps == [(10, 19)]
    for seq in range(10, 20):
        deliver(m, seq, now=0.2)
    assert seqs(events(m)) == list(range(10, 21))


def test_the_tail_probe_runs_after_a_second_of_silence() -> None:
    m = machine()
    m.tick(0.0)
    m.datagrams_to_send()
    m.tick(5.0)
    assert requests(m) == []  # no stream position yet: nothing to ask for
    deliver(m, 41, now=5.0)
    assert m.next_tick() == 6.0
    m.tick(5.9)
    assert requests(m) == []
    m.tick(6.0)
    assert requests(m) == [(42, 105)]
    m.tick(6.5)
    assert requests(m) == []
    m.tick(7.0)
    assert requests(m) == [(42, 105)]
    assert m.stats.probes == 2


def test_a_replay_asks_for_the_next_range_as_soon_as_half_of_one_is_back() -> None:
    m = machine(start=1, request_limit=200)
    m.tick(0.0)
    assert requests(m) == [(1, 64)]
    for seq in range(1, 33):
        deliver(m, seq, now=0.01)
    assert requests(m) == []  # not half of it yet
    deliver(m, 33, now=0.01)
    assert requests(m) == [(65, 192)]  # at once, twice as long, not after a second
    for seq in range(34, 129):
        deliver(m, seq, now=0.02)
    assert requests(m) == []
    deliver(m, 129, now=0.02)
    assert requests(m) == [(193, 392)]  # capped at the request limit
    for seq in range(130, 294):
        deliver(m, seq, now=0.03)
    assert requests(m) == [(393, 592)]
    assert seqs(events(m)) == list(range(1, 294)) and m.stats.probes == 1


def test_a_chase_cut_short_by_the_brokers_request_limit_goes_on_below_it() -> None:
    m = machine(start=1)
    m.tick(0.0)
    assert requests(m) == [(1, 64)]
    for seq in range(1, 130):
        deliver(m, seq, now=0.01)
    assert requests(m) == [(65, 192), (193, 448)]
    for seq in range(130, 493):  # the broker gives 300 of each REQUEST
        deliver(m, seq, now=0.02)
    assert requests(m) == [(449, 960)]
    for seq in range(493, 749):
        deliver(m, seq, now=0.03)
    assert requests(m) == [(961, 1984)]
    for seq in range(961, 1261):
        deliver(m, seq, now=0.04)
    assert requests(m) == []  # 300 back, not half of 1024: stalled
    m.tick(1.04)  # the gap the cut left, and the probe after a second of silence
    assert requests(m) == [(749, 960), (1261, 1324)]
    for seq in range(749, 961):
        deliver(m, seq, now=1.05)
    for seq in range(1261, 1294):
        deliver(m, seq, now=1.05)
    assert requests(m) == [(1325, 1452)]
    for seq in range(1294, 1390):
        deliver(m, seq, now=1.05)
    assert requests(m) == [(1453, 1708)]
    for seq in range(1390, 1582):
        deliver(m, seq, now=1.05)
    assert requests(m) == [(1709, 2008)]  # no more than the broker gave


def test_the_live_stream_past_the_last_request_ends_the_chase() -> None:
    m = machine(start=1)
    m.tick(0.0)
    assert requests(m) == [(1, 64)]
    deliver(m, 100, now=0.01)  # live: no REQUEST asked for it
    deliver(m, 50, now=0.01)
    assert requests(m) == []
    m.tick(0.1)
    assert requests(m) == [(1, 49), (51, 99)]  # the gaps, as any gap


def test_requests_name_the_advertised_address() -> None:
    m = machine(advertise=("10.0.0.1", 9000))
    deliver(m, 1)
    deliver(m, 3)
    m.tick(0.05)
    assert [d for d, _ in sent(m) if isinstance(d, wire.Request)] == [
        wire.Request("10.0.0.1", 9000, 2, 2)
    ]


# --- the journal --------------------------------------------------------------------------


def test_a_journal_answers_forward_to_the_named_address() -> None:
    m = machine(journal_messages=3)
    for seq in range(1, 6):
        deliver(m, seq)
    m.datagrams_to_send()
    m.receive(wire.encode(wire.Forward("127.0.0.1", 7000, 1, 9)), BROKER, 0.0)
    assert sent(m) == [(wire.Deliver(seq, b"m%d" % seq), ("127.0.0.1", 7000)) for seq in (3, 4, 5)]
    m.receive(wire.encode(wire.Forward("127.0.0.1", 7000, 1, 2)), BROKER, 0.0)  # evicted
    assert sent(m) == []
    assert (m.stats.forwards, m.stats.forwards_answered, m.stats.forwarded_messages) == (2, 1, 3)


def test_without_a_journal_forward_is_unexpected() -> None:
    m = machine()
    deliver(m, 1)
    m.datagrams_to_send()
    m.receive(wire.encode(wire.Forward("127.0.0.1", 7000, 1, 1)), BROKER, 0.0)
    assert sent(m) == [] and m.stats.unexpected == 1


# --- publishing ---------------------------------------------------------------------------


def test_publish_is_confirmed_when_it_comes_back_fifo_among_equal_payloads() -> None:
    m = machine()
    a = m.publish(b"same", 0.0)
    b = m.publish(b"same", 0.0)
    c = m.publish(b"other", 0.0)
    assert [d for d, _ in sent(m)] == [wire.Push(b"same"), wire.Push(b"same"), wire.Push(b"other")]
    assert m.datagrams_to_send() == []
    deliver(m, 1, b"same")
    deliver(m, 2, b"unrelated")
    deliver(m, 4, b"other")  # held: not confirmed before it is in order
    assert Confirmed(c, 4) not in events(m)
    deliver(m, 3, b"same")
    evs = events(m)
    assert [e for e in evs if isinstance(e, Confirmed)] == [Confirmed(b, 3), Confirmed(c, 4)]
    assert m.in_flight == 0
    del a


def test_publish_is_sent_again_after_the_timeout_until_confirmed() -> None:
    m = machine(publish_timeout=2.0)
    m.tick(0.0)
    m.datagrams_to_send()
    pid = m.publish(b"p", 0.5)
    m.datagrams_to_send()
    assert m.next_tick() == 1.0  # the keepalive first
    m.tick(1.0)
    assert [d for d, _ in sent(m) if isinstance(d, wire.Push)] == []
    m.tick(2.5)
    assert [d for d, _ in sent(m) if isinstance(d, wire.Push)] == [wire.Push(b"p")]
    m.tick(4.5)
    assert [d for d, _ in sent(m) if isinstance(d, wire.Push)] == [wire.Push(b"p")]
    deliver(m, 9, b"p", now=4.6)
    assert Confirmed(pid, 9) in events(m)
    m.tick(10.0)
    assert [d for d, _ in sent(m) if isinstance(d, wire.Push)] == []
    assert m.stats.resent == 2


def test_a_client_that_does_not_subscribe_confirms_at_once() -> None:
    m = machine(subscribe=False)
    pid = m.publish(b"x", 0.0)
    assert events(m) == [Confirmed(pid, None)]
    with pytest.raises(ValueError, match="over the limit"):
        m.publish(bytes(wire.MAX_DATA + 1), 0.0)
    deliver(m, 1)
    assert events(m) == [] and m.stats.unexpected == 1


# --- the asyncio shell against a real broker ------------------------------------------------


async def test_publish_returns_the_sequence_and_subscribers_get_the_stream(
    settings: Settings,
) -> None:
    async with backbone(settings) as (broker, state):
        host, port = fyrehose_address(broker)
        sub = await FyrehoseClient.connect(host, port)
        pub = await FyrehoseClient.connect(host, port)
        quiet = await FyrehoseClient.connect(host, port, subscribe=False)
        try:
            assert sub.local_address[0] == "127.0.0.1" and sub.local_address[1] > 0
            async with asyncio.timeout(TIMEOUT):
                assert await pub.publish(b"one") == 1
                assert await asyncio.gather(pub.publish_nowait(b"two"), pub.publish(b"two")) == [
                    2,
                    3,
                ]
                assert await quiet.publish(b"four") is None  # it cannot see its echo
                got = [await sub.next() for _ in range(4)]
                assert [await pub.next() for _ in range(4)] == got
            assert got == [
                Delivered(1, b"one"),
                Delivered(2, b"two"),
                Delivered(3, b"two"),
                Delivered(4, b"four"),
            ]
            assert state.sequence == 4 and sub.lost == [] and quiet.backlog == 0
            assert {s.port for s in state.subscribers()} == {
                sub.local_address[1],
                pub.local_address[1],
            }
        finally:
            for c in (sub, pub, quiet):
                await c.close()


async def test_start_reads_the_history_from_the_window(settings: Settings) -> None:
    async with backbone(settings) as (broker, state):
        host, port = fyrehose_address(broker)
        async with await FyrehoseClient.connect(host, port) as pub, asyncio.timeout(TIMEOUT):
            for i in range(300):
                assert await pub.publish(b"h%d" % i) == i + 1
        async with await FyrehoseClient.connect(host, port, start=101) as late:
            async with asyncio.timeout(TIMEOUT):
                got = [await late.next() for _ in range(200)]
        assert got == [Delivered(seq, b"h%d" % (seq - 1)) for seq in range(101, 301)]
        assert state.served >= 200


@pytest.mark.parametrize("request_limit", [4096, 300])
async def test_start_replays_thousands_of_retained_messages_once_in_order(
    settings: Settings, request_limit: int
) -> None:
    count = 5000
    async with backbone(settings, request_limit=request_limit) as (broker, state):
        host, port = fyrehose_address(broker)
        async with await FyrehoseClient.connect(host, port) as pub, asyncio.timeout(TIMEOUT):
            for first in range(0, count, 500):
                got = await asyncio.gather(
                    *(pub.publish_nowait(b"r%d" % i) for i in range(first, first + 500))
                )
                assert sorted(got) == list(range(first + 1, first + 501))  # type: ignore[type-var]
        assert state.retained_messages == count
        # Generous: the replay takes well under a second; at a probe a second it took 78 s.
        async with await FyrehoseClient.connect(host, port, start=1) as late:
            async with asyncio.timeout(60):
                got_all = [await late.next() for _ in range(count)]
            assert got_all == [Delivered(seq, b"r%d" % (seq - 1)) for seq in range(1, count + 1)]
            assert late.lost == []


async def test_close_unsubscribes_at_once_and_ends_everything(settings: Settings) -> None:
    async with backbone(settings) as (broker, state):
        host, port = fyrehose_address(broker)
        client = await FyrehoseClient.connect(host, port, publish_timeout=60.0)
        assert len(state.subscribers()) == 1
        reader = asyncio.create_task(client.next())
        await asyncio.sleep(0)
        await client.close()
        await wait_for(lambda: state.subscribers() == [])
        with pytest.raises(FyrehoseClosed):
            await reader
        with pytest.raises(FyrehoseClosed):
            client.publish_nowait(b"late")
        assert [m async for m in client] == []
        await client.close()  # twice is fine


async def test_no_broker_is_a_timeout() -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as hole:
        hole.bind(("127.0.0.1", 0))  # bound, never answers
        port = hole.getsockname()[1]
        with pytest.raises(TimeoutError):
            await FyrehoseClient.connect("127.0.0.1", port, connect_timeout=0.3)


# --- the console script -------------------------------------------------------------------


async def fyrehose_cli(procs: list[Proc], port: int, *args: str, stdin: bool = False) -> Proc:
    proc = await Proc.start(
        "-m", "fqbroker.cli.fyrehose", "--port", str(port), *args,
        stdin=asyncio.subprocess.PIPE if stdin else None,
    )  # fmt: skip
    procs.append(proc)
    return proc


async def test_fyrehose_push_and_sub(settings: Settings, procs: list[Proc]) -> None:
    async with backbone(settings) as (broker, _):
        _, port = fyrehose_address(broker)
        lines = b"first\nsecond line\n\xff\xfe not utf-8\nlast without newline"
        push = await fyrehose_cli(procs, port, "push", stdin=True)
        async with asyncio.timeout(TIMEOUT):
            status, _, err = await push.finish(lines)
        assert status == 0, err
        assert "pushed 4 messages" in err and "Traceback" not in err
        sub = await fyrehose_cli(procs, port, "sub", "--json", "--start", "1", "--count", "4")
        async with asyncio.timeout(TIMEOUT):
            status, out, err = await sub.finish()
        assert status == 0, err
        assert [json.loads(line) for line in out.splitlines()] == [
            {"seq": 1, "data": "first"},
            {"seq": 2, "data": "second line"},
            {"seq": 3, "data": "//4gbm90IHV0Zi04", "base64": True},
            {"seq": 4, "data": "last without newline"},
        ]
        plain = await fyrehose_cli(procs, port, "sub", "--start", "2", "--count", "1")
        async with asyncio.timeout(TIMEOUT):
            status, out, err = await plain.finish()
        assert (status, out) == (0, b"second line\n"), err


async def test_fyrehose_tool_errors_are_one_line(procs: list[Proc]) -> None:
    bad = await fyrehose_cli(procs, 2323, "sub", "--start", "0")
    async with asyncio.timeout(TIMEOUT):
        status, _, err = await bad.finish()
    assert status == 2 and "--start: '0' is not a sequence" in err and "Traceback" not in err
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as hole:
        hole.bind(("127.0.0.1", 0))
        nobody = await fyrehose_cli(procs, hole.getsockname()[1], "sub")
        async with asyncio.timeout(TIMEOUT):
            status, _, err = await nobody.finish()
    assert status == 1 and err.strip().count("\n") == 0, err
    assert "no answer from 127.0.0.1" in err
