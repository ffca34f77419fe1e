"""Decoded inputs to the engine of their scope's partition, and each partition's life here.

The partition table (``table``) says which engine serves which partition; the dispatcher
(``dispatcher``) admits each input against the quotas (``admission``) and the ``reply_to``
policy (``reply_to``), applies it to its partition's engine and returns what it decided; the
read model (``reads``) answers lookups and long polls (``waiters``); the follower (``follow``)
takes, restores, serves, fences and hands over partitions.
"""
