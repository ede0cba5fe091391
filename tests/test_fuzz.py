"""The short fuzz run of ``make test``: bench/fuzz.py against one broker child.

20,000 generated and mutated frames over every front end of bench/frontends.py, a round
trip through each front end every 2,000 frames, RSS and descriptors flat, no traceback in
the broker's log. The seed is random and printed: a failure names the seed that replays it
(``python -m bench.fuzz --frames 20000 --check-every 2000 --seed N``). ``make fuzz`` is the
long run (docs/reliability.md).
"""

from __future__ import annotations

import json
import random
from pathlib import Path

from bench import fuzz
from bench.frontends import FRONT_ENDS, mutate_bytes


async def test_short_fuzz_run_finds_nothing(tmp_path: Path) -> None:
    args = fuzz.parser().parse_args(
        ["--frames", "20000", "--check-every", "2000", "--max-seconds", "120",
         "--state", str(tmp_path / "fuzz")]
    )  # fmt: skip
    result = await fuzz.run(args)
    fuzz.print_summary(result)
    assert result["frames"] >= 20_000
    assert set(result["round_trips"]) == {fe.name for fe in FRONT_ENDS}
    assert result["failures"] == [], json.dumps(result, indent=1)


def test_sessions_replay_byte_for_byte() -> None:
    """What makes a finding reproducible: a seed gives the same frames and mutations."""
    for fe in FRONT_ENDS:
        runs = []
        for _ in range(2):
            rng = random.Random(1234)
            runs.append([fe.mutate(rng, fe.frame(rng)) for _ in range(50)])
        assert runs[0] == runs[1], fe.name


def test_mutations_change_frames_and_stay_bounded() -> None:
    rng = random.Random(7)
    frame = bytes(range(64))
    outs = [mutate_bytes(rng, frame) for _ in range(1000)]
    assert sum(out != frame for out in outs) > 950
    assert max(map(len, outs)) <= 64 * 1024
