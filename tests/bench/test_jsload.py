"""The JetStream generator's frames and walk, against bytes nats-server 2.9.10 sent.

No nats-server here (CI has none): the golden replies were read off a live
`nats-server -js`. Each reader is fed whole, a byte at a time and at every split in two,
as reads come. The roles themselves run against a scripted server on a loopback port,
which replays those bytes and checks the window and the flow-control answer.
"""

from __future__ import annotations

import json
import os
import socket
import struct
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from bench import jsload
from bench.jetstream import JetStream
from bench.jsload import JetStreamError, Reader
from tests.bench import roles

INBOX = b"_INBOX.4b960b9d5f63"
U64 = struct.Struct(">Q")

ACKS = (
    b'MSG _INBOX.4b960b9d5f63.1 1  24\r\n{"stream":"g1", "seq":1}\r\n'
    b'MSG _INBOX.4b960b9d5f63.2 1  24\r\n{"stream":"g1", "seq":2}\r\n'
    b'MSG _INBOX.4b960b9d5f63.3 1  24\r\n{"stream":"g1", "seq":3}\r\n'
)
ERROR_ACK = (
    b"MSG _INBOX.4b960b9d5f63.6 1  103\r\n"
    b'{"error":{"code":503,"err_code":10077,"description":"maximum messages exceeded"},'
    b'"stream":"g1","seq":0}\r\n'
)
NO_RESPONDERS = b"HMSG _INBOX.4b960b9d5f63.none 1 16 16\r\nNATS/1.0 503\r\n\r\n\r\n"
STREAM_IN_USE = (
    b"MSG _INBOX.4b960b9d5f63.api-1 1 170\r\n"
    b'{"type":"io.nats.jetstream.api.v1.stream_create_response","error":{"code":400,'
    b'"err_code":10058,"description":"stream name already in use with a different '
    b'configuration"}}\r\n'
)
FLOW_CONTROL = (
    b"HMSG _DLV.2c8721481a10 2 $JS.FC.g1.5PLrtnUn.udLj 36 36\r\n"
    b"NATS/1.0 100 FlowControl Request\r\n\r\n\r\n"
)
STALLED = (
    b"HMSG _DLV.2c8721481a10 2  123 123\r\nNATS/1.0 100 Idle Heartbeat\r\n"
    b"Nats-Last-Consumer: 9\r\nNats-Last-Stream: 9\r\n"
    b"Nats-Consumer-Stalled: $JS.FC.g1.5PLrtnUn.abcd\r\n\r\n\r\n"
)


def delivery(seq: int, size: int = 100) -> bytes:
    """A push consumer's delivery as the server frames it, the payload as pub makes it."""
    reply = b"$JS.ACK.g1.5PLrtnUn.1.%d.%d.1795956407730288342.%d" % (seq, seq, 99 - seq)
    payload = U64.pack(seq) + b"x" * (size - 8)
    return b"MSG g1 2 %s %d\r\n%s\r\n" % (reply, size, payload)


def splits(data: bytes) -> Iterator[list[bytes]]:
    """``data`` whole, a byte at a time, and cut in two at every offset."""
    yield [data]
    yield [data[i : i + 1] for i in range(len(data))]
    for i in range(1, len(data)):
        yield [data[:i], data[i:]]


# --- frames ------------------------------------------------------------------------------------


def test_pub_frame_with_and_without_reply() -> None:
    assert jsload.pub_frame(b"g1", INBOX + b".7", b"hi") == (
        b"PUB g1 _INBOX.4b960b9d5f63.7 2\r\nhi\r\n"
    )
    assert jsload.pub_frame(b"$JS.FC.g1.x", None, b"") == b"PUB $JS.FC.g1.x 0\r\n\r\n"


def test_publish_block_frames_have_one_length_and_carry_their_sequence() -> None:
    block, flen = jsload.publish_block(b"g1", INBOX, 10, 12)
    assert block[:flen] == (b"PUB g1 _INBOX.4b960b9d5f63.01 12\r\n\0\0\0\0\0\0\0\x01xxxx\r\n")
    assert block[9 * flen :] == (b"PUB g1 _INBOX.4b960b9d5f63.10 12\r\n\0\0\0\0\0\0\0\x0axxxx\r\n")
    assert len(block) == 10 * flen
    with pytest.raises(ValueError):
        jsload.publish_block(b"g1", INBOX, 1, 7)


def test_stream_and_consumer_configs_ask_for_the_rows_promise() -> None:
    stream = jsload.stream_config("g1")
    assert stream["subjects"] == ["g1"] and stream["storage"] == "file"
    assert stream["retention"] == "limits" and stream["discard"] == "old"
    assert stream["max_msgs"] == stream["max_bytes"] == -1
    consumer = jsload.consumer_config("g1", b"_DLV.ab")["config"]
    assert consumer["deliver_subject"] == "_DLV.ab"
    assert (consumer["deliver_policy"], consumer["ack_policy"]) == ("all", "none")
    assert consumer["flow_control"] is True and consumer["idle_heartbeat"] > 0


# --- PubAcks -------------------------------------------------------------------------------------


@pytest.mark.parametrize("bulk", [True, False], ids=["bulk", "exact"])
def test_pubacks_counted_however_the_reads_split(bulk: bool) -> None:
    for reads in splits(ACKS):
        reader = Reader(INBOX)
        for data in reads:
            (reader.feed_acks if bulk else reader.feed)(data)
        assert reader.acks == 3, reads
        assert reader.pos == len(reader.buf)


@pytest.mark.parametrize("bulk", [True, False], ids=["bulk", "exact"])
def test_a_ping_among_acks_is_answered(bulk: bool) -> None:
    for reads in splits(ACKS[:59] + b"PING\r\n" + ACKS[59:] + b"PING\r\n"):
        reader = Reader(INBOX)
        for data in reads:
            (reader.feed_acks if bulk else reader.feed)(data)
        assert (reader.acks, reader.out) == (3, [b"PONG\r\n"] * 2), reads


@pytest.mark.parametrize(
    ("reply", "text"),
    [
        (ERROR_ACK, "503 10077: maximum messages exceeded"),
        (NO_RESPONDERS, "NATS/1.0 503"),
        (STREAM_IN_USE, "already in use with a different configuration"),
        (b"-ERR 'Maximum Payload Violation'\r\n", "Maximum Payload Violation"),
    ],
    ids=["puback-error", "no-responders", "api-error", "-ERR"],
)
def test_an_error_reply_fails_the_run(reply: bytes, text: str) -> None:
    for feed in ("feed_acks", "feed"):
        for reads in ([ACKS + reply], [ACKS, reply], [ACKS + reply[:9], reply[9:]]):
            reader = Reader(INBOX)
            with pytest.raises(JetStreamError, match=text):
                for data in reads:
                    getattr(reader, feed)(data)
                reader.take_reply(b"api-1")  # an API error is its caller's to raise


def test_an_api_status_is_kept_as_an_error_reply() -> None:
    # JetStream not there (no responders): the request's caller gets the error.
    reader = Reader(INBOX)
    reader.feed(b"HMSG _INBOX.4b960b9d5f63.api-1 1 16 16\r\nNATS/1.0 503\r\n\r\n\r\n")
    with pytest.raises(JetStreamError, match=r"api-1: NATS/1\.0 503"):
        reader.take_reply(b"api-1")


def test_api_reply_kept_under_its_token() -> None:
    body = b'{"type":"io.nats.jetstream.api.v1.stream_create_response","did_create":true}'
    frame = b"MSG %s.api-1 1 %d\r\n%s\r\n" % (INBOX, len(body), body)
    for reads in splits(frame):
        reader = Reader(INBOX)
        for data in reads:
            reader.feed(data)
        assert reader.replies == {b"api-1": json.loads(body)}
        assert reader.acks == 0


# --- deliveries ----------------------------------------------------------------------------------


def test_deliveries_counted_in_order_however_the_reads_split() -> None:
    data = b"".join(delivery(seq) for seq in range(1, 12))
    for reads in splits(data):
        reader = Reader(INBOX, b"g1")
        for chunk in reads:
            reader.feed(chunk)
        assert (reader.received, reader.whole, reader.first_seq) == (11, True, 1)


def test_a_missing_or_repeated_delivery_is_not_whole() -> None:
    for seqs in ([1, 2, 4], [1, 2, 2, 3], [2, 1]):
        reader = Reader(INBOX, b"g1")
        reader.feed(b"".join(delivery(seq) for seq in seqs))
        assert reader.received == len(seqs) and not reader.whole, seqs


def test_a_size_change_is_read_from_the_header() -> None:
    reader = Reader(INBOX, b"g1")
    reader.feed(delivery(1) + delivery(2, 20) + delivery(3, 1000) + delivery(4))
    assert (reader.received, reader.whole) == (4, True)


def test_flow_control_request_answered_on_its_reply_subject() -> None:
    data = delivery(1) + FLOW_CONTROL + delivery(2)
    for reads in splits(data):
        reader = Reader(INBOX, b"g1")
        for chunk in reads:
            reader.feed(chunk)
        assert reader.out == [b"PUB $JS.FC.g1.5PLrtnUn.udLj 0\r\n\r\n"]
        assert (reader.received, reader.whole, reader.flow_controls) == (2, True, 1)


def test_a_stalled_flow_control_named_by_a_heartbeat_is_answered() -> None:
    reader = Reader(INBOX, b"g1")
    reader.feed(STALLED)
    assert reader.out == [b"PUB $JS.FC.g1.5PLrtnUn.abcd 0\r\n\r\n"]
    plain = STALLED.replace(b"Nats-Consumer-Stalled: $JS.FC.g1.5PLrtnUn.abcd\r\n", b"")
    plain = plain.replace(b"123 123", b"75 75")
    reader = Reader(INBOX, b"g1")
    reader.feed(plain)
    assert reader.out == [] and reader.pos == len(plain)


# --- the System ----------------------------------------------------------------------------------


def test_not_installed_says_skipped(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    assert JetStream().available() == "skipped: nats-server not installed (make bench-peers)"


def test_command_and_version(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    fake = tmp_path / "nats-server"
    fake.write_text("#!/bin/sh\necho 'nats-server: v2.9.10'\n")
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", str(tmp_path) + os.pathsep + os.environ.get("PATH", ""))
    js = JetStream()
    assert js.available() is None
    assert (js.name, js.proto, js.loadgen) == ("jetstream", "jetstream", "bench.jsload")
    assert js.version() == "2.9.10"
    js.workdir, js.port = tmp_path / "w", 4222
    cmd = js.command()
    assert cmd[:5] == ["nats-server", "-a", "127.0.0.1", "-p", "4222"] and "-js" in cmd
    assert cmd[cmd.index("-sd") + 1] == str(tmp_path / "w" / "jetstream")


# --- deliveries a block at a time ----------------------------------------------------------------


def deliveries(seqs: list[int], size: int = 100, pending: int = 1000) -> bytes:
    """Deliveries as a replay sends them: the pending count in the reply subject shrinks,
    so the header loses a digit on the way (at 999), as the server's do."""
    out = []
    for n, seq in enumerate(seqs):
        reply = b"$JS.ACK.g1.5PLrtnUn.1.%d.%d.1795956407730288342.%d" % (seq, seq, pending - n)
        payload = U64.pack(seq) + b"x" * (size - 8)
        out.append(b"MSG g1 2 %s %d\r\n%s\r\n" % (reply, size, payload))
    return b"".join(out)


def read_in(data: bytes, step: int) -> Reader:
    reader = Reader(INBOX, b"g1")
    for i in range(0, len(data), step):
        reader.feed(data[i : i + step])
    return reader


@pytest.mark.parametrize("step", [1, 97, 1000, 4096, 1 << 20])
def test_a_long_run_counted_whole_across_header_and_size_changes(step: int) -> None:
    # A header a digit shorter at seq 2, a size change at 300, a flow-control request.
    data = deliveries(list(range(1, 300))) + FLOW_CONTROL + deliveries([300, 301], 20)
    data += deliveries(list(range(302, 500)))
    reader = read_in(data, step)
    assert (reader.received, reader.whole, reader.first_seq) == (499, True, 1)
    assert reader.out == [b"PUB $JS.FC.g1.5PLrtnUn.udLj 0\r\n\r\n"]
    assert reader.pos == len(reader.buf)


@pytest.mark.parametrize("step", [1, 1000, 1 << 20])
@pytest.mark.parametrize("at", [5, 40, 150, 250])
def test_a_gap_or_a_repeat_in_a_long_run_is_not_whole(step: int, at: int) -> None:
    seqs = list(range(1, 301))
    for broken in (seqs[:at] + seqs[at + 1 :], [*seqs[:at], seqs[at], *seqs[at:]]):
        reader = read_in(deliveries(broken), step)
        assert reader.received == len(broken) and not reader.whole, (at, step)


def test_a_longer_last_frame_in_a_block_is_walked_not_skipped() -> None:
    # Headers of one length throughout. The first frame is walked, then blocks of BLOCK:
    # the second ends with frame 2 * BLOCK, one payload byte longer, which only the size in
    # its header says.
    seqs = list(range(1000, 1200))
    last = 2 * jsload.BLOCK
    data = deliveries(seqs[:last], pending=5000)
    data += deliveries(seqs[last : last + 1], 101, pending=5000 - last)
    data += deliveries(seqs[last + 1 :], pending=5000 - last - 1)
    reader = read_in(data, 1 << 20)
    assert (reader.received, reader.whole) == (200, True)


# --- the roles against a scripted server ---------------------------------------------------------


class ScriptedServer:
    """Just enough of nats-server -js for one jsload connection, on a loopback port: INFO,
    PONG, the API replies, PubAcks held until the client stops sending (so a window fills),
    and for a consumer, deliveries with a flow-control request halfway that must be
    answered before the rest are sent."""

    def __init__(self, deliveries: int = 0) -> None:
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.deliveries = deliveries
        self.outstanding = self.most_outstanding = self.acked = 0
        self.replies: list[bytes] = []
        self.api: list[bytes] = []
        self.answered_fc = threading.Event()
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        try:
            with self.listener:
                conn, _ = self.listener.accept()
            with conn:
                self._talk(conn)
        except BaseException as exc:  # reported by the test, not lost in the thread
            self.error = exc

    def _talk(self, conn: socket.socket) -> None:
        conn.sendall(b'INFO {"server_id":"x","version":"2.9.10","headers":true}\r\n')
        buf = b""
        while True:
            conn.settimeout(0.005 if self.outstanding else None)
            try:
                chunk = conn.recv(65536)
            except TimeoutError:  # the client waits for acks: all of them now
                acks = b"".join(
                    b'MSG %s 1  24\r\n{"stream":"g1", "seq":%d}\r\n' % (r, i)
                    for i, r in enumerate(self.replies, self.acked + 1)
                )
                self.acked += self.outstanding
                self.outstanding, self.replies = 0, []
                conn.sendall(acks)
                continue
            if not chunk:
                return
            buf += chunk
            while b"\r\n" in buf:
                line, rest = buf.split(b"\r\n", 1)
                words = line.split()
                if words[0] == b"PUB":
                    size = int(words[-1])
                    if len(rest) < size + 2:
                        break
                    payload, buf = rest[:size], rest[size + 2 :]
                    reply = words[2] if len(words) == 4 else b""
                    self._pub(conn, words[1], reply, payload)
                    continue
                buf = rest
                if words[0] == b"PING":
                    conn.sendall(b"PONG\r\n")

    def _pub(self, conn: socket.socket, subject: bytes, reply: bytes, payload: bytes) -> None:
        if subject.startswith(b"$JS.API."):
            self.api.append(subject)
            body = json.dumps({"type": "io.nats.jetstream.api.v1.response"}).encode()
            conn.sendall(b"MSG %s 1 %d\r\n%s\r\n" % (reply, len(body), body))
            if b"CONSUMER.CREATE" in subject:
                deliver = json.loads(payload)["config"]["deliver_subject"].encode()
                half = self.deliveries // 2
                conn.sendall(deliveries(list(range(1, half + 1))))
                conn.sendall(FLOW_CONTROL.replace(b"_DLV.2c8721481a10", deliver))
            return
        if subject.startswith(b"$JS.FC."):
            self.answered_fc.set()
            half = self.deliveries // 2
            conn.sendall(deliveries(list(range(half + 1, self.deliveries + 1)), pending=500))
            return
        assert subject == b"g1" and reply, (subject, reply)
        self.replies.append(reply)
        self.outstanding += 1
        self.most_outstanding = max(self.most_outstanding, self.outstanding)


def run_role(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], *argv: str
) -> dict[str, Any]:
    return roles.run_role(jsload.main, monkeypatch, capsys, *argv)


def test_pub_keeps_at_most_its_window_without_a_puback(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    server = ScriptedServer()
    result = run_role(
        monkeypatch, capsys, "pub", "--port", str(server.port), "--stream", "g1",
        "--count", "1000", "--window", "64", "--size", "100",
    )  # fmt: skip
    server.thread.join(5)
    assert server.error is None
    assert (result["sent"], result["confirmed"], server.acked) == (1000, 1000, 1000)
    assert server.most_outstanding == 64
    assert server.api == [b"$JS.API.STREAM.CREATE.g1"]
    assert result["end_ns"] > result["start_ns"]


def test_sub_replay_makes_its_consumer_at_go_and_answers_flow_control(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    server = ScriptedServer(deliveries=400)
    result = run_role(
        monkeypatch, capsys, "sub", "--port", str(server.port), "--stream", "g1",
        "--count", "400", "--replay", "--idle-timeout", "5",
    )  # fmt: skip
    server.thread.join(5)
    assert server.error is None and server.answered_fc.is_set()
    assert server.api == [b"$JS.API.STREAM.CREATE.g1", b"$JS.API.CONSUMER.CREATE.g1"]
    assert (result["received"], result["whole"], result["first_seq"]) == (400, True, 1)
    assert result["flow_controls"] == 1
    assert result["start_ns"] <= result["first_ns"] <= result["last_ns"]
