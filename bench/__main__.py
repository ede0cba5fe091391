"""Run the suite and print one table, or only the scenarios named.

    python -m bench [--runs N] [--scale F] [--no-peers] [--baseline TREE]
                    [--flame DIR [--native]] [SCENARIO ...]

The scenarios of the table, and the micro benchmarks outside it (routing, disk-inproc,
file-reads, permissions, idle-floor, logins): docs/bench.md.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from pathlib import Path

from .flame import py_spy
from .harness import exit_on_signals
from .suite import SCENARIOS, Config, run

MICRO = {
    "routing": "bench.routing",
    "disk-inproc": "bench.disk",
    "file-reads": "bench.filereads",
    "permissions": "bench.permscost",
    "idle-floor": "bench.idlefloor",
    "logins": "bench.logins",
}


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="python -m bench", description=__doc__.split("\n")[0])
    p.add_argument("names", nargs="*", metavar="SCENARIO")
    p.add_argument("--runs", type=int, default=3, help="interleaved runs per figure (median)")
    p.add_argument("--scale", type=float, default=1.0, help="scale message counts (smoke: 0.01)")
    p.add_argument("--no-peers", action="store_true", help="fqbroker and the relay only")
    p.add_argument(
        "--baseline",
        type=Path,
        metavar="TREE",
        help="another fqbroker checkout (e.g. a git worktree of the commit before a change),"
        " measured in the same interleaved runs as the column 'before'",
    )
    p.add_argument(
        "--flame",
        type=Path,
        metavar="DIR",
        help="a py-spy flame graph of fqbroker in the last run of each flow scenario:"
        " DIR/SCENARIO.svg (bench/flames/README.md)",
    )
    p.add_argument(
        "--native",
        action="store_true",
        help="with --flame: C frames too (py-spy --native; pauses the broker at each sample),"
        " in DIR/SCENARIO-native.svg",
    )
    args = p.parse_args(argv)
    if args.flame is not None and py_spy() is None:
        print("--flame: py-spy not found (pip install py-spy)", file=sys.stderr)
        return 2
    if args.baseline is not None and not (args.baseline / "fqbroker" / "__main__.py").is_file():
        print(f"--baseline {args.baseline}: no fqbroker package there", file=sys.stderr)
        return 2
    names = args.names or SCENARIOS
    exit_on_signals()  # SIGTERM/SIGHUP: the runs' cleanup and harness.stop_all() still run
    for name in names:
        if name not in SCENARIOS and name not in MICRO:
            known = ", ".join([*SCENARIOS, *MICRO])
            print(f"unknown scenario {name!r}; known: {known}", file=sys.stderr)
            return 2
    for name in names:
        if name in MICRO:
            module = importlib.import_module(MICRO[name])
            print(f"== {name}: {module.__doc__.strip().splitlines()[0]}")
            module.main()
    table = [n for n in names if n in SCENARIOS]
    if table:
        cfg = Config(
            runs=args.runs,
            scale=args.scale,
            peers=not args.no_peers,
            baseline=args.baseline.resolve() if args.baseline else None,
            flame=args.flame.resolve() if args.flame else None,
            native=args.native,
        )
        print()
        print(run(table, cfg))
    return 0


sys.exit(main(sys.argv[1:]))
