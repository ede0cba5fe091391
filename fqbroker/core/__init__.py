"""The routing core, sans-IO: messages and their frames, programs, bindings, queues.

It knows no wire protocol and no socket. Front ends hand it runs of messages through a
:class:`~fqbroker.core.publisher.Publisher`; queues hand messages to consumers.
"""
