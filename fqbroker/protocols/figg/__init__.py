"""Figg's wire format (docs/figg-protocol.md)."""
