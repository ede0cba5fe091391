"""The Figg front end (seed 004): retained topics with offsets over Figg's binary protocol.

:mod:`.wire` encodes and decodes the frames sans I/O (the client uses it too),
:mod:`.session` serves one connection, :mod:`.frontend` is the front-end table's entry.
See docs/figg-protocol.md.
"""
