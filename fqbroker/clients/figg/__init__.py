"""The Figg client: a sans-I/O machine and the asyncio client (docs/figg-client.md)."""
