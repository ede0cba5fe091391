"""Replay reads: /queue/info, /queue/read, /topic/info, /topic/read."""
