"""Settings: the shipped conf/fqd.toml documents every setting with its default."""

from __future__ import annotations

from dataclasses import fields
from pathlib import Path

import pytest

from fqbroker.cli.fqd import settings_from_args
from fqbroker.frontends.figg.settings import Figg, topic_config
from fqbroker.server.frontends import FRONT_ENDS
from fqbroker.settings.broker import Settings, Upstream, resolve_node_id

CONF = Path(__file__).resolve().parents[2] / "conf" / "fqd.toml"


def test_shipped_config_lists_every_setting_with_its_default() -> None:
    text = CONF.read_text()
    for f in fields(Settings):
        if f.name == "sections":  # not a setting: the front ends' tables, each checked below
            continue
        assert f"{f.name} = " in text or f"# {f.name} = " in text, f.name
    for spec in FRONT_ENDS:
        if spec.settings is None:
            continue
        table = text[text.index(f"\n[{spec.settings.NAME}]\n") :]
        for f in fields(spec.settings):  # type: ignore[arg-type]
            listed = (f"\n{f.name} = ", f"\n# {f.name} = ", f"[{spec.settings.NAME}.{f.name}.")
            assert any(line in table for line in listed), (spec.name, f.name)
    assert Settings.from_toml(CONF) == Settings()


def test_flags_override_the_file(tmp_path: Path) -> None:
    conf = tmp_path / "fqd.toml"
    conf.write_text('[fqd]\nport = 9999\nnode_id = "10.1.2.3"\n')
    s = settings_from_args(["--config", str(conf), "-p", "0", "-c", "x.db", "-m", "a", "-D"])
    assert (s.port, s.node_id, s.config_db, s.modules) == (0, "10.1.2.3", Path("x.db"), ["a"])


def test_unknown_setting_is_an_error(tmp_path: Path) -> None:
    conf = tmp_path / "fqd.toml"
    conf.write_text("[fqd]\nprot = 1\n")
    with pytest.raises(ValueError, match="prot"):
        Settings.from_toml(conf)


@pytest.mark.parametrize(
    ("text", "packed"), [("10.254.254.1", b"\x0a\xfe\xfe\x01"), ("127.0.0.1", b"\x7f\x00\x00\x01")]
)
def test_node_id(text: str, packed: bytes) -> None:
    assert resolve_node_id(text) == packed


@pytest.mark.parametrize("text", ["0.0.0.0", "::1", "host"])
def test_bad_node_id(text: str) -> None:
    with pytest.raises(ValueError):
        resolve_node_id(text)


def test_upstream_tables(tmp_path: Path) -> None:
    conf = tmp_path / "fqd.toml"
    conf.write_text(
        '[fqd]\nport = 1\n\n[[upstream]]\nhost = "a"\nsource = "b//mem"\nexchange = "logs"\n'
        '\n[[upstream]]\nhost = "c"\nport = 9\nsource = "d/q/disk:permanent"\n'
        'password = "p"\nexchange = "x"\nprogram = "prefix:\\"a.\\""\npermanent_binding = true\n'
    )
    settings = Settings.from_toml(conf)
    assert settings.upstream == [
        Upstream("a", 8765, "b//mem", "", b"logs", b"", False),
        Upstream("c", 9, "d/q/disk:permanent", "p", b"x", b'prefix:"a."', True),
    ]


@pytest.mark.parametrize(
    ("table", "error"),
    [
        ('hots = "a"\nsource = "s"\nexchange = "e"', "hots"),
        ('host = "a"\nsource = "s"', "exchange"),
    ],
)
def test_bad_upstream_table(tmp_path: Path, table: str, error: str) -> None:
    conf = tmp_path / "fqd.toml"
    conf.write_text(f"[fqd]\n\n[[upstream]]\n{table}\n")
    with pytest.raises(ValueError, match=error):
        Settings.from_toml(conf)


def test_figg_table_and_flag(tmp_path: Path) -> None:
    conf = tmp_path / "fqd.toml"
    conf.write_text(
        '[fqd]\nport = 1\n[figg]\nlisten = "0.0.0.0:9000"\nretention_bytes = 4096\n'
        'idle_seconds = 5\n[figg.topics."audit"]\nretention_seconds = 60.5\n'
        '[figg.topics."big"]\nretention_bytes = 1099511627776\n'
    )
    s = Settings.from_toml(conf)
    figg = s.section(Figg)
    assert (figg.listen, figg.retention_bytes, figg.idle_seconds) == ("0.0.0.0:9000", 4096, 5)
    assert figg.address("127.0.0.1") == ("0.0.0.0", 9000)
    assert figg.retention(b"audit") == (4096, 60.5)
    assert figg.retention(b"big") == (1 << 40, figg.retention_seconds)
    assert figg.retention(b"other") == (4096, 7 * 86400)
    assert Settings().section(Figg).listen is None and Settings().section(Figg).address("h") is None
    flagged = settings_from_args(["--figg", "7000"]).section(Figg)
    assert flagged.address("10.0.0.1") == ("10.0.0.1", 7000)
    assert settings_from_args(["--figg", "[::1]:0"]).section(Figg).address("x") == ("::1", 0)
    # The flag overrides the file's listen and keeps the rest of its table.
    s = settings_from_args(["--config", str(conf), "--figg", "127.0.0.1:0"])
    assert (s.section(Figg).listen, s.section(Figg).retention_bytes) == ("127.0.0.1:0", 4096)
    empty = tmp_path / "empty.toml"
    empty.write_text('[fqd]\n[figg]\nlisten = ""\n')
    assert Settings.from_toml(empty).section(Figg).listen is None  # empty: off


def test_topics_fsync_policy_is_their_own(tmp_path: Path) -> None:
    """Topics commit back to back unless told otherwise, whatever disk queues do: every
    Figg publish waits for its ACK, which waits for the fsync."""
    from fqbroker.storage.store import FsyncPolicy
    from fqbroker.storage.topics.topic import Topic

    assert (Settings().fsync, Settings().section(Figg).fsync) == ("interval", "always")
    conf = tmp_path / "fqd.toml"
    conf.write_text('[fqd]\nfsync = "never"\n[figg]\nfsync = "interval"\n')
    settings = Settings.from_toml(conf)
    topic = Topic(b"t", tmp_path / "t", topic_config(settings))
    try:
        assert topic.store.policy is FsyncPolicy.INTERVAL
    finally:
        topic.close()
    topic = Topic(b"u", tmp_path / "u", topic_config(Settings()))
    try:
        assert topic.store.policy is FsyncPolicy.ALWAYS
    finally:
        topic.close()


@pytest.mark.parametrize(
    ("table", "message"),
    [
        ("lisen = 1", "unknown figg setting.*lisen"),
        ("retention_bytes = 0", "figg retention_bytes must be a positive integer"),
        ("retention_seconds = -1", "figg retention_seconds must be a positive number"),
        ('max_topics = "x"', "figg max_topics must be a positive integer"),
        ("segment_bytes = 100", "figg segment_bytes must be at least 4096"),
        ('exchange = ""', "figg exchange must be a string of 1 to 127 bytes"),
        ('listen = "host:port"', "figg listen 'host:port' is not HOST:PORT"),
        ('listen = "1:2:3"', "IPv6"),
        ("topics = 3", "figg topics must be a table"),
        ('[figg.topics."t"]\nretention = 1', "unknown figg setting.*topic 't'.*retention"),
        ('[figg.topics."t"]\nretention_bytes = -5', "topic 't' retention_bytes"),
        ('[figg.topics."t"]\nretention_seconds = true', "topic 't' retention_seconds"),
        ('fsync = "sometimes"', "figg fsync must be always, interval or never"),
    ],
)
def test_bad_figg_settings_are_clear_errors(tmp_path: Path, table: str, message: str) -> None:
    conf = tmp_path / "fqd.toml"
    conf.write_text(f"[fqd]\n[figg]\n{table}\n")
    with pytest.raises(ValueError, match=message):
        Settings.from_toml(conf)


def test_fqd_reports_a_bad_figg_setting_in_one_line(tmp_path: Path) -> None:
    import subprocess
    import sys

    from tests.procs import ENV

    done = subprocess.run(
        [sys.executable, "-m", "fqbroker", "--figg", "nope:x", "-q", str(tmp_path)],
        env=ENV, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert done.returncode != 0
    assert "figg listen 'nope:x' is not HOST:PORT" in done.stderr
    assert "Traceback" not in done.stderr


def test_http_hosts_from_the_file(tmp_path: Path) -> None:
    conf = tmp_path / "fqd.toml"
    conf.write_text('[fqd]\nhttp_hosts = ["broker.example.com", "*"]\n')
    assert Settings.from_toml(conf).http_hosts == ["broker.example.com", "*"]
    for bad in ('"broker.example.com"', "[1]", '[""]'):
        conf.write_text(f"[fqd]\nhttp_hosts = {bad}\n")
        with pytest.raises(ValueError, match="http_hosts"):
            Settings.from_toml(conf)
