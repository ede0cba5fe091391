"""What every console script shares: ``--version``, ``--help`` with defaults, and bad
input answered in one line on stderr with a non-zero exit, never a traceback (unless
``FQBROKER_DEBUG=1`` in the environment asks for one)."""

from __future__ import annotations

import argparse
import os
import sys
import traceback
from collections.abc import Callable, Sequence
from typing import Any

from fqbroker.accel import describe
from fqbroker.version import FQ_COMPAT_VERSION, __version__

__all__ = [
    "EXIT_FAILURE",
    "EXIT_USAGE",
    "Parser",
    "add_tls_options",
    "address_type",
    "port_type",
    "run_script",
    "say_error",
    "tls_options",
    "version_text",
]

EXIT_FAILURE = 1  # the work failed: a refused connection, a broker's error
EXIT_USAGE = 2  # bad input: a flag, a setting, a file (argparse's own code)
DEBUG_ENV = "FQBROKER_DEBUG"


def version_text(prog: str) -> str:
    """What ``--version`` prints: the script, fqbroker's version, the fq protocol's, and
    whether the compiled accelerator or pure Python runs (and why pure, if it was built)."""
    return f"{prog} (fqbroker {__version__}, fq protocol {FQ_COMPAT_VERSION}, {describe()})"


class _Formatter(argparse.ArgumentDefaultsHelpFormatter, argparse.RawDescriptionHelpFormatter):
    """Defaults shown in ``--help``; descriptions keep their line breaks."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        # No "(default: None)" or "(default: False)": an unset flag or a switch has none
        # worth saying (its help says what applies when it is not given).
        if action.default is None or action.default is False:
            return action.help
        return super()._get_help_string(action)


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


TLS_OPTIONS = ("tls", "cafile", "certfile", "keyfile")


def add_tls_options(p: argparse.ArgumentParser, *, top: bool = True, certificate: str = "") -> None:
    """Every client tool's TLS flags: ``--tls``, ``--cafile``, ``--cert`` and ``--key``
    (``--certfile``/``--keyfile``, their first spelling, still work). ``top=False`` for a
    subcommand, which takes them too without overriding what the tool's own flags said.
    ``certificate``: what a client certificate is to this tool's server, for the help."""
    default: Any = argparse.SUPPRESS if not top else None
    p.add_argument(
        "--tls",
        action="store_true",
        default=argparse.SUPPRESS if not top else False,
        help="connect over TLS, checking the server against the system's CAs",
    )
    p.add_argument(
        "--cafile",
        metavar="FILE",
        default=default,
        help="trust only the CAs of this PEM file (implies --tls)",
    )
    said = f": {certificate}" if certificate else ""
    for flag, alias, text in (
        ("--cert", "--certfile", f"present this PEM client certificate{said} (implies --tls)"),
        ("--key", "--keyfile", "the client certificate's PEM private key (default: in --cert)"),
    ):
        dest = alias[2:]
        p.add_argument(flag, dest=dest, metavar="FILE", default=default, help=text)
        p.add_argument(alias, dest=dest, default=default, help=argparse.SUPPRESS)


def tls_options(args: argparse.Namespace) -> dict[str, Any]:
    """The TLS flags ``add_tls_options`` made, as a client's keyword arguments
    (``tls``, ``cafile``, ``certfile``, ``keyfile``)."""
    options = {name: getattr(args, name, None) for name in TLS_OPTIONS}
    for name, flag in (("cafile", "--cafile"), ("certfile", "--cert"), ("keyfile", "--key")):
        path = options[name]
        if path:
            # Said here, naming the flag, rather than as a connection that failed.
            try:
                open(str(path), "rb").close()
            except OSError as exc:
                raise ValueError(f"{flag} {path}: {exc.strerror or exc}") from None
    return options


def port_type(*, zero: bool = False) -> Callable[[str], int]:
    """An argparse ``type``: a port number, 1 to 65535 (0, "pick one", only when ``zero``)."""
    low = 0 if zero else 1

    def port(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            value = -1
        if not low <= value <= 65535:
            raise argparse.ArgumentTypeError(f"{text!r} is not a port ({low} to 65535)")
        return value

    return port


def address_type(default_port: int) -> Callable[[str], tuple[str, int]]:
    """An argparse ``type``: ``HOST:PORT``, ``[V6ADDR]:PORT`` or a bare ``HOST`` (on
    ``default_port``), as (host, port)."""
    to_port = port_type()

    def address(text: str) -> tuple[str, int]:
        host, port = text, ""
        if text.startswith("["):
            host, sep, rest = text[1:].partition("]")
            if not sep or (rest and not rest.startswith(":")):
                raise argparse.ArgumentTypeError(f"{text!r} is not [ADDR]:PORT")
            port = rest[1:]
        elif text.count(":") == 1:
            host, _, port = text.partition(":")
        if not host:
            raise argparse.ArgumentTypeError(f"{text!r} names no host")
        return host, to_port(port) if port else default_port

    return address


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
