"""The Lumberjack (Elastic Beats) front end: log shippers publish into fq exchanges.

:mod:`.protocol` decodes the wire format sans I/O, :mod:`.mapping` turns an event into an
fq route and sender, :mod:`.encoder` is the shipper side for tests, the bench and the
fuzzer. See docs/lumberjack.md.
"""
