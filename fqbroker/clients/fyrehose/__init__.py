"""The fyrehose client: a sans-I/O machine and the asyncio client (docs/fyrehose-client.md)."""
