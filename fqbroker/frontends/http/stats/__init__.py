"""/stats.json, /metrics and /node.json: one snapshot of every counter, rendered."""
