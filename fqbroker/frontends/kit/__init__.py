"""What every front end shares: the component it declares, connection limits, TLS, heartbeats, acks
and the publishing tail."""
