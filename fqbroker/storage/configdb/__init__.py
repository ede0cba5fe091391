"""The sqlite config DB: queues, bindings, upstreams, checkpoints, users (fqd's schema and ours)."""
