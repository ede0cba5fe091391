"""The fyrehose backbone (seed 000): sequenced UDP pub/sub with gap recovery. Experimental.

:mod:`.wire` encodes and decodes the datagrams sans I/O, for the listener and the client
alike.
"""
