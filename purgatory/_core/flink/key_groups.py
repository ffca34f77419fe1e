"""Key groups (core concept: Flink's key-group assignment; sans-IO, stdlib only, pure functions).

A scope (the Kafka message key, for example ``ingest/orders@2026-11-22``) belongs to one of
``max_parallelism`` *key groups*, fixed for the life of the deployment, and each group belongs
to exactly one of ``parallelism`` operators (partitions, replicas). Scaling out changes only
the second mapping, so whole groups move, never single scopes. The formulas are Flink's, bit
for bit, so a scope lands in the same group here as in a Flink job keyed by the same string:

* ``key_group_for(scope, max_parallelism)`` is ``KeyGroupRangeAssignment.assignToKeyGroup``:
  ``murmur_hash(java_string_hash(scope)) % max_parallelism``, where the first hash is Java's
  ``String.hashCode`` and the second is ``org.apache.flink.util.MathUtils.murmurHash(int)``;
* ``key_group_range_for_operator`` is ``computeKeyGroupRangeForOperatorIndex``: operator ``i``
  owns ``[ceil(i * maxP / p), floor(((i + 1) * maxP - 1) / p)]``, contiguous ranges that
  partition ``[0, maxP)`` and differ in size by at most one;
* ``operator_index_for_key_group`` is ``computeOperatorIndexForKeyGroup``: ``g * p // maxP``,
  the operator whose range holds ``g``.

Like Flink, ``max_parallelism`` is capped at ``32768`` (``1 << 15``).
"""

from __future__ import annotations

from purgatory._core._errors import UsageError
from purgatory._core.engine.validate import check_positive_int

__all__ = [
    "MAX_KEY_GROUPS",
    "java_string_hash",
    "key_group_for",
    "key_group_range_for_operator",
    "murmur_hash",
    "operator_index_for_key_group",
]

#: The largest ``max_parallelism`` (number of key groups) Flink accepts.
MAX_KEY_GROUPS = 1 << 15

_MASK = 0xFFFFFFFF
_SIGN = 0x80000000


def _to_signed(value: int) -> int:
    """Read the low 32 bits of ``value`` as a Java ``int``."""
    value &= _MASK
    return value - (1 << 32) if value & _SIGN else value


def _rotl(value: int, bits: int) -> int:
    """``Integer.rotateLeft`` on an unsigned 32-bit value."""
    return ((value << bits) | (value >> (32 - bits))) & _MASK


def java_string_hash(s: str) -> int:
    """Java's ``String.hashCode()`` of ``s``.

    ``h = 31 * h + c`` over the UTF-16 code units (a character outside the BMP counts as its
    surrogate pair), wrapping like a Java ``int``.

    Args:
        s: any string; lone surrogates are hashed as the code units they are.

    Returns:
        The hash as a signed 32-bit int, in ``[-2**31, 2**31)``.
    """
    data = s.encode("utf-16-le", "surrogatepass")
    h = 0
    for i in range(0, len(data), 2):
        h = (31 * h + (data[i] | data[i + 1] << 8)) & _MASK
    return _to_signed(h)


def murmur_hash(code: int) -> int:
    """Flink's ``MathUtils.murmurHash(int)``: one murmur3 round and its finalizer.

    This equals MurmurHash3_x86_32 of the four little-endian bytes of ``code`` with seed 0,
    folded to a non-negative int the way Flink does it (``-h`` for negative ``h``, and 0 for
    ``Integer.MIN_VALUE``).

    Args:
        code: a 32-bit int (signed or unsigned; only the low 32 bits count).

    Returns:
        The hash, in ``[0, 2**31)``.
    """
    k = (code * 0xCC9E2D51) & _MASK
    k = _rotl(k, 15)
    k = (k * 0x1B873593) & _MASK
    h = _rotl(k, 13)
    h = (h * 5 + 0xE6546B64) & _MASK
    h ^= 4
    h ^= h >> 16
    h = (h * 0x85EBCA6B) & _MASK
    h ^= h >> 13
    h = (h * 0xC2B2AE35) & _MASK
    h ^= h >> 16
    signed = _to_signed(h)
    if signed >= 0:
        return signed
    return 0 if signed == -_SIGN else -signed


def _check_max_parallelism(max_parallelism: int) -> int:
    return check_positive_int("max_parallelism", max_parallelism, maximum=MAX_KEY_GROUPS)


def _check_parallelism(max_parallelism: int, parallelism: int) -> tuple[int, int]:
    max_p = _check_max_parallelism(max_parallelism)
    return max_p, check_positive_int("parallelism", parallelism, maximum=max_p)


def key_group_for(scope: str, max_parallelism: int) -> int:
    """The key group of ``scope`` (Flink's ``KeyGroupRangeAssignment.assignToKeyGroup``).

    Args:
        scope: the key, hashed as a Java string.
        max_parallelism: the number of key groups, in ``[1, 32768]``.

    Returns:
        A key group in ``[0, max_parallelism)``; the same for the same inputs, always.

    Raises:
        UsageError: naming ``scope`` or ``max_parallelism`` when it is out of range.
    """
    if not isinstance(scope, str):
        raise UsageError(f"scope must be a str, got {type(scope).__name__}")
    max_p = _check_max_parallelism(max_parallelism)
    return murmur_hash(java_string_hash(scope)) % max_p


def key_group_range_for_operator(
    max_parallelism: int, parallelism: int, operator_index: int
) -> range:
    """The key groups owned by one operator (Flink's ``computeKeyGroupRangeForOperatorIndex``).

    Args:
        max_parallelism: the number of key groups, in ``[1, 32768]``.
        parallelism: the number of operators, in ``[1, max_parallelism]``.
        operator_index: the operator, in ``[0, parallelism)``.

    Returns:
        A non-empty, contiguous ``range`` of key groups; over all operator indexes the ranges
        partition ``[0, max_parallelism)`` in order.

    Raises:
        UsageError: naming the argument that is out of range.
    """
    max_p, p = _check_parallelism(max_parallelism, parallelism)
    i = check_positive_int("operator_index", operator_index, minimum=0, maximum=p - 1)
    start = (i * max_p + p - 1) // p
    end_inclusive = ((i + 1) * max_p - 1) // p
    return range(start, end_inclusive + 1)


def operator_index_for_key_group(max_parallelism: int, parallelism: int, key_group: int) -> int:
    """The operator that owns ``key_group`` (Flink's ``computeOperatorIndexForKeyGroup``).

    Args:
        max_parallelism: the number of key groups, in ``[1, 32768]``.
        parallelism: the number of operators, in ``[1, max_parallelism]``.
        key_group: the key group, in ``[0, max_parallelism)``.

    Returns:
        The operator index in ``[0, parallelism)`` whose range contains ``key_group``.

    Raises:
        UsageError: naming the argument that is out of range.
    """
    max_p, p = _check_parallelism(max_parallelism, parallelism)
    g = check_positive_int("key_group", key_group, minimum=0, maximum=max_p - 1)
    return g * p // max_p
