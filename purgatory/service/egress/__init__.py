"""Outcomes out: callbacks and dead letters to their topics, acknowledgements back.

It takes journaled outcomes and dead letters (``outbox``), sends them in order per partition
with retries, and gives each acknowledgement back (waiters, recent outcomes, the delivered mark),
with its statistics (``stats``).
"""
