"""Clients of the broker: the fq client, the replay client, and the fq-send/fq-recv tools."""
