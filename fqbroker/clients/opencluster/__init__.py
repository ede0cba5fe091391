"""The OpenCluster client: a sans-I/O machine and the asyncio client
(docs/opencluster-client.md)."""
