"""The fyrehose listener as a front end of the table: a UDP port of its own, off until
``[fyrehose] listen`` (or ``fqd --fyrehose``) names an address (docs/fyrehose.md)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from fqbroker.frontends.fyrehose.settings import Fyrehose
from fqbroker.frontends.kit.component import Counters, Datagrams, FrontEnd, LiveFrontEnd
from fqbroker.settings.broker import Settings, is_loopback
from fqbroker.settings.section import Flag

# The endpoint and its backbone are imported when the listener opens, not by every
# broker: an idle one keeps its memory (bench/RESULTS.md, the idle row).
if TYPE_CHECKING:
    from fqbroker.frontends.fyrehose.endpoint import FyrehoseEndpoint, FyrehoseHost

__all__ = ["FYREHOSE"]


def _address(settings: Settings) -> tuple[str, int] | None:
    return settings.section(Fyrehose).address(settings.bind)


def _refuse_start(settings: Settings) -> str | None:
    # UDP cannot tell who sent a datagram: beyond loopback only when the operator says so.
    address = _address(settings)
    if address is None or is_loopback(address[0]) or settings.section(Fyrehose).allow_remote:
        return None
    return (
        f"fyrehose: refusing to listen on {address[0]}: UDP carries no authentication and"
        " anyone who reaches the port may publish and subscribe; listen on loopback, or set"
        " [fyrehose] allow_remote = true for a network you trust"
    )


def _open(host: FyrehoseHost, live: LiveFrontEnd) -> FyrehoseEndpoint:
    from fqbroker.frontends.fyrehose.backbone import Backbone
    from fqbroker.frontends.fyrehose.endpoint import FyrehoseEndpoint, renewer
    from fqbroker.frontends.fyrehose.sequence import SequenceFile, SequenceFileError

    settings = host.settings.section(Fyrehose)
    file = SequenceFile.under(host.settings.queue_dir)
    first = file.start()  # SequenceFileError: fqd says why in one line and exits
    try:
        # The same number again: a start that fails (its port taken) skips none, and a
        # directory that cannot be written stops fqd now rather than at the first message.
        # The first message takes the lease (Backbone renews at ``lease``).
        file.write(first)
    except OSError as exc:
        raise SequenceFileError(
            f"fyrehose sequence file {file.path} cannot be written: {exc.strerror or exc}"
        ) from None
    mark = file.open_mark(first - 1)
    backbone = Backbone(
        next_sequence=first,
        window_messages=settings.window_messages,
        window_bytes=settings.window_bytes,
        request_limit=settings.request_limit,
        max_subscribers=settings.max_subscribers,
        send_elsewhere=settings.send_elsewhere,
        renew=renewer(file),
        lease=first,
        mark=mark,
    )
    return FyrehoseEndpoint(host, live, backbone, file)


def _counters() -> Counters[Any, Any]:
    from fqbroker.frontends.fyrehose.stats import COUNTERS

    return COUNTERS


FYREHOSE: FrontEnd[Any] = FrontEnd(
    name="fyrehose",
    reach=Datagrams(_address, _open),
    summary="fyrehose: sequenced UDP pub/sub with gap recovery, bridged to an exchange",
    settings=Fyrehose,
    flags=(
        Flag(
            "--fyrehose",
            "listen",
            "ADDR:PORT",
            "serve the fyrehose backbone over UDP here (off by default; port 0 picks one)",
        ),
    ),
    refuse_start=_refuse_start,
    title="fyrehose",
    counters=_counters,
    fuzz=("fyrehose",),
    bench=("fyrehose",),
)
