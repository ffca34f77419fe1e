"""A writer task's encoded records, held until its whole partition is encoded (spark_bridge layer).

Theory of operation. A sink task must not publish anything of a partition that holds a bad row:
the row's ``RowError`` fails the task, and records it had already sent would stay on the topic
and be sent again by the retry. So a task encodes (and so validates) every row of its partition
first, into :class:`StagedRecords`, and only then hands them to the producer. Spark gives the
task its rows as an iterator it can read once, so the encoded records have to be kept, and
memory stays bounded by a byte budget (``stage_memory_bytes``, 64 MiB by default): records are
kept in memory while the budget holds, and every record after the first that would exceed it
goes, in order, to an anonymous temporary file (the spool, in ``stage_dir``, by default the
first of Spark's local directories). Sending reads the memory part, then the spool, so records
leave in the rows' order. The file is unlinked at creation and closed with the task, so nothing
is left behind, not even when the worker dies.

Worked example: a budget of 300 bytes and records of 10 + 60 bytes each cost
``70 + RECORD_OVERHEAD_BYTES`` (the two ``bytes`` objects, their tuple and the list slot: 200 on
64-bit CPython 3.11), so the first record stays in memory (200 <= 300), the second would make
400 and goes to the spool, and so does every later one, even a smaller one, to keep the order.
"""

from __future__ import annotations

import os
import struct
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from types import TracebackType
from typing import IO

__all__ = [
    "DEFAULT_MEMORY_BYTES",
    "RECORD_OVERHEAD_BYTES",
    "StagedRecords",
    "Staging",
    "default_spool_dir",
]

#: The default budget of encoded records a task keeps in memory before it spools the rest.
DEFAULT_MEMORY_BYTES = 64 * 1024 * 1024
#: What CPython spends on one kept record beyond its key and value bytes: the two ``bytes``
#: objects' headers, the ``(key, value)`` tuple and its slot in the list.
RECORD_OVERHEAD_BYTES = 2 * sys.getsizeof(b"") + sys.getsizeof((b"", b"")) + 8
# A spooled record: key length, value length (unsigned 32-bit, big-endian), key, value.
_FRAME = struct.Struct(">II")
_SPOOL_BUFFER_BYTES = 1 << 20


@dataclass(frozen=True, slots=True)
class Staging:
    """How a task holds its encoded records before it sends them.

    Attributes:
        memory_bytes: the budget kept in memory (``stage_memory_bytes``); 0 spools everything.
        spool_dir: where the spool file goes (``stage_dir``); None: :func:`default_spool_dir`.
    """

    memory_bytes: int = DEFAULT_MEMORY_BYTES
    spool_dir: str | None = None


def default_spool_dir() -> str:
    """The first of Spark's local directories (``SPARK_LOCAL_DIRS``, which Spark sets for its
    Python workers, as PySpark's own spills use), else the system's temporary directory."""
    local_dirs = os.environ.get("SPARK_LOCAL_DIRS", "")
    first = local_dirs.split(",", 1)[0].strip()
    return first or tempfile.gettempdir()


class StagedRecords:
    """``(key, value)`` records kept in order: in memory up to a budget, then in a spool file.

    Iterating yields them in the order they were added (it may be repeated). A context manager:
    leaving it closes (and so removes) the spool.
    """

    def __init__(self, staging: Staging) -> None:
        self._staging = staging
        self._kept: list[tuple[bytes, bytes]] = []
        self._kept_bytes = 0
        self._spool: IO[bytes] | None = None
        self._spooled = 0

    @property
    def memory_bytes(self) -> int:
        """What the records kept in memory cost, overhead included (at most the budget)."""
        return self._kept_bytes

    @property
    def spooled(self) -> int:
        """How many records went to the spool file."""
        return self._spooled

    def __len__(self) -> int:
        return len(self._kept) + self._spooled

    def add(self, key: bytes, value: bytes) -> None:
        """Keep one record after those already added.

        Raises:
            OSError: the spool file could not be created or written, naming the directory and
                the option ``stage_dir``.
        """
        if self._spool is None:
            cost = len(key) + len(value) + RECORD_OVERHEAD_BYTES
            if self._kept_bytes + cost <= self._staging.memory_bytes:
                self._kept.append((key, value))
                self._kept_bytes += cost
                return
        try:
            if self._spool is None:
                self._spool = tempfile.TemporaryFile(  # noqa: SIM115 - closed by close()
                    dir=self._spool_dir(), prefix="purgatory-stage-", buffering=_SPOOL_BUFFER_BYTES
                )
            self._spool.write(_FRAME.pack(len(key), len(value)))
            self._spool.write(key)
            self._spool.write(value)
        except OSError as e:
            raise OSError(
                e.errno,
                f"cannot spool encoded records to {self._spool_dir()!r} (option 'stage_dir'; "
                f"option 'stage_memory_bytes' is {self._staging.memory_bytes}): {e.strerror}",
            ) from e
        self._spooled += 1

    def _spool_dir(self) -> str:
        return self._staging.spool_dir or default_spool_dir()

    def __iter__(self) -> Iterator[tuple[bytes, bytes]]:
        yield from self._kept
        spool = self._spool
        if spool is None:
            return
        spool.flush()
        spool.seek(0)
        read, header_bytes = spool.read, _FRAME.size
        for _ in range(self._spooled):
            header = read(header_bytes)
            assert len(header) == header_bytes, "the spool file is shorter than what was added"
            key_bytes, value_bytes = _FRAME.unpack(header)
            yield read(key_bytes), read(value_bytes)
        spool.seek(0, os.SEEK_END)

    def close(self) -> None:
        """Drop the records and remove the spool file."""
        self._kept = []
        self._kept_bytes = 0
        if self._spool is not None:
            self._spool.close()
            self._spool = None
        self._spooled = 0

    def __enter__(self) -> StagedRecords:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
