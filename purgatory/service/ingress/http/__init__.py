"""The HTTP API: requests in, answers out once what they changed is journaled.

``app`` serves the route table (``table``) of ``routes`` and answers every error through the
one mapping of ``answers``; ``context`` holds what every handler is given; ``bodies`` and
``queries`` read and validate a request; ``forwarding`` sends a request (or a batch's items)
to its scope's owner; ``server`` cuts off slow and stalled clients; ``openapi`` documents the
table (``openapi.json``); ``auth`` checks bearer tokens; ``ui`` is the operator's page. The
modules meet at the names each lists in its ``__all__``.
"""
