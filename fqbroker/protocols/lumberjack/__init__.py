"""The Lumberjack wire format, v1 and v2 (docs/lumberjack.md)."""
