"""Tests of Flink's key-group assignment: known hash values and the range properties."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from purgatory._core._errors import UsageError
from purgatory._core.flink.key_groups import (
    MAX_KEY_GROUPS,
    java_string_hash,
    key_group_for,
    key_group_range_for_operator,
    murmur_hash,
    operator_index_for_key_group,
)


def _reference_string_hash(s: str) -> int:
    """Java's String.hashCode, spelled out: 31 * h + unit over UTF-16 units, as a Java int."""
    units: list[int] = []
    for char in s:
        point = ord(char)
        if point > 0xFFFF:
            point -= 0x10000
            units += [0xD800 + (point >> 10), 0xDC00 + (point & 0x3FF)]
        else:
            units.append(point)
    h = 0
    for unit in units:
        h = 31 * h + unit
    h %= 1 << 32
    return h - (1 << 32) if h >= 1 << 31 else h


# Values of java.lang.String.hashCode(): "Aa"/"BB" is the classic collision; the emoji is
# hashed as its surrogate pair 0xD83D 0xDE00 (55357 * 31 + 56832).
@pytest.mark.parametrize(
    ("s", "expected"),
    [
        ("", 0),
        ("a", 97),
        ("hello", 99162322),
        ("Aa", 2112),
        ("BB", 2112),
        ("\U0001f600", 1772899),
        ("ingest/users", -469612899),
        ("The quick brown fox jumps over the lazy dog", -609428141),
        ("héllo wörld €", 1283057445),
    ],
)
def test_java_string_hash_known_values(s: str, expected: int) -> None:
    assert java_string_hash(s) == expected
    assert java_string_hash(s) == _reference_string_hash(s)


def test_java_string_hash_wraps_like_a_java_int() -> None:
    s = "signal/" * 40
    assert java_string_hash(s) == _reference_string_hash(s)
    unbounded = 0
    for char in s:
        unbounded = 31 * unbounded + ord(char)
    assert unbounded >= 1 << 32  # the plain sum really overflows
    assert -(1 << 31) <= java_string_hash(s) < 1 << 31


def test_lone_surrogate_is_hashed_as_its_code_unit() -> None:
    assert java_string_hash("\ud800") == 0xD800


@given(st.text())
def test_java_string_hash_matches_reference(s: str) -> None:
    assert java_string_hash(s) == _reference_string_hash(s)


# Flink's murmurHash(code) is MurmurHash3_x86_32 of code's 4 little-endian bytes, seed 0, then
# made non-negative. Published MurmurHash3 vectors (SMHasher): bytes 00 00 00 00 -> 0x2362F9DE,
# ff ff ff ff -> 0x76293B50, 21 43 65 87 -> 0xF55B516B (negative as an int, so Flink negates it).
@pytest.mark.parametrize(
    ("code", "expected"),
    [
        (0, 0x2362F9DE),
        (-1, 0x76293B50),
        (0x87654321 - (1 << 32), (1 << 32) - 0xF55B516B),
        (1, 68075478),
        (42, 1134849565),
        (97, 1455541201),
        (99162322, 1715862179),
        (-(1 << 31), 1718298732),
        ((1 << 31) - 1, 1653689534),
    ],
)
def test_murmur_hash_known_values(code: int, expected: int) -> None:
    assert murmur_hash(code) == expected


def test_murmur_hash_reads_only_the_low_32_bits() -> None:
    assert murmur_hash(0x87654321) == murmur_hash(0x87654321 - (1 << 32))


@given(st.integers(min_value=-(1 << 31), max_value=(1 << 31) - 1))
def test_murmur_hash_is_non_negative_int(code: int) -> None:
    assert 0 <= murmur_hash(code) < 1 << 31


# assignToKeyGroup(scope, maxP) with Flink's formula, for Flink's default 128 and the maximum.
@pytest.mark.parametrize(
    ("scope", "groups_128", "groups_max"),
    [
        ("", 94, 31198),
        ("hello", 35, 31395),
        ("ingest/orders@2026-11-22", 101, 28005),
        ("ingest/users", 43, 10539),
        ("ingest/stock", 116, 23156),
    ],
)
def test_key_group_known_values(scope: str, groups_128: int, groups_max: int) -> None:
    assert key_group_for(scope, 128) == groups_128
    assert key_group_for(scope, MAX_KEY_GROUPS) == groups_max


def test_key_group_ranges_known_values() -> None:
    assert key_group_range_for_operator(128, 1, 0) == range(0, 128)
    assert [key_group_range_for_operator(128, 3, i) for i in range(3)] == [
        range(0, 43),
        range(43, 86),
        range(86, 128),
    ]
    assert [key_group_range_for_operator(10, 4, i) for i in range(4)] == [
        range(0, 3),
        range(3, 5),
        range(5, 8),
        range(8, 10),
    ]


@st.composite
def _layouts(draw: st.DrawFn) -> tuple[int, int]:
    max_p = draw(st.integers(min_value=1, max_value=MAX_KEY_GROUPS))
    p = draw(st.one_of(st.integers(1, min(max_p, 300)), st.just(max_p)))
    return max_p, p


@given(_layouts())
@settings(deadline=None)
def test_operator_ranges_partition_all_key_groups(layout: tuple[int, int]) -> None:
    max_p, p = layout
    ranges = [key_group_range_for_operator(max_p, p, i) for i in range(p)]
    assert ranges[0].start == 0
    assert ranges[-1].stop == max_p
    for before, after in itertools.pairwise(ranges):
        assert before.stop == after.start
    assert {len(r) for r in ranges} <= {max_p // p, -(-max_p // p)}
    assert min(len(r) for r in ranges) >= 1


@given(_layouts(), st.data())
def test_operator_of_a_key_group_owns_it(layout: tuple[int, int], data: st.DataObject) -> None:
    max_p, p = layout
    group = data.draw(st.integers(0, max_p - 1))
    owner = operator_index_for_key_group(max_p, p, group)
    assert 0 <= owner < p
    assert group in key_group_range_for_operator(max_p, p, owner)


@given(st.text(), st.integers(1, MAX_KEY_GROUPS))
def test_key_group_is_in_range_and_stable(scope: str, max_p: int) -> None:
    group = key_group_for(scope, max_p)
    assert 0 <= group < max_p
    assert key_group_for(scope, max_p) == group
    assert group == murmur_hash(java_string_hash(scope)) % max_p


@pytest.mark.parametrize(
    ("call", "name"),
    [
        (lambda: key_group_for("k", 0), "max_parallelism"),
        (lambda: key_group_for("k", MAX_KEY_GROUPS + 1), "max_parallelism"),
        (lambda: key_group_for("k", True), "max_parallelism"),
        (lambda: key_group_for(b"k", 128), "scope"),  # type: ignore[arg-type]
        (lambda: key_group_range_for_operator(0, 1, 0), "max_parallelism"),
        (lambda: key_group_range_for_operator(8, 0, 0), "parallelism"),
        (lambda: key_group_range_for_operator(8, 9, 0), "parallelism"),
        (lambda: key_group_range_for_operator(8, 4, 4), "operator_index"),
        (lambda: key_group_range_for_operator(8, 4, -1), "operator_index"),
        (lambda: operator_index_for_key_group(8, 4, 8), "key_group"),
        (lambda: operator_index_for_key_group(8, 4, -1), "key_group"),
        (lambda: operator_index_for_key_group(8, 16, 0), "parallelism"),
    ],
)
def test_invalid_arguments_name_the_argument(call: object, name: str) -> None:
    assert callable(call)
    with pytest.raises(UsageError, match=f"^{name} "):
        call()
