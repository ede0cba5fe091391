"""fqd's checkpoint endpoints: /add_checkpoint, /remove_checkpoint, /reset_to_checkpoint.

Their parameters are in the query string, as fqd's are (docs/fq-protocol.md §4.2); unlike
fqd's they take POST only (endpoints.py answers GET with a 405), so that a link or an
image on some web page cannot move a checkpoint (docs/security.md). The work is done by
:mod:`fqbroker.storage.configdb.checkpoints`, which the admin API's checkpoints share.
"""

from __future__ import annotations

import json
from typing import Final
from urllib.parse import parse_qs

from fqbroker.frontends.http.host import QueueSource
from fqbroker.storage.configdb import checkpoints

__all__ = ["PATHS", "respond"]

PATHS: Final = frozenset({"/add_checkpoint", "/remove_checkpoint", "/reset_to_checkpoint"})


def respond(broker: QueueSource, path: str, query: str) -> bytes:
    """The JSON body of the answer, always with status 200, as fqd's."""
    params = {k: v[0] for k, v in parse_qs(query, keep_blank_values=True).items()}
    cpname, qname = params.get("cpname"), params.get("qname")
    try:
        # fqd dereferences NULL here and dies; a missing name is an ordinary error.
        if not cpname:
            raise checkpoints.CheckpointError("'cpname' parameter is required")
        if not qname:
            raise checkpoints.CheckpointError("'qname' parameter is required")
        if path == "/add_checkpoint":
            text = checkpoints.add_checkpoint(broker, cpname, qname, params.get("chkptid", ""))
        elif path == "/remove_checkpoint":
            text = checkpoints.remove_checkpoint(broker, cpname, qname)
        else:
            text = checkpoints.reset_to_checkpoint(broker, cpname, qname)
        status = "success"
    except checkpoints.CheckpointError as exc:
        text, status = exc.message, "error"
    # fqd answers 200 either way and puts the outcome in "status"
    # (docs/fq-protocol.md §4.2).
    body = json.dumps({"status": status, "message": text}, indent=1, ensure_ascii=False)
    return body.encode() + b"\n"
