"""fq on the broker's main port: the wire format, the command and data sessions, peering."""
