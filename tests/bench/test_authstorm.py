"""The short authenticated storm of ``make test``: bench/authstorm.py against broker children.

100 clients as 100 users log in at once (a PBKDF2 check each), then reconnect for 2 s with
passwords the broker verified before; the same against auth = "none". No connection is
refused and no broker logs a traceback. ``make authstorm`` is the full size (500 clients).
"""

from __future__ import annotations

import json
from pathlib import Path

from bench import authstorm


async def test_short_authenticated_storm(tmp_path: Path) -> None:
    args = authstorm.parser().parse_args(
        ["--clients", "100", "--users", "100", "--seconds", "2", "--state", str(tmp_path)]
    )
    result = await authstorm.run(args)
    authstorm.print_summary(result)
    assert [m["auth"] for m in result["modes"]] == ["password", "none"]
    assert all(m["cycles"] > 100 for m in result["modes"])
    assert result["failures"] == [], json.dumps(result, indent=1)
