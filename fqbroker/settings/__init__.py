"""The broker's settings: the TOML file, the front ends' sections, the data directory
(docs/cli.md)."""
