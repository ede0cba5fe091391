"""OpenCluster's frames and command ids (docs/opencluster-protocol.md)."""
