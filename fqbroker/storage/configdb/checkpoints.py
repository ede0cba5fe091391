"""Named checkpoints on permanent disk queues, as fqd's HTTP endpoints offer them
(docs/fq-protocol.md §4.2).

A checkpoint is a named reader position in a disk queue. Positions are written
``LOG:MARKER`` as fq writes jlog positions; ours map to the queue's 64-bit sequence
number as ``LOG << 32 | MARKER``, the same two halves a delivered message id carries in
its bytes 8-15. fqd crashes on a missing name and never releases what it read; here every
failure is a :class:`CheckpointError` with fqd's text.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Protocol

from fqbroker.core.queue import Queue
from fqbroker.core.queuespec import QueueKind
from fqbroker.errors import CheckpointError
from fqbroker.storage.store import disk_log, rewind_queue

__all__ = [
    "RESERVED",
    "CheckpointError",
    "add_checkpoint",
    "remove_checkpoint",
    "reset_to_checkpoint",
]

RESERVED = "fq"  # the broker's own reader
_POSITION = re.compile(r"([0-9]*):([0-9]*)")


class QueueSource(Protocol):
    """What the checkpoints need of the broker: its queues by name."""

    @property
    def queues(self) -> Mapping[bytes, Queue]: ...


def parse_position(text: str) -> int:
    m = _POSITION.fullmatch(text)
    if m is None:
        raise CheckpointError("'chkptid' must be of format: [0-9]*:[0-9]*")
    log, marker = (int(part or "0") for part in m.groups())
    if log >= 1 << 32 or marker >= 1 << 32:
        raise CheckpointError("'chkptid' is out of range of the queue")
    return log << 32 | marker


def format_position(seq: int) -> str:
    return f"{seq >> 32}:{seq & 0xFFFFFFFF}"


def _disk_queue(broker: QueueSource, cpname: str, qname: str) -> Queue:
    if cpname == RESERVED:
        raise CheckpointError("'fq' is a reserved name, cannot be used for a checkpoint name")
    queue = broker.queues.get(qname.encode())
    if queue is None:
        raise CheckpointError(f"Cannot find registered queue '{qname}'")
    if not queue.permanent:
        raise CheckpointError("Checkpoints on ephemeral queues not supported")
    if queue.kind is not QueueKind.DISK:
        raise CheckpointError("Checkpoints on memory queues not supported")
    return queue


def add_checkpoint(broker: QueueSource, cpname: str, qname: str, chkptid: str) -> str:
    queue = _disk_queue(broker, cpname, qname)
    seq = parse_position(chkptid)
    log = disk_log(queue)
    if not log.first_seq <= seq <= log.next_seq:
        raise CheckpointError("'chkptid' is out of range of the queue")
    try:
        log.set_checkpoint(cpname, seq)
        # A replaying reader (the Spark source) moves only its named checkpoint, so this
        # is where the segments it is done with can go.
        log.trim()
    except (OSError, ValueError):  # ValueError: a name too long to store
        raise CheckpointError("Failed to set checkpoint") from None
    return "Checkpoint added"


def remove_checkpoint(broker: QueueSource, cpname: str, qname: str) -> str:
    queue = _disk_queue(broker, cpname, qname)
    log = disk_log(queue)
    if cpname not in log.checkpoints:
        raise CheckpointError("Checkpoint does not exist")
    log.remove_checkpoint(cpname)
    return "Checkpoint removed"


def reset_to_checkpoint(broker: QueueSource, cpname: str, qname: str) -> str:
    queue = _disk_queue(broker, cpname, qname)
    log = disk_log(queue)
    if cpname not in log.checkpoints:
        raise CheckpointError("Checkpoint does not exist")
    rewind_queue(queue, log.checkpoints[cpname])
    return f"'{qname}' reset to checkpoint '{cpname}'"
