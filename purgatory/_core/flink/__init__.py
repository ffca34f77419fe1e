"""Flink's keyed timers and state TTL, in Python (core concept; sans-IO, stdlib only).

Timers identified by (scope, key, namespace, timestamp) in processing or event time against
per-scope watermarks (``keyed_timers``), state that expires after a time to live
(``ttl_state``), and the key groups that map keys to partitions (``key_groups``).
"""
