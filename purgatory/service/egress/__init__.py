"""Outcomes out: callbacks and dead letters to their topics, acknowledgements back.

It takes journaled outcomes and dead letters (``outbox``, the one object the other stages see),
sends them in order with retries, and gives each acknowledgement back (waiters, recent outcomes,
the delivered mark: ``acknowledgements``), with its statistics. The outbox's parts, in the order
a record crosses them: ``backlog`` (the ordered queue, back-pressure), ``records`` (what is
written), ``sender``, ``acknowledger``, ``settler`` (a refused record), ``receipts`` (what an
acknowledgement counts), ``committer`` (input offsets, after what they caused).
"""
