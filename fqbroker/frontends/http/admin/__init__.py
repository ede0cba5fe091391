"""The admin API under /admin/ (docs/admin.md)."""
