"""Snapshots: each partition's engine written beside the journal, so a restore replays less.

It writes a partition's snapshot to the snapshots topic as chunks and their manifest, and finds
the latest usable one for a restore (``snapshots``); the snapshotter, a warm standby in a process
of its own, tails the journal and writes them (``snapshotter``); the serving process reads how
old each partition's latest snapshot is and how much journal follows it (``snapshot_watch``).
Snapshots only bound the replay: the journal (:mod:`purgatory.service.journal`) stays the truth.
"""
