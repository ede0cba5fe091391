"""Where fqd keeps its state when not told, and the sample configuration it ships.

The data directory holds the config database (``fqd.sqlite``) and the queue directory
(``queues/``) unless either is set on its own. Its default depends on how fqd runs
(docs/cli.md, "The data directory"): ``$STATE_DIRECTORY`` (systemd's ``StateDirectory=``,
the first one when the unit names several), ``./var`` at the top of a source checkout,
else ``$XDG_STATE_HOME/fqbroker``, so an installed fqd never litters the directory it
was started from.
"""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["CONFIG_DB_NAME", "QUEUE_DIR_NAME", "default_data_dir", "sample_config"]

CONFIG_DB_NAME = "fqd.sqlite"
QUEUE_DIR_NAME = "queues"


def default_data_dir(environ: os._Environ[str] | dict[str, str] | None = None) -> Path:
    """The data directory fqd uses when neither ``data_dir`` nor ``--data-dir`` says."""
    env = os.environ if environ is None else environ
    # systemd joins several StateDirectory= entries with colons.
    state = env.get("STATE_DIRECTORY", "").split(":")[0]
    if state:
        return Path(state)
    if Path("pyproject.toml").is_file() and Path("fqbroker").is_dir():
        return Path("var")
    xdg = env.get("XDG_STATE_HOME", "")
    # The XDG spec says a relative value is invalid and is to be ignored.
    if xdg and os.path.isabs(xdg):
        return Path(xdg) / "fqbroker"
    home = env.get("HOME", "")
    if not home:
        try:
            home = str(Path.home())
        except RuntimeError:  # no HOME and no passwd entry (a bare container's user)
            raise ValueError(
                "no home directory for the default data directory: set data_dir or --data-dir"
            ) from None
    return Path(home) / ".local" / "state" / "fqbroker"


def sample_config() -> str:
    """The annotated sample configuration shipped in the package (``fqd --print-config``)."""
    # Imported here: importlib.resources brings tempfile, shutil and random, memory a
    # running broker does not need (bench/RESULTS.md, the idle row).
    from importlib import resources

    return resources.files("fqbroker").joinpath("data", "fqd.toml").read_text(encoding="utf-8")
