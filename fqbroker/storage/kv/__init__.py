"""The OpenCluster key/value store: memory, a journal, sqlite (docs/opencluster.md)."""
