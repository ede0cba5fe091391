"""A second broker beside the first, as the README's "Running a second broker" and
"Troubleshooting" say: the same port is refused in one line, a port and a data directory
of its own run beside it."""

from __future__ import annotations

from pathlib import Path

from tests.procs import Proc


async def test_a_second_broker_on_the_same_port_is_one_line_and_its_own_runs(
    tmp_path: Path,
) -> None:
    (tmp_path / "a").mkdir()
    first, port = await Proc.start_fqd(tmp_path / "a")
    procs = [first]
    try:
        clash = await Proc.start(
            "-m", "fqbroker", "-p", str(port), "-n", "10.254.254.2",
            "--data-dir", str(tmp_path / "clash"),
        )  # fmt: skip
        procs.append(clash)
        status, _, err = await clash.finish()
        assert status != 0
        assert "address already in use" in err and "Traceback" not in err, err
        assert len(err.strip().splitlines()) == 1, err

        second = await Proc.start(
            "-m", "fqbroker", "-p", "0", "-n", "10.254.254.3", "--data-dir", str(tmp_path / "b")
        )
        procs.append(second)
        line = await second.wait_stderr("Listening on port: ")
        assert int(line.rsplit(" ", 1)[1]) != port
        assert (tmp_path / "b" / "fqd.sqlite").exists()  # its state apart from the first's
        assert first.proc.returncode is None
    finally:
        for proc in procs:
            proc.kill()
            await proc.proc.wait()
