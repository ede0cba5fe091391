"""Settings: the shipped conf/fqd.toml documents every setting with its default."""

from __future__ import annotations

from dataclasses import fields
from pathlib import Path

import pytest

from fqbroker.cli import settings_from_args
from fqbroker.config import Settings, Upstream, resolve_node_id

CONF = Path(__file__).resolve().parent.parent / "conf" / "fqd.toml"


def test_shipped_config_lists_every_setting_with_its_default() -> None:
    text = CONF.read_text()
    for f in fields(Settings):
        assert f"{f.name} = " in text or f"# {f.name} = " in text, f.name
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
