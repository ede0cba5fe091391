"""Opening a segment log's directory: its FORMAT file, its checkpoints file (created,
or converted from format 1's checkpoints.json), and the gaps recovery noted
(docs/disk-format.md, "Versioning" and "A damaged FORMAT or checkpoints").
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
from collections.abc import Callable
from pathlib import Path

from fqbroker.errors import LogFormatError
from fqbroker.storage.files import FILE_MODE
from fqbroker.storage.segments.checkpoints import CheckpointFile, Unreadable, encode_points
from fqbroker.storage.segments.records import (
    FORMAT_GAPS,
    FORMAT_LINE,
    FORMAT_V1,
    HEADER,
    HEADER_SIZE,
    MAX_PAYLOAD,
    SEGMENT_NAME,
    check,
    fsync_path,
    write_file,
)

__all__ = ["check_format", "known_gaps", "note_gap", "open_checkpoints"]

logger = logging.getLogger("fqbroker.storage.segments.log")  # one logger for everything a log says

CHECKPOINTS = "checkpoints"
_CHECKPOINTS_V1 = "checkpoints.json"
SKIPPED = "skipped"  # the gaps recovery left, one "first stop" line each: reported once
_FORMAT_WORDS = re.compile(r"fqbroker-segmentlog (\d+)")

# (file, offset, reason, bytes dropped): a problem reported as an error
Report = Callable[[str, int, str, int], None]


def check_format(directory: Path, error: Report) -> int | None:
    """The format version of the log, or None for a new one. A missing or damaged
    FORMAT file is rewritten if the segments are recognisably a segment log's."""
    path = directory / "FORMAT"
    try:
        found: str | None = path.read_text(encoding="utf-8", errors="replace")
    except FileNotFoundError:
        found = None
    if found is not None:
        m = _FORMAT_WORDS.fullmatch(found.strip())
        if m is not None:
            version = int(m[1])
            if version not in (1, 2, 3):
                raise LogFormatError(
                    f"{directory} holds format {found.strip()!r}; this fqbroker "
                    f"reads {FORMAT_LINE.strip()!r} and {FORMAT_GAPS.strip()!r} (and "
                    f"converts {FORMAT_V1.strip()!r})"
                )
            return version
    has_v2 = (directory / CHECKPOINTS).exists()
    has_v1 = (directory / _CHECKPOINTS_V1).exists()
    segs = sorted(p for p in directory.iterdir() if SEGMENT_NAME.fullmatch(p.name))
    if found is None and not (segs or has_v1 or has_v2):
        return None
    what = "missing" if found is None else f"damaged ({found[:40]!r})"
    if not _recognisable(segs):
        raise LogFormatError(
            f"{directory}: FORMAT file {what}, and the segments do not start with "
            "segment log records: not opened, nothing changed"
        )
    version = 1 if has_v1 and not has_v2 else 2
    if version == 2 and (directory / SKIPPED).exists():
        version = 3  # it has gaps: a format 2 reader must keep refusing it
    reason = f"FORMAT file {what}; rewritten (the files are a segment log's)"
    error("FORMAT", 0, reason, 0)
    if version > 1:  # a format 1 log gets it from its conversion
        write_format(directory, FORMAT_GAPS if version == 3 else FORMAT_LINE)
    return version


def write_format(directory: Path, line: str) -> None:
    tmp = directory / "FORMAT.tmp"
    write_file(tmp, line.encode(), fsync=True)
    os.replace(tmp, directory / "FORMAT")
    fsync_path(directory)


def known_gaps(directory: Path) -> set[tuple[int, int]]:
    """The gaps recovery left and noted, so that they are not reported again."""
    try:
        text = (directory / SKIPPED).read_text(encoding="ascii", errors="replace")
    except FileNotFoundError:
        return set()
    known = set()
    for line in text.splitlines():
        with contextlib.suppress(ValueError):
            lo, stop = map(int, line.split())
            known.add((lo, stop))
    return known


def note_gap(directory: Path, lo: int, stop: int) -> None:
    """Note a gap in ``skipped``, durably, before recovery makes it."""
    fd = os.open(directory / SKIPPED, os.O_WRONLY | os.O_CREAT | os.O_APPEND, FILE_MODE)
    try:
        os.write(fd, f"{lo} {stop}\n".encode())
        os.fsync(fd)
    finally:
        os.close(fd)


def open_checkpoints(directory: Path, version: int | None, error: Report) -> CheckpointFile:
    """The log's checkpoints file; a new log's, or a format 1 log's converted, with FORMAT."""
    path = directory / CHECKPOINTS
    if version in (2, 3):
        try:
            ckpt = CheckpointFile.open(path)
        except FileNotFoundError:
            error(CHECKPOINTS, 0, "checkpoints file missing", 0)
        except Unreadable as exc:
            size = path.stat().st_size
            error(CHECKPOINTS, 0, f"unreadable checkpoints ({exc})", size)
        else:
            if ckpt.repaired:
                error(CHECKPOINTS, 0, ckpt.repaired, 0)
            _remove_v1_checkpoints(directory)  # a conversion stopped just before this
            return ckpt
        return CheckpointFile.create(path, {})
    # New, or format 1. FORMAT is written last, so a log whose FORMAT says 2 always has
    # its checkpoints file; until then checkpoints.json is the one that counts.
    ckpt = CheckpointFile.create(path, _load_v1_checkpoints(directory, error) if version else {})
    try:
        write_format(directory, FORMAT_LINE)
    except BaseException:
        ckpt.close()
        raise
    if version:
        logger.warning(
            "%s: converted from %r to %r: checkpoints %s moved from %s to %s",
            directory, FORMAT_V1.strip(), FORMAT_LINE.strip(), dict(ckpt.points),
            _CHECKPOINTS_V1, CHECKPOINTS,
        )  # fmt: skip
        _remove_v1_checkpoints(directory)
    return ckpt


def _load_v1_checkpoints(directory: Path, error: Report) -> dict[str, int]:
    path = directory / _CHECKPOINTS_V1
    try:
        points = json.loads(path.read_bytes())["checkpoints"]
        if not all(isinstance(v, int) and 0 <= v < 1 << 64 for v in points.values()):
            raise ValueError("a position is not a sequence number")
        encode_points(points)  # ValueError for a name format 2 cannot hold
    except FileNotFoundError:
        return {}
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        size = path.stat().st_size
        error(_CHECKPOINTS_V1, 0, f"unreadable checkpoints ({exc})", size)
        return {}
    return dict(points)


def _remove_v1_checkpoints(directory: Path) -> None:
    for name in (_CHECKPOINTS_V1, _CHECKPOINTS_V1 + ".tmp"):
        (directory / name).unlink(missing_ok=True)


def _recognisable(paths: list[Path]) -> bool:
    """Whether segment files hold this format's records: some non-empty one starts with a
    record whose crc checks out and whose seq is the file's name (or all are empty)."""
    empty = True
    for path in paths:
        with path.open("rb") as f:
            head = f.read(HEADER_SIZE)
            if not head:
                continue
            empty = False
            if len(head) < HEADER_SIZE:
                continue
            crc, n, seq = HEADER.unpack(head)
            payload = f.read(min(n, MAX_PAYLOAD))
        if seq == int(path.name[:20]) and len(payload) == n and check(head + payload, 0, crc, n):
            return True
    return empty
