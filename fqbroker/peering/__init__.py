"""Peering: links that pull exchanges from upstream brokers into this one (docs/peering.md)."""
