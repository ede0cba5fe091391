"""The broker process: the :class:`~fqbroker.server.broker.Broker`, its listeners and
the table of front ends, the limits on what the network may cost, the heartbeat clock."""
