"""The ``[figg]`` table: retained topics and the Figg listener's settings (docs/topics.md).

Declared here, beside the listener, and read by the shared parser
(:mod:`fqbroker.settings.section`).
Topics (:mod:`fqbroker.storage.topics.retained`) do not read it: :func:`topic_config` hands them
what they need.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fqbroker.settings.section import Section, check_positive, setting

if TYPE_CHECKING:
    from fqbroker.settings.broker import Settings
    from fqbroker.storage.topics.topic import TopicConfig

__all__ = ["Figg", "TopicRetention", "topic_config"]

_LISTEN = """\
Where Figg clients connect: "HOST:PORT", "[IPV6]:PORT", or "PORT" on the address of `bind`;
0 picks a free port. Empty: off (no topics either). `fqd --figg ADDR:PORT` sets it too."""
_EXCHANGE = """\
The fq exchange topics share: a Figg publish to topic T is an fq message on it with route
T, and fq messages published on it are appended to topic T."""
_RETENTION = """\
Retention, per topic: the oldest whole segments go while a topic holds more than
retention_bytes, and once a segment's newest message is older than retention_seconds. The
segment being written always stays. Segments are segment_bytes each."""
_MAX_TOPICS = "Topics the broker keeps; past it, messages to new topics are dropped and counted."
_MAX_FRAME = """\
A Figg frame whose payload is longer closes that connection; so does a connection that
sent nothing, not even a PING, and was sent no DATA, for idle_seconds."""
# "always" by default, where disk queues default to "interval": every Figg publish waits
# for its ACK, and an ACK waits for the fsync, so "interval" caps a client's window.
_FSYNC = """\
When topics fsync: "always" (the default here), "interval" (every fsync_interval_ms of
the [fqd] table) or "never", as for disk queues. Every Figg publish waits for its ACK, and
an ACK waits for this fsync: with "interval" a client's window of 256 messages allows at
most 256 per interval (~50k msg/s at 5 ms); "always" commits back to back, concurrent
writers sharing one fsync, with the same guarantee and an ACK about one fsync later."""
_TLS = "TLS: a PEM certificate chain, and its key (unset: the key is in the certificate's file)."
_FOOTER = """\
# Per-topic retention, where it differs from the above:
# [figg.topics."audit"]
# retention_bytes = 10737418240
# retention_seconds = 2592000.0
"""

_ANONYMOUS = """\
Under auth = "password" clients log in with TLS client certificates (tls_cert here, the
broker's tls_client_ca; the subject CN is the user). true: serve anyone who reaches the
port, no login, every right (fqd refuses to start otherwise when it cannot log them in)."""


@dataclass(frozen=True, slots=True)
class TopicRetention:
    """A ``[figg.topics."NAME"]`` table: one topic's retention, where it differs."""

    retention_bytes: int | None = None  # None: the [figg] table's
    retention_seconds: float | None = None

    @classmethod
    def from_table(cls, name: str, table: object) -> TopicRetention:
        if not isinstance(table, dict):
            raise ValueError(f"figg topic {name!r}: expected a table, not {table!r}")
        known = {f.name for f in fields(cls)}
        if unknown := set(table) - known:
            raise ValueError(
                f"unknown figg setting(s) for topic {name!r}: {', '.join(sorted(unknown))}"
            )
        made = cls(**table)
        if made.retention_bytes is not None:
            check_positive(f"figg topic {name!r} retention_bytes", made.retention_bytes)
        if made.retention_seconds is not None:
            check_positive(
                f"figg topic {name!r} retention_seconds", made.retention_seconds, (int, float)
            )
        return made


def _topics(value: Any) -> dict[str, TopicRetention]:
    if not isinstance(value, Mapping):
        raise ValueError("figg topics must be a table of tables")
    return {
        str(name): t if isinstance(t, TopicRetention) else TopicRetention.from_table(str(name), t)
        for name, t in value.items()
    }


@dataclass(frozen=True, slots=True)
class Figg(Section):
    """The ``[figg]`` table: retained topics and the Figg listener (docs/topics.md).

    Off while ``listen`` is None (or empty in the TOML file). Retention deletes a topic's
    oldest whole segments, never the one being written: while the topic holds more than
    ``retention_bytes``, and once a segment's newest record is older than
    ``retention_seconds``. ``topics`` overrides either for named topics.
    """

    NAME = "figg"
    TITLE = "Retained topics and the Figg listener (docs/topics.md)"
    PORT = 8119  # the Figg seed's, for a ``listen`` that names a host only
    FOOTER = _FOOTER

    listen: str | None = setting(
        None, "HOST:PORT, [V6]:PORT or PORT (on `bind`); empty: off, no topics", comment=_LISTEN
    )
    exchange: str = setting(
        "figg", "the fq exchange topics share (route = topic)", comment=_EXCHANGE
    )
    retention_bytes: int = setting(
        1 << 30, "a topic's oldest segments go while it holds more", comment=_RETENTION,
        positive=True,
    )  # fmt: skip
    retention_seconds: float = setting(
        7 * 86400, "a segment goes once its newest message is older", comment="", positive=True
    )
    segment_bytes: int = setting(
        16 << 20, "a topic's segment files: the unit retention deletes", comment="",
        positive=True,
    )  # fmt: skip
    max_topics: int = setting(
        10_000, "past it, messages to new topics are dropped", comment=_MAX_TOPICS, positive=True
    )
    max_frame: int = setting(
        16 << 20, "a longer frame payload closes the connection", comment=_MAX_FRAME,
        positive=True,
    )  # fmt: skip
    idle_seconds: float = setting(
        30.0,
        "a connection with no frame either way this long is closed",
        comment="",
        positive=True,
    )
    fsync: str = setting(
        "always", "topics' fsync: always, interval or never", comment=_FSYNC,
        choices=("always", "interval", "never"),
    )  # fmt: skip
    topics: Mapping[str, TopicRetention] = setting(
        factory=dict, doc='per-topic retention: `[figg.topics."NAME"]` tables', parse=_topics
    )
    tls_cert: Path | None = setting(  # noqa: RUF009 (a field, as dataclasses.field)
        None, "PEM certificate chain: TLS when set", comment=_TLS, example="/etc/fqd/figg.crt"
    )
    tls_key: Path | None = setting(  # noqa: RUF009 (a field, as dataclasses.field)
        None, "PEM private key; unset: in tls_cert's file", comment="",
        example="/etc/fqd/figg.key",
    )  # fmt: skip
    anonymous: bool = setting(
        False, 'under auth = "password": no login, anyone who reaches it', comment=_ANONYMOUS
    )

    def check(self) -> None:
        if not 0 < len(self.exchange.encode()) <= 127:
            raise ValueError("figg exchange must be a string of 1 to 127 bytes")
        if self.segment_bytes < 4096:
            raise ValueError(f"figg segment_bytes must be at least 4096, not {self.segment_bytes}")
        for name in self.topics:
            if not 0 < len(name.encode("utf-8", "surrogateescape")) <= 127:
                raise ValueError(f"figg topic name {name!r} must be 1 to 127 bytes")
        Section.check(self)

    def retention(self, topic: bytes) -> tuple[int, float]:
        """(bytes, seconds) a topic keeps: its own table's values, else the defaults."""
        own = self.topics.get(topic.decode("utf-8", "surrogateescape")) if self.topics else None
        if own is None:
            return self.retention_bytes, self.retention_seconds
        return (
            self.retention_bytes if own.retention_bytes is None else own.retention_bytes,
            self.retention_seconds if own.retention_seconds is None else own.retention_seconds,
        )


def topic_config(settings: Settings) -> TopicConfig:
    """What the broker's topics need of the settings: they read no section themselves."""
    figg = settings.section(Figg)
    # Imported here: the topic logs' code is no broker's without a Figg listener.
    from fqbroker.storage.topics.topic import TopicConfig

    return TopicConfig(
        directory=Path(settings.queue_dir) / "topics",
        exchange=figg.exchange.encode(),
        max_topics=figg.max_topics,
        segment_bytes=figg.segment_bytes,
        fsync=figg.fsync,
        fsync_interval_ms=settings.fsync_interval_ms,
        retention=figg.retention,
    )
