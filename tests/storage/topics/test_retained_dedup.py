"""A retained topic drops an opted-in publisher's repeats as a disk queue does, its window
read back from its log after a restart; other publishers' ids are never looked at."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from fqbroker.core import dedup
from fqbroker.core.dedup import DedupLimits
from fqbroker.core.frames import encode_peer
from tests.storage.topics.test_retained import figg_settings, harness, payloads_of, read_all


def frame(n: int) -> bytes:
    return encode_peer(b"figg", b"t", n.to_bytes(16, "big"), b"pub", b"", b"m%d" % n)


@pytest.fixture
def opted_in() -> Iterator[None]:
    dedup.enter(DedupLimits())
    try:
        yield
    finally:
        dedup.leave()


async def test_a_topic_keeps_one_copy_across_a_restart(tmp_path: Path, opted_in: None) -> None:
    settings = figg_settings(tmp_path)
    async with harness(settings) as h:
        assert h.topics.sink.offer([frame(1), frame(2), frame(1)]) == 3
        h.flush()
        await h.durable(b"t")
    async with harness(settings) as h:
        assert h.topics.sink.offer([frame(2), frame(3)]) == 2
        h.flush()
        topic = await h.durable(b"t")
        assert payloads_of(read_all(topic)) == [b"m1", b"m2", b"m3"]
        assert topic.store.window is not None and topic.store.window.duplicates == 1
        dedup.leave()
        h.topics.sink.offer([frame(3)])  # not opted in: kept
        h.flush()
        topic = await h.durable(b"t")
        assert payloads_of(read_all(topic)) == [b"m1", b"m2", b"m3", b"m3"]
