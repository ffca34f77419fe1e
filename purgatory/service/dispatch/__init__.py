"""Decoded inputs to the engine of their scope's partition.

It takes registrations, signals, watermarks and cancels from ingress, admits them against the
quotas (``admission``) and the ``reply_to`` policy (``reply_to``), applies each to the engine of
its partition (``partitions``), and gives the outcomes the engines decided to the journal.
"""
