"""The short storm of ``make test``: bench/storm.py against one broker child.

2,000 connections held at once (1,000 fq clients, command and data socket each), then 100
clients connecting, binding, publishing and disconnecting for 10 s. Every round trip
through every front end succeeds meanwhile, the broker stays up with no traceback, and its
descriptors and RSS come back. ``make storm`` is the full size (docs/reliability.md).
"""

from __future__ import annotations

import json
from pathlib import Path

from bench import storm


async def test_short_storm(tmp_path: Path) -> None:
    args = storm.parser().parse_args(
        ["--connections", "2000", "--hold-seconds", "2", "--clients", "100", "--seconds", "10",
         "--state", str(tmp_path / "storm")]
    )  # fmt: skip
    result = await storm.run(args)
    storm.print_summary(result)
    assert result["opened"] == 2000
    assert result["cycles"] > 100
    assert result["failures"] == [], json.dumps(result, indent=1)
