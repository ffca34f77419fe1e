"""The HTTP API: requests in, answers out once what they changed is journaled.

``app`` serves the route table (``table``) of ``routes`` and maps every error to its status;
``requests`` reads and validates a request; ``server`` cuts off slow and stalled clients;
``openapi`` documents the table (``openapi.json``); ``auth`` checks bearer tokens; ``ui`` is the
operator's page.
"""
