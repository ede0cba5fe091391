"""fyrehose's datagrams (docs/fyrehose-protocol.md)."""
