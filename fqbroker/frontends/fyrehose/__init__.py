"""The fyrehose backbone: sequenced UDP pub/sub with gap recovery. Experimental.

:mod:`.backbone` is the backbone sans I/O (its datagrams: :mod:`fqbroker.protocols.fyrehose.wire`),
:mod:`.endpoint` the asyncio shell. See docs/fyrehose.md.
"""
