"""A sink task's staging, without Spark: encode the whole partition, spool past the budget, send.

The rows are PySpark ``Row`` objects encoded by the signals sink's real encoder, and the send is
a fake that records what it was given, so these tests need neither a JVM nor a broker.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from pathlib import Path

import pytest
from pyspark.sql.types import Row

from purgatory._codec import SignalRecord, decode_signal
from purgatory._core import ConfigError
from spark_bridge._signals_sink import _Encoder, _parse_options
from spark_bridge._staging import (
    DEFAULT_MEMORY_BYTES,
    RECORD_OVERHEAD_BYTES,
    StagedRecords,
    Staging,
    default_spool_dir,
)
from spark_bridge._writer import RowError, staging, write_partition

ROWS = 50


class FakeSend:
    """Records what the task sent, and whether every row had been read by then."""

    def __init__(self, rows: Rows) -> None:
        self.rows = rows
        self.calls = 0
        self.sent: list[tuple[bytes, bytes]] = []
        self.spooled = 0
        self.rows_read_at_send = -1

    def __call__(self, records: Iterable[tuple[bytes, bytes]]) -> int:
        self.calls += 1
        self.rows_read_at_send = self.rows.read
        if isinstance(records, StagedRecords):
            self.spooled = records.spooled
        self.sent.extend(records)
        return len(self.sent)


class Rows:
    """A partition's rows, readable once, as Spark hands them to a writer; counts reads."""

    def __init__(self, rows: list[Row]) -> None:
        self._rows = rows
        self.read = 0

    def __iter__(self) -> Iterator[Row]:
        for row in self._rows:
            self.read += 1
            yield row


def encoder() -> _Encoder:
    opts = _parse_options({"bootstrap_servers": "127.0.0.1:9", "event_time_column": "t"})
    return _Encoder(opts, naive_is_utc=False)


def rows(bad_at: int | None = None) -> list[Row]:
    return [
        Row(scope=f"s{i % 3}", key=None if i == bad_at else f"key-{i}", t=1_000 + i)
        for i in range(ROWS)
    ]


def test_the_worked_example_keeps_one_record_in_memory_and_spools_the_rest(
    tmp_path: Path,
) -> None:
    records = [(b"k" * 10, bytes([i]) * 60) for i in range(4)] + [(b"", b"")]
    with StagedRecords(Staging(memory_bytes=300, spool_dir=str(tmp_path))) as staged:
        for key, value in records:
            staged.add(key, value)
        assert staged.memory_bytes == 70 + RECORD_OVERHEAD_BYTES
        assert (len(staged), staged.spooled) == (5, 4)
        assert list(staged) == records
        assert list(staged) == records  # a second pass reads the spool again
        staged.add(b"late", b"x")
        assert list(staged)[-1] == (b"late", b"x")
        assert list(tmp_path.iterdir()) == []  # the spool file has no name
    assert (len(staged), list(staged)) == (0, [])


def test_a_budget_of_zero_spools_every_record_and_a_large_one_none() -> None:
    records = [(f"s{i}".encode(), f"value-{i}".encode()) for i in range(100)]
    for budget, spooled in ((0, 100), (DEFAULT_MEMORY_BYTES, 0)):
        with StagedRecords(Staging(memory_bytes=budget)) as staged:
            for key, value in records:
                staged.add(key, value)
            assert staged.spooled == spooled
            assert list(staged) == records


def test_a_partition_is_encoded_whole_then_sent_through_the_spool_in_order() -> None:
    partition = Rows(rows())
    send = FakeSend(partition)
    report = write_partition(partition, encoder(), send, Staging(memory_bytes=1_000))

    assert send.calls == 1
    assert send.rows_read_at_send == ROWS
    assert 0 < send.spooled < ROWS  # some records were kept in memory, the rest spooled
    signals = [decode_signal(value) for _, value in send.sent]
    assert signals == [SignalRecord(r.scope, r.key, r.t) for r in rows()]
    assert [key for key, _ in send.sent] == [r.scope.encode() for r in rows()]
    assert report.records == ROWS
    assert report.high_marks == {"s0": 1_048, "s1": 1_049, "s2": 1_047}


@pytest.mark.parametrize("bad_at", [0, ROWS // 2, ROWS - 1], ids=["start", "middle", "end"])
def test_a_bad_row_anywhere_fails_the_task_before_anything_is_sent(bad_at: int) -> None:
    partition = Rows(rows(bad_at))
    send = FakeSend(partition)
    with pytest.raises(RowError) as info:
        write_partition(partition, encoder(), send, Staging(memory_bytes=500))
    assert send.calls == 0
    assert partition.read == bad_at + 1
    message = str(info.value)
    assert message.startswith("column 'key': must be a non-empty string; row: ")
    assert f"scope='s{bad_at % 3}', key=None, t={1_000 + bad_at}" in message


def test_an_empty_partition_sends_nothing() -> None:
    partition = Rows([])
    send = FakeSend(partition)
    report = write_partition(partition, encoder(), send, Staging())
    assert (send.calls, report.records) == (0, 0)


def test_the_staging_options_are_parsed_and_named_in_errors(tmp_path: Path) -> None:
    assert staging({}) == Staging(memory_bytes=64 * 1024 * 1024, spool_dir=None)
    options = {"stage_memory_bytes": "0", "stage_dir": f" {tmp_path} "}
    assert staging(options) == Staging(memory_bytes=0, spool_dir=str(tmp_path))
    with pytest.raises(ConfigError, match="option 'stage_memory_bytes' must be >= 0, got -1"):
        staging({"stage_memory_bytes": "-1"})
    with pytest.raises(ConfigError, match="option 'stage_memory_bytes' must be an integer"):
        staging({"stage_memory_bytes": "64MiB"})
    with pytest.raises(ConfigError, match="option 'stage_dir' must be a directory path"):
        staging({"stage_dir": " "})


def test_the_spool_goes_to_the_first_of_spark_local_dirs(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("SPARK_LOCAL_DIRS", f"{tmp_path},/elsewhere")
    assert default_spool_dir() == str(tmp_path)
    monkeypatch.delenv("SPARK_LOCAL_DIRS")
    assert default_spool_dir()  # the system's temporary directory


def test_a_spool_that_cannot_be_written_names_its_directory_and_option(tmp_path: Path) -> None:
    missing = tmp_path / "missing"
    with StagedRecords(Staging(memory_bytes=0, spool_dir=str(missing))) as staged:
        with pytest.raises(
            OSError, match=r"cannot spool encoded records to .*missing.*'stage_dir'"
        ):
            staged.add(b"s", b"v")
        assert len(staged) == 0
