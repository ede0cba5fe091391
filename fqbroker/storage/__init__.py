"""What survives a restart: the segment log of disk queues, the stores over it, the
sqlite config store, the catalog that keeps queues and bindings in step with it, and
named checkpoints."""
