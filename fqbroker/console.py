"""What every console script shares: ``--version``, ``--help`` with defaults, and bad
input answered in one line on stderr with a non-zero exit, never a traceback (unless
``FQBROKER_DEBUG=1`` in the environment asks for one)."""

from __future__ import annotations

import argparse
import os
import sys
import traceback
from collections.abc import Callable, Sequence

from fqbroker.version import FQ_COMPAT_VERSION, __version__

__all__ = ["EXIT_FAILURE", "EXIT_USAGE", "Parser", "run_script", "say_error", "version_text"]

EXIT_FAILURE = 1  # the work failed: a refused connection, a broker's error
EXIT_USAGE = 2  # bad input: a flag, a setting, a file (argparse's own code)
DEBUG_ENV = "FQBROKER_DEBUG"


def version_text(prog: str) -> str:
    """What ``--version`` prints: the script, fqbroker's version, the fq protocol's."""
    return f"{prog} (fqbroker {__version__}, fq protocol {FQ_COMPAT_VERSION})"


class _Formatter(argparse.ArgumentDefaultsHelpFormatter, argparse.RawDescriptionHelpFormatter):
    """Defaults shown in ``--help``; descriptions keep their line breaks."""


class Parser(argparse.ArgumentParser):
    """An ArgumentParser with ``--version`` and the defaults in ``--help``; its errors
    are one line (``prog: what``), exit 2."""

    def __init__(self, prog: str, **kwargs: object) -> None:
        kwargs.setdefault("formatter_class", _Formatter)
        super().__init__(prog=prog, **kwargs)  # type: ignore[arg-type]
        self.add_argument("--version", action="version", version=version_text(prog))

    def error(self, message: str) -> None:  # type: ignore[override]
        say_error(self.prog, message)
        sys.exit(EXIT_USAGE)


def say_error(prog: str, message: object) -> None:
    """One line on stderr: ``prog: message`` (newlines folded)."""
    text = " ".join(str(message).split()) or type(message).__name__
    print(f"{prog}: {text}", file=sys.stderr, flush=True)


def run_script(
    prog: str,
    main: Callable[[Sequence[str] | None], int],
    argv: Sequence[str] | None = None,
    *,
    usage_errors: tuple[type[BaseException], ...] = (ValueError,),
    failures: tuple[type[BaseException], ...] = (OSError,),
) -> int:
    """Run a console script's ``main``: ``usage_errors`` exit 2, ``failures`` exit 1,
    each said in one line; Ctrl-C exits 130 quietly. With ``FQBROKER_DEBUG=1`` the
    traceback is printed too."""
    try:
        return main(argv)
    except KeyboardInterrupt:
        return 130
    except usage_errors as exc:
        _maybe_traceback()
        say_error(prog, exc)
        return EXIT_USAGE
    except failures as exc:
        _maybe_traceback()
        say_error(prog, exc)
        return EXIT_FAILURE


def _maybe_traceback() -> None:
    if os.environ.get(DEBUG_ENV, "") not in ("", "0"):
        traceback.print_exc()
