"""fqbroker.frontends.fq.commandmachine: the command channel's protocol, no sockets.

Bytes go in and events and bytes come out; time is passed in. The socket tests in
test_server.py cover the same protocol through the asyncio shell and a real broker.
"""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given
from hypothesis import strategies as st

from fqbroker.clients.fq.client import Authenticated, CommandChannel, Reply
from fqbroker.core.queuespec import QueueKind
from fqbroker.core.router import ClientStats
from fqbroker.errors import AuthError, ProtocolError, QueueError
from fqbroker.frontends.fq.commandmachine import (
    _IDLE,
    Authenticate,
    Broken,
    CommandMachine,
    EndOfInput,
    HeartbeatsAsked,
    Phase,
    Refused,
)
from fqbroker.protocols.fq import wire

KEY = bytes(range(127))
AUTH = wire.encode(wire.AuthPlain(b"user", b"q1\0mem", b"pw"))
HB = wire.encode(wire.Heartbeat())


def events(machine: CommandMachine[object], now: float = 0.0) -> list[object]:
    out: list[object] = []
    while (event := machine.next_event(now)) is not None:
        out.append(event)
    return out


def ready(now: float = 0.0) -> CommandMachine[object]:
    machine: CommandMachine[object] = CommandMachine(now)
    machine.receive_data(AUTH)
    [auth] = events(machine, now)
    assert isinstance(auth, Authenticate)
    machine.accept(KEY)
    machine.data_to_send(now)
    return machine


def test_auth_read_byte_by_byte_then_accepted() -> None:
    machine: CommandMachine[object] = CommandMachine(0.0)
    assert machine.phase is Phase.AWAIT_AUTH
    for i in range(len(AUTH) - 1):
        machine.receive_data(AUTH[i : i + 1])
        assert machine.next_event(0.0) is None
    machine.receive_data(AUTH[-1:])
    event = machine.next_event(0.0)
    assert isinstance(event, Authenticate)
    assert event.user == b"user"
    assert event.spec.name == b"q1" and event.spec.kind is QueueKind.MEM
    assert machine.phase is Phase.READY
    assert machine.data_to_send(0.0) == b""
    machine.accept(KEY)
    assert machine.data_to_send(0.0) == wire.encode(wire.AuthResponse(KEY)) + HB
    assert machine.data_to_send(0.0) == b""


@pytest.mark.parametrize(
    ("data", "text"),
    [
        (wire.encode(wire.Heartbeat()), "auth command expected"),
        (b"\xaa\xaa\x00\x01", "unsupported auth method"),
        (wire.encode(wire.AuthPlain(b"u" * 128, b"q")), "user name is too long"),
        (wire.encode(wire.AuthPlain(b"u", b"q" * 1024)), "queue detail is too long"),
        (wire.encode(wire.AuthPlain(b"u", b"q\0bogus")), "invalid queue type: bogus"),
    ],
)
def test_a_bad_auth_is_refused_with_fqs_text_and_closes(data: bytes, text: str) -> None:
    machine: CommandMachine[object] = CommandMachine(0.0)
    machine.receive_data(data + AUTH)
    [event] = events(machine)
    assert isinstance(event, Refused) and isinstance(event.error, AuthError)
    assert event.error.text == text
    assert machine.phase is Phase.CLOSED
    assert machine.data_to_send(0.0) == wire.encode(wire.ErrorReply(text))
    machine.receive_data(AUTH)  # read and thrown away
    assert events(machine) == []
    assert machine.data_to_send(0.0) == b""


def test_the_host_refusing_the_queue_is_answered_the_same_way() -> None:
    machine: CommandMachine[object] = CommandMachine(0.0)
    machine.receive_data(AUTH + wire.encode(wire.StatusRequest()))
    assert isinstance(machine.next_event(0.0), Authenticate)
    machine.refuse(QueueError("too many queues").text)
    assert machine.closed
    assert machine.next_event(0.0) is None
    assert machine.data_to_send(0.0) == wire.encode(wire.ErrorReply("too many queues"))


def test_an_unknown_command_breaks_the_connection_after_earlier_replies() -> None:
    machine = ready()
    machine.receive_data(wire.encode(wire.StatusRequest()) + b"\x12\x34")
    status, broken = events(machine)
    assert status == wire.StatusRequest()
    machine.status(0, None)
    assert isinstance(broken, Broken) and isinstance(broken.error, ProtocolError)
    assert machine.closed
    assert machine.data_to_send(0.0) == b""  # closed before the status was answered


def test_pipelined_requests_come_out_in_order() -> None:
    requests: list[wire.ClientRequest] = [
        wire.BindRequest(0x100, b"ex", b'prefix:"a"'),
        wire.StatusRequest(),
        wire.UnbindRequest(7, b"ex"),
        wire.ConfirmRequest(3),
    ]
    machine: CommandMachine[object] = CommandMachine(0.0)
    machine.receive_data(AUTH + b"".join(map(wire.encode, requests)))
    first, *rest = events(machine)
    assert isinstance(first, Authenticate)
    assert rest == requests


def test_replies_wait_behind_a_pending_confirm_in_request_order() -> None:
    machine = ready()
    machine.defer("c1")
    machine.bound(5)
    machine.defer("c2")
    machine.unbound(9, ok=False)
    assert machine.data_to_send(0.0) == b""
    machine.settle("c2", 2, "no data channel")  # not at the head: still held
    assert machine.data_to_send(0.0) == b""
    machine.settle("c1", 1, None)
    assert machine.data_to_send(0.0) == b"".join(
        wire.encode(f)
        for f in (
            wire.Confirmed(1),
            wire.BindResponse(5),
            wire.ConfirmFailed(2, "no data channel"),
            wire.UnbindResponse(wire.BIND_ILLEGAL),
        )
    )
    machine.bound(6)  # nothing pending: at once
    assert machine.data_to_send(0.0) == wire.encode(wire.BindResponse(6))


def test_a_dropped_confirm_sends_nothing_and_lets_the_rest_go() -> None:
    machine = ready()
    machine.defer("c1")
    machine.status(4, None)
    machine.drop("c1")
    expected = wire.Status(
        (
            ("dropped_in", 4),
            (wire.CONFIRM_STATUS_KEY, wire.CONFIRM_VERSION),
            (wire.DEDUP_STATUS_KEY, wire.DEDUP_VERSION),
        )
    )
    assert machine.data_to_send(0.0) == wire.encode(expected)


def test_close_hands_back_unsettled_confirms_and_drops_held_replies() -> None:
    machine = ready()
    machine.defer("c1")
    machine.bound(1)
    machine.defer("c2")
    assert machine.close() == ["c1", "c2"]
    machine.settle("c1", 1, None)
    assert machine.data_to_send(0.0) == b""
    assert machine.close() == []


def test_status_shows_traffic_counters_once_paired() -> None:
    machine = ready()
    stats = ClientStats(routed=3, msgs_in=4, octets_in=50)
    machine.status(2, stats)
    reply = wire.ClientCommandDecoder()
    reply.feed(machine.data_to_send(0.0))
    frame = reply.next_frame()
    assert isinstance(frame, wire.Status)
    assert list(frame.as_dict()) == [
        "dropped_in", "no_exchange", "no_route", "routed", "dropped", "size_dropped",
        "msgs_in", "msgs_out", "octets_in", "octets_out", "confirm", "dedup",
    ]  # fmt: skip
    assert frame.as_dict()["routed"] == 3 and frame.as_dict()["dropped_in"] == 2


def test_eof_cuts_auth_short_or_ends_quietly() -> None:
    machine: CommandMachine[object] = CommandMachine(0.0)
    machine.receive_data(b"\xaa\xaa")
    assert machine.next_event(0.0) is None
    event = machine.receive_eof()
    assert isinstance(event, Refused) and event.error.text == "auth method read failed"
    assert machine.data_to_send(0.0) == wire.encode(wire.ErrorReply("auth method read failed"))

    machine = ready()
    machine.receive_data(b"\xb1")  # half a command: nothing to answer
    assert machine.next_event(0.0) is None
    assert isinstance(machine.receive_eof(), EndOfInput)
    assert machine.closed


# --- heartbeats -------------------------------------------------------------------------


def ask(machine: CommandMachine[object], interval_ms: int, now: float) -> float | None:
    machine.receive_data(wire.encode(wire.HeartbeatRequest(interval_ms)))
    [event] = events(machine, now)
    assert isinstance(event, HeartbeatsAsked)
    assert machine.heartbeat_ms == interval_ms
    return event.when


def test_heartbeats_keep_a_grid_from_the_last_write_and_fail_a_silent_client() -> None:
    machine = ready(now=10.0)  # auth's reply and beat went out at 10.0
    assert ask(machine, 1000, now=10.5) == 11.0  # one interval after the last write
    assert machine.heartbeat_due(11.0) == 12.0
    assert machine.data_to_send(11.0) == HB
    # Served late, the grid holds: due one interval after the last was due.
    assert machine.heartbeat_due(12.3) == 13.0
    assert machine.data_to_send(12.3) == HB
    # Far too late for the grid: next one interval from now (deadline 13.5 comes first).
    machine.receive_data(HB)  # the client is heard at 12.4: deadline 15.4
    assert events(machine, 12.4) == []
    assert machine.heartbeat_due(14.9) == 15.4
    assert machine.data_to_send(14.9) == HB
    assert machine.heartbeat_due(15.4) is None  # 3x the interval silent
    assert machine.closed
    assert machine.data_to_send(15.4) == wire.encode(wire.ErrorReply("client heartbeat failed"))


def test_asking_again_looks_at_the_deadline_and_zero_stops() -> None:
    machine = ready(now=0.0)
    assert ask(machine, 1000, now=0.0) == 1.0
    # A shorter interval: the grid stays, the silence deadline (3 x 0.1 s) comes first.
    assert ask(machine, 100, now=0.5) == pytest.approx(0.8)
    assert ask(machine, 0, now=0.6) is None
    assert machine.heartbeat_due(5.0) is None
    assert machine.data_to_send(5.0) == b""
    assert not machine.closed


def test_heartbeats_asked_for_zero_first_leave_the_grid_unset() -> None:
    machine = ready(now=0.0)
    assert ask(machine, 0, now=1.0) is None
    machine.bound(1)
    machine.data_to_send(4.0)  # the last write, which the first beat counts from
    assert ask(machine, 1000, now=4.5) == 5.0


# --- every phase against every request (the transition table) ---------------------------

REQUESTS: list[wire.ClientRequest] = [
    wire.AuthPlain(b"u", b"q"),
    wire.Heartbeat(),
    wire.HeartbeatRequest(1000),
    wire.StatusRequest(),
    wire.BindRequest(0, b"ex", b"prefix:"),
    wire.UnbindRequest(1, b"ex"),
    wire.ConfirmRequest(1),
]


def machine_in(phase: Phase) -> CommandMachine[object]:
    machine: CommandMachine[object] = CommandMachine(0.0)
    if phase is not Phase.AWAIT_AUTH:
        machine = ready()
    if phase is Phase.CLOSED:
        machine.close()
    assert machine.phase is phase
    return machine


@pytest.mark.parametrize(("phase", "request_"), list(itertools.product(Phase, REQUESTS)))
def test_every_phase_and_request(phase: Phase, request_: wire.ClientRequest) -> None:
    machine = machine_in(phase)
    machine.receive_data(wire.encode(request_))
    got = events(machine)
    if phase is Phase.CLOSED:
        assert got == []
    elif phase is Phase.AWAIT_AUTH:
        if isinstance(request_, wire.AuthPlain):
            assert [type(e) for e in got] == [Authenticate]
            assert machine.phase is Phase.READY
        else:
            assert [type(e) for e in got] == [Refused]
            assert machine.phase is Phase.CLOSED
    elif isinstance(request_, wire.AuthPlain):
        assert [type(e) for e in got] == [Broken]  # 0xaaaa is no command after auth
        assert machine.phase is Phase.CLOSED
    elif isinstance(request_, wire.Heartbeat):
        assert got == []
    elif isinstance(request_, wire.HeartbeatRequest):
        assert [type(e) for e in got] == [HeartbeatsAsked]
    else:
        assert got == [request_]


# --- the client's sans-IO channel against the server's ----------------------------------


def test_the_clients_channel_and_the_machine_talk() -> None:
    client: CommandChannel[str] = CommandChannel()
    server: CommandMachine[object] = CommandMachine(0.0)
    hello = client.hello(b"user", b"q\0mem", b"")
    server.receive_data(hello[4:])  # the 4-byte mode was the sniffer's
    server.receive_data(client.request(wire.BindRequest(0x100, b"ex", b"prefix:"), "bind"))
    server.receive_data(client.request(wire.StatusRequest(), "status"))
    auth, bind, status = events(server)
    assert isinstance(auth, Authenticate)
    server.accept(KEY)
    assert isinstance(bind, wire.BindRequest)
    server.bound(42)
    assert status == wire.StatusRequest()
    server.status(0, None)
    client.receive_data(server.data_to_send(0.0))
    assert client.next_event() == Authenticated(KEY)
    assert client.next_event() == Reply("bind", wire.BindResponse(42))
    reply = client.next_event()
    assert isinstance(reply, Reply) and reply.token == "status"
    assert client.next_event() is None
    assert client.data_to_send() == HB  # the client answered the broker's first beat


# --- what the modules may import ----------------------------------------------------------


def _imports(module: object) -> set[str]:
    import ast
    import inspect

    names: set[str] = set()
    for node in ast.walk(ast.parse(inspect.getsource(module))):  # type-only imports too
        if isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
        elif isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
    return names


def test_the_machine_does_no_io_and_the_session_needs_no_broker() -> None:
    from fqbroker.frontends.fq import command, commandmachine

    assert not _imports(commandmachine) & {"asyncio", "socket", "selectors", "time"}
    forbidden = {"fqbroker.server.broker", "fqbroker.frontends.fq.data"}
    assert not _imports(command) & forbidden
    assert not _imports(commandmachine) & forbidden


# --- an idle session's decoder ------------------------------------------------------------

_REQUESTS = st.sampled_from(
    [
        wire.encode(wire.Heartbeat()),
        wire.encode(wire.HeartbeatRequest(1000)),
        wire.encode(wire.StatusRequest()),
        wire.encode(wire.BindRequest(0x100, b"ex", b'prefix:"a"')),
        wire.encode(wire.UnbindRequest(7, b"ex")),
    ]
)


@given(
    st.lists(_REQUESTS, max_size=8),
    st.lists(st.integers(1, 40), max_size=30),
    st.booleans(),
)
def test_any_chunking_reads_the_same_and_an_idle_session_holds_no_decoder(
    requests: list[bytes], cuts: list[int], eof: bool
) -> None:
    """The decoder is let go whenever all fed is read (commandmachine._IDLE) and made again
    when bytes come: whatever the reads, the events and the end are those of one read."""
    stream = b"".join(requests)
    whole = ready()
    whole.receive_data(stream)
    expected = events(whole)
    chunked = ready()
    assert chunked._decoder is _IDLE  # the auth read, nothing buffered
    got: list[object] = []
    pos = 0
    for n in [*cuts, len(stream)]:
        if pos >= len(stream):
            break
        chunked.receive_data(stream[pos : pos + n])
        pos += n
        got += events(chunked)
        assert chunked.phase is Phase.READY
        assert (chunked._decoder is _IDLE) == (pos >= len(stream) or stream_at_frame(stream, pos))
    assert got == expected
    if eof:
        assert isinstance(chunked.receive_eof(), EndOfInput) and chunked.closed
        assert chunked.phase is Phase.CLOSED


def stream_at_frame(stream: bytes, pos: int) -> bool:
    """Whether ``pos`` falls between two whole requests of ``stream``."""
    decoder = wire.ServerCommandDecoder(authed=True)
    decoder.feed(stream[:pos])
    while decoder.next_frame() is not None:
        pass
    return decoder.buffered == 0


def test_sessions_asking_the_same_interval_share_its_int() -> None:
    a, b = ready(), ready()
    ask(a, int("1500"), 0.0)  # made at run time: two equal ints, not one constant
    ask(b, int("1500"), 0.0)
    assert a.heartbeat_ms == b.heartbeat_ms == 1500
    assert a._interval_ms is b._interval_ms
