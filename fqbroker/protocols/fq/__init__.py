"""fq's wire format: the command channel, the data channel's frames (docs/fq-protocol.md)."""
