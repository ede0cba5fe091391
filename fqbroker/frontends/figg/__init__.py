"""The Figg front end: retained topics with offsets over Figg's binary protocol.

:mod:`.machine` is the protocol sans I/O (its frames: :mod:`fqbroker.protocols.figg.wire`),
:mod:`.session` serves one connection, :mod:`.frontend` is the front-end table's entry.
See docs/figg-protocol.md.
"""
