"""The OpenCluster front end: a durable single-node key/value store speaking the Nov-2011
OpenCluster binary protocol.

:mod:`.machine` is one connection sans I/O (its frames: :mod:`fqbroker.protocols.opencluster.wire`),
:mod:`.session` the shell. See docs/opencluster-protocol.md.
"""
