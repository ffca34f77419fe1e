"""Which input partition a scope belongs to (service layer).

The scope is every input record's Kafka key, so the producer's partitioner decides where a scope
lives: Kafka's murmur2 of the key's UTF-8 bytes, positive, modulo the partition count, exactly as
the Java client and kafka-python compute it. HTTP requests use the same function, so a scope's
operations, signals and watermarks meet in one partition's engine whichever way they arrive.
"""

from __future__ import annotations

from functools import lru_cache

from kafka.partitioner.default import murmur2

__all__ = ["partition_for"]


@lru_cache(maxsize=65_536)
def partition_for(scope: str, partitions: int) -> int:
    """The partition of ``scope`` among ``partitions`` (Kafka's default partitioner)."""
    data = scope.encode("utf-8", "surrogatepass")
    hashed: int = murmur2(data)
    return (hashed & 0x7FFFFFFF) % partitions
