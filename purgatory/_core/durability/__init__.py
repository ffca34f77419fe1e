"""Durability of an engine: its journal and its snapshots (core concept; sans-IO, stdlib only).

Every input an engine applies is a journal entry (``entries``); ``journal`` records and replays
them, ``snapshot`` writes and restores an engine's whole state, ``manifest`` describes a snapshot
cut into chunks.
"""
