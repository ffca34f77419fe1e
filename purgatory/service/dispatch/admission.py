"""Client quotas and the memory budget (service layer): who holds what, and what may be added.

The engines limit what a scope holds (``EngineConfig``); this module limits what a *client*
holds, across scopes and partitions, and what the whole replica holds, so that one client spread
over many scopes cannot lock everyone else out, and a replica refuses work (429, Retry-After)
rather than being OOM-killed with every operation it holds. Both are decided here, before the
engine is called: an input they refuse is not journaled, so a replay never meets them.

Clients. The client of an input is a name: the HTTP bearer token's client name (``anonymous``
when the API is open, and when a caller names none), or ``kafka`` for the records consumed from
the input topics. The client of an operation is the one that registered it; it holds the
operation (one operation, and the engine's estimate of its bytes, see
:mod:`purgatory._core.engine.footprint`) until its outcome is decided (completed, expired,
cancelled)
or its partition is taken away. ``max_pending_per_client`` and ``max_pending_bytes_per_client``
(0: no limit) refuse a registration that would take its client over them. A retry or a re-arm of
an operation already pending adds nothing and is never refused here.

Remembered signals are not charged to a client: a signal is a fact that every operation
watching its key shares, usually published by another client than the ones waiting for it. The
engines bound them per scope (``max_remembered_signals_per_scope``,
``max_remembered_bytes_per_scope``) and the memory budget bounds them all.

Restore. Who registered an operation is not journaled, so the operations of a restored
partition are held by the client ``restored``: they count in the memory budget, and no real
client's quota starts full because of them. Carrying the name would mean a new journal and
snapshot field for a bookkeeping that only shapes admission.

Memory budget. ``max_memory_bytes`` (0: none) is compared with the replica's estimate: a fixed
base (the interpreter and the libraries: ``MEMORY_BASE_BYTES``) plus every served engine's
estimate (pending, remembered and finished state) plus what this module keeps per owned
operation (``OWNER_BYTES``). A registration or a signal that would take the estimate over it is
refused, except a signal that a pending operation awaits: it is what lets held memory go (the
operation completes), and what such signals hold is bounded by the keys of the operations
admitted. A signal that replaces a remembered one without growing it is never refused either.
A refused Kafka record is dead-lettered with the reason, which names the limit (nothing is
lost: the dead-letter topic keeps it, to be produced again once memory is back).

``OWNER_BYTES`` was measured with ``tracemalloc`` on CPython 3.11 (100,000 owners of freshly
decoded scopes and op_ids in one dict, 196 bytes each, rounded up). ``MEMORY_BASE_BYTES`` is the
resident size of a process that imported the service's modules (56 MiB on CPython 3.11,
``ru_maxrss``), rounded up for the threads and buffers of a running service.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence

from purgatory._core import Engine, LimitError, OperationSpec, Outcome, UsageError

__all__ = [
    "ANONYMOUS_CLIENT",
    "KAFKA_CLIENT",
    "MEMORY_BASE_BYTES",
    "OWNER_BYTES",
    "RESTORED_CLIENT",
    "Admission",
]

ANONYMOUS_CLIENT = "anonymous"
KAFKA_CLIENT = "kafka"
RESTORED_CLIENT = "restored"
MEMORY_BASE_BYTES = 64 << 20
OWNER_BYTES = 200


class Admission:
    """Decides whether an input may add state, and follows which client holds what.

    Args:
        engines: the engines served now (called at each decision).
        max_pending_per_client: operations one client may hold pending (0: no limit).
        max_pending_bytes_per_client: estimated bytes of them (0: no limit).
        max_memory_bytes: the replica's memory budget (0: none); more than the base.
        memory_base_bytes: the fixed part of the estimate.

    Raises:
        UsageError: a limit is negative, or the budget is not above the base.
    """

    def __init__(
        self,
        engines: Callable[[], Iterable[Engine]],
        *,
        max_pending_per_client: int = 0,
        max_pending_bytes_per_client: int = 0,
        max_memory_bytes: int = 0,
        memory_base_bytes: int = MEMORY_BASE_BYTES,
    ) -> None:
        limits = {
            "max_pending_per_client": max_pending_per_client,
            "max_pending_bytes_per_client": max_pending_bytes_per_client,
            "max_memory_bytes": max_memory_bytes,
            "memory_base_bytes": memory_base_bytes,
        }
        for name, value in limits.items():
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise UsageError(f"{name} must be an int >= 0, got {value!r}")
        if 0 < max_memory_bytes <= memory_base_bytes:
            raise UsageError(
                f"max_memory_bytes must be 0 (no budget) or more than the base of "
                f"{memory_base_bytes} bytes, got {max_memory_bytes}"
            )
        self._engines = engines
        self._max_ops = max_pending_per_client
        self._max_bytes = max_pending_bytes_per_client
        self._budget = max_memory_bytes
        self._base = memory_base_bytes
        self._tracking = bool(max_pending_per_client or max_pending_bytes_per_client)
        # partition -> (scope, op_id) -> (client, estimated bytes); only with client quotas.
        self._owners: dict[int, dict[tuple[str, str], tuple[str, int]]] = {}
        self._usage: dict[str, list[int]] = {}  # client -> [operations, bytes]
        self._owned = 0

    # -- decisions ------------------------------------------------------------------------------

    def check_registration(self, engine: Engine, spec: OperationSpec, client: str) -> int:
        """Refuse ``spec`` if it would take ``client`` or the replica over a limit.

        Returns:
            The estimated bytes the operation holds (0 when no limit here needs it).

        Raises:
            LimitError: naming the limit in its message and its ``field``.
        """
        if not (self._tracking or self._budget) or engine.is_pending(spec.scope, spec.op_id):
            return 0
        size = engine.operation_bytes(spec)
        if self._tracking:
            count, held = self._usage.get(client, (0, 0))
            if self._max_ops and count + 1 > self._max_ops:
                raise LimitError(
                    f"max_pending_per_client ({self._max_ops}) reached by client {client!r}",
                    field="max_pending_per_client",
                )
            if self._max_bytes and held + size > self._max_bytes:
                raise LimitError(
                    f"max_pending_bytes_per_client ({self._max_bytes}) would be exceeded by "
                    f"client {client!r}: its pending operations hold about {held} bytes, this "
                    f"one {size}",
                    field="max_pending_bytes_per_client",
                )
        if self._budget:
            self._check_budget(size, "this registration")
        return size

    def check_signal(self, engine: Engine, scope: str, key: str, payload: str | None) -> None:
        """Refuse a signal nobody awaits that would take the replica over its memory budget.

        Raises:
            LimitError: naming ``max_memory_bytes``.
        """
        if not self._budget:
            return
        growth = engine.signal_growth_bytes(scope, key, payload)
        if growth > 0 and not engine.awaits(scope, key):
            self._check_budget(growth, "remembering this signal")

    def _check_budget(self, size: int, what: str) -> None:
        held = self.memory_bytes()
        if held + size > self._budget:
            raise LimitError(
                f"max_memory_bytes ({self._budget}) would be exceeded: the replica holds "
                f"about {held} bytes, {what} {size} more; retry once operations finish",
                field="max_memory_bytes",
            )

    # -- bookkeeping ----------------------------------------------------------------------------

    def registered(self, partition: int, spec: OperationSpec, size: int, client: str) -> None:
        """``client`` registered ``spec``, now pending in ``partition`` (``size``: the bytes
        :meth:`check_registration` returned)."""
        if self._tracking:
            self._hold(partition, (spec.scope, spec.op_id), client, size)

    def finished(self, outcomes: Sequence[Outcome]) -> None:
        """Their operations are no longer pending: their clients hold them no more."""
        if not self._tracking:
            return
        for outcome in outcomes:
            owners = self._owners.get(outcome.partition)
            if owners is not None:
                owned = owners.pop((outcome.scope, outcome.op_id), None)
                if owned is not None:
                    self._release(*owned)

    def served(self, partition: int, engine: Engine) -> None:
        """``partition`` is served with ``engine``: its pending operations (restored) are held
        by the client ``restored``."""
        self.dropped(partition)
        if self._tracking:
            for spec in engine.pending():
                size = engine.operation_bytes(spec)
                self._hold(partition, (spec.scope, spec.op_id), RESTORED_CLIENT, size)

    def dropped(self, partition: int) -> None:
        """``partition`` is no longer served: nobody holds its operations here any more."""
        for owned in self._owners.pop(partition, {}).values():
            self._release(*owned)

    # -- queries --------------------------------------------------------------------------------

    def usage(self, client: str) -> tuple[int, int]:
        """The operations ``client`` holds pending, and their estimated bytes (with client
        quotas only; (0, 0) without)."""
        count, held = self._usage.get(client, (0, 0))
        return count, held

    def memory_bytes(self) -> int:
        """The replica's estimated memory: the base, the engines, this bookkeeping."""
        engines = sum(engine.memory_bytes for engine in self._engines())
        return self._base + engines + OWNER_BYTES * self._owned

    def _hold(self, partition: int, ident: tuple[str, str], client: str, size: int) -> None:
        owners = self._owners.setdefault(partition, {})
        previous = owners.get(ident)
        if previous is not None:
            self._release(*previous)
        owners[ident] = (client, size)
        usage = self._usage.setdefault(client, [0, 0])
        usage[0] += 1
        usage[1] += size
        self._owned += 1

    def _release(self, client: str, size: int) -> None:
        usage = self._usage[client]
        usage[0] -= 1
        usage[1] -= size
        if not usage[0]:
            del self._usage[client]
        self._owned -= 1
