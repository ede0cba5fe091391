"""HTTP on the broker's main port: stats, metrics, submit, checkpoints, replay, the web UI."""
