"""The segment log of disk queues and topics (docs/disk-format.md)."""
