"""Retained topics: disk stores read by offset, with retention (docs/topics.md)."""
