"""The admin API's checkpoints, peers, users and topics (docs/admin.md)."""

from __future__ import annotations
