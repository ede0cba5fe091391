"""Front ends: one package per protocol that publishes into the routing core.

Each registers once, in :mod:`fqbroker.server.frontends`; see docs/architecture.md.
"""
