"""The OpenCluster front end (seed 001): a durable single-node key/value store speaking the
Nov-2011 OpenCluster binary protocol.

:mod:`.wire` encodes and decodes the frames sans I/O (the client uses it too). See
docs/opencluster-protocol.md.
"""
