"""Run every benchmark, or those named: python -m bench [routing ...]."""

from __future__ import annotations

import importlib
import sys

BENCHES = ["routing", "disk"]


def main(argv: list[str]) -> int:
    names = argv or BENCHES
    for name in names:
        if name not in BENCHES:
            print(f"unknown benchmark {name!r}; known: {', '.join(BENCHES)}", file=sys.stderr)
            return 2
        module = importlib.import_module(f"bench.{name}")
        print(f"== {name}: {module.__doc__.strip().splitlines()[0]}")
        module.main()
        print()
    return 0


sys.exit(main(sys.argv[1:]))
