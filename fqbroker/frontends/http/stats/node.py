"""/node.json: what an operator asks first of a broker (no fqd counterpart).

Which fqbroker and fq versions run, as which node id, for how long, with how much
memory; how much disk the queue directory takes and how much is left; where each front
end listens; which upstreams it pulls from; and how admin requests are guarded, so the
web UI knows whether to offer its admin actions. A read, guarded like /stats.json.
"""

from __future__ import annotations

import asyncio
import json
import os
import platform
import resource
import shutil
import sys
import time
from pathlib import Path
from typing import Any

from fqbroker import accel
from fqbroker.core.message import hop_addresses
from fqbroker.frontends.http import auth
from fqbroker.frontends.http.host import HttpHost
from fqbroker.frontends.http.stats.frontends import front_end_snapshots
from fqbroker.frontends.http.stats.snapshot import disk_snapshot
from fqbroker.version import FQ_COMPAT_VERSION, __version__

__all__ = ["PATH", "node_json", "node_status", "render_node_json"]

PATH = "/node.json"


def rss_bytes() -> int | None:
    """The process's resident set now (``/proc/self/statm``), or its peak (getrusage) where
    /proc is missing."""
    try:
        with open("/proc/self/statm", "rb") as fh:
            return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        pass
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    # Linux and the BSDs count KiB, macOS bytes.
    return peak if sys.platform == "darwin" else peak * 1024


def disk_use(directory: Path) -> dict[str, Any]:
    """Bytes allocated under ``directory`` and what its filesystem has left (a thread's work).

    What it counts is the space allocated (``st_blocks``, as ``du`` does); files that vanish
    meanwhile are skipped.
    """
    used = files = 0
    for root, _dirs, names in os.walk(directory):
        for name in names:
            try:
                st = os.lstat(os.path.join(root, name))
            except OSError:
                continue  # a segment removed while we walked
            used += st.st_blocks * 512 if hasattr(st, "st_blocks") else st.st_size
            files += 1
    out: dict[str, Any] = {"queue_dir_bytes": used, "queue_dir_files": files}
    # The directory appears with the first disk queue: until then, the filesystem it will be on.
    where = directory.absolute()
    while not where.exists() and where != where.parent:
        where = where.parent
    try:
        usage = shutil.disk_usage(where)
        out["disk_total_bytes"], out["disk_free_bytes"] = usage.total, usage.free
    except OSError:
        out["disk_total_bytes"] = out["disk_free_bytes"] = None
    return out


def _admin_access(broker: HttpHost) -> str:
    """How admin paths are guarded: "open" (anyone is admin), "token" or "users"."""
    level = auth.needs(broker.settings, broker.users, admin_path=True)
    if level is auth.Level.OPEN:
        return "open"
    return "users" if broker.users is not None else "token"


def node_json(broker: HttpHost, disk: dict[str, Any], *, names: bool = True) -> dict[str, Any]:
    """The /node.json object, ``disk`` being what :func:`disk_use` found.

    Without ``names`` (a reader who may not see them, auth.sees_names) the file paths are
    "": where the queues and the password hashes live is no business of an anonymous
    reader or a scraper; so is an upstream's ``source``, the user it logs in as. The sizes
    and counts stay.
    """
    settings = broker.settings
    fronts = front_end_snapshots(broker)
    listeners: dict[str, dict[str, Any]] = {}
    for fe in fronts:
        if fe.host is None:
            continue
        address = f"{fe.host}:{fe.port}"
        # The main port carries fq's channels and HTTP: one listener, several front ends.
        entry = listeners.setdefault(
            address, {"name": "main" if fe.transport == "main" else fe.name, "address": address}
        )
        entry.setdefault("front_ends", []).append(fe.name)
        entry["transport"] = fe.transport
    peers = [
        {
            "host": link.address.host,
            "port": link.address.port,
            "source": link.address.source if names else "",  # a user name
            "state": str(link.state),
            "reconnects": link.reconnects,
            "exchanges": sorted({b.exchange.decode("utf-8", "replace") for b in link.wanted}),
        }
        for link in broker.peering.links.values()
    ]
    router = broker.router
    return {
        "version": __version__,
        "fq_version": FQ_COMPAT_VERSION,
        "node_id": hop_addresses(broker.node_id)[0],
        "hostname": platform.node(),
        "pid": os.getpid(),
        "python": platform.python_version(),
        "accelerator": accel.describe(),
        "uptime_seconds": round(time.monotonic() - broker.started, 3),
        "rss_bytes": rss_bytes(),
        "memory_budget_used": broker.budget.used,
        "memory_budget_limit": broker.budget.limit,
        "queue_dir": str(settings.queue_dir) if names else "",
        "config_db": str(settings.config_db) if names else "",
        **disk,
        "listeners": list(listeners.values()),
        "front_ends": [
            {
                "name": fe.name,
                "transport": fe.transport,
                "address": None if fe.host is None else f"{fe.host}:{fe.port}",
                "summary": fe.summary,
                "open": fe.counters.open,
            }
            for fe in fronts
        ],
        "peers": peers,
        "queues": len(broker.queues),
        "exchanges": len(router.exchanges),
        "bindings": sum(len(ex.bindings) for ex in router.exchanges.values()),
        "clients": len(broker.clients),
        "auth": settings.auth,
        "admin_access": _admin_access(broker),
        "reads_protected": settings.http_auth_reads,
        # The disk alarm (docs/reliability.md, "Disk alarm").
        "disk_alarm": disk_snapshot(broker).json(names=names),
    }


async def node_status(broker: HttpHost, *, names: bool = True) -> dict[str, Any]:
    """:func:`node_json`, the queue directory walked in a worker thread, so a directory of many
    queues on a slow disk never stalls the loop."""
    disk = await asyncio.to_thread(disk_use, Path(broker.settings.queue_dir))
    return node_json(broker, disk, names=names)


async def render_node_json(broker: HttpHost, *, names: bool = True) -> bytes:
    return json.dumps(await node_status(broker, names=names)).encode() + b"\n"
