"""The store lock: one holder at a time, refused with the holder's pid, released for the next."""

from __future__ import annotations

import os
import re
import stat
from pathlib import Path

import pytest

from fqbroker.errors import StoreInUse
from fqbroker.settings.broker import Settings
from fqbroker.storage.lock import LOCK_NAME, StoreLock, held, lock_files


def test_a_second_lock_on_the_file_is_refused_naming_the_holder(tmp_path: Path) -> None:
    path = tmp_path / LOCK_NAME
    first = StoreLock(path, "var/queues")
    assert first.held and stat.S_IMODE(path.stat().st_mode) == 0o600
    assert path.read_text() == f"{os.getpid()}\n"
    # A new open file description: flock sees another holder, even in this process.
    with pytest.raises(StoreInUse) as refused:
        StoreLock(path, "var/queues")
    assert refused.value.pid == os.getpid()
    assert str(refused.value) == (
        f"var/queues is in use by another fqd (pid {os.getpid()}): give this one its own"
        " data directory (--data-dir, or -c and -q) or stop the other"
    )
    assert isinstance(refused.value, OSError)  # fqd's exit status 1, a failure to run
    first.release()
    assert not first.held
    first.release()  # twice is harmless
    second = StoreLock(path, "var/queues")
    assert second.held
    second.release()


def test_a_stale_pid_in_the_file_takes_nothing(tmp_path: Path) -> None:
    path = tmp_path / LOCK_NAME
    path.write_text("999999999\n")  # a holder long gone: its lock went with it
    lock = StoreLock(path, "q")
    assert path.read_text() == f"{os.getpid()}\n"
    lock.release()


def test_a_file_without_a_pid_is_refused_with_pid_unknown(tmp_path: Path) -> None:
    path = tmp_path / LOCK_NAME
    first = StoreLock(path, "q")
    path.write_text("")  # the holder took the lock and has not written its pid yet
    with pytest.raises(StoreInUse, match=r"q is in use by another fqd \(pid unknown\)"):
        StoreLock(path, "q")
    first.release()


def test_held_locks_queue_dir_and_config_db_and_lets_go(tmp_path: Path) -> None:
    settings = Settings(config_db=tmp_path / "etc" / "fqd.sqlite", queue_dir=tmp_path / "queues")
    (tmp_path / "etc").mkdir()
    (tmp_path / "queues").mkdir()
    files = [path for path, _what in lock_files(settings)]
    assert files == [tmp_path / "queues" / LOCK_NAME, tmp_path / "etc" / "fqd.sqlite.lock"]
    with held(settings):
        for path, what in lock_files(settings):
            with pytest.raises(StoreInUse, match=re.escape(what)):
                StoreLock(path, what)
    with held(settings):
        pass  # released on leaving


def test_held_keeps_nothing_when_one_is_refused(tmp_path: Path) -> None:
    settings = Settings(config_db=tmp_path / "fqd.sqlite", queue_dir=tmp_path / "queues")
    (tmp_path / "queues").mkdir()
    config_lock = StoreLock(tmp_path / "fqd.sqlite.lock", "config database")
    what = re.escape(f"config database {tmp_path / 'fqd.sqlite'}")
    with pytest.raises(StoreInUse, match=what), held(settings):
        pass
    # The queue directory's lock, taken first, went back.
    StoreLock(tmp_path / "queues" / LOCK_NAME, "q").release()
    config_lock.release()
