"""Blocking clients of the broker's HTTP side: the admin API and replay reads."""
