"""Kafka's request purgatory, in Python (core concept; sans-IO, stdlib only).

The hierarchical timing wheel (``timer``: ``Timer``, ``TimerTask``), the delayed operation with
its completion contract (``operation``: ``DelayedOperation``) and the purgatory that watches
operations under keys and expires them on the wheel (``purgatory``:
``DelayedOperationPurgatory``), with Kafka's names in snake_case.
"""
