"""The fq client: its sans-I/O command channel and the asyncio client."""
