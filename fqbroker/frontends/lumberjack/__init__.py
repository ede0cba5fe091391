"""The Lumberjack (Elastic Beats) front end: log shippers publish into fq exchanges.

:mod:`.machine` is the protocol sans I/O (its wire format: :mod:`fqbroker.protocols.lumberjack`),
:mod:`.mapping` turns an event into an fq route and sender, :mod:`.session` is the shell.
See docs/lumberjack.md.
"""
