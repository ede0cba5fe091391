"""The routing core, sans-IO: messages and their frames, programs, bindings, queues.

It knows no socket and no front end's protocol; the one format it knows is fq's data
frame (:mod:`~fqbroker.core.frames`), which its queues and disk stores hold. Front ends
hand it runs of messages through a :class:`~fqbroker.core.publisher.Publisher`; queues
hand messages to consumers.
"""
