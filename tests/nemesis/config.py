"""One run's configuration, as the root side hands it to the orchestration inside the lab.

The root side (:mod:`tests.nemesis.run`) makes the lab and writes this as ``config.json`` in the
run's directory; the orchestration (:mod:`tests.nemesis.inside`), started in the lab's client
namespace, reads it back. Everything a run does follows from it: the seed makes the plan.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.nemesis.plan import Plan, Shape, make_plan

__all__ = ["DELIVERIES", "RunConfig"]

DELIVERIES = ("acknowledged", "transactional")


@dataclass(frozen=True, slots=True)
class RunConfig:
    """A run: its lab, seed, delivery mode, faults, shape and output directory.

    Attributes:
        prefix: the lab's namespace prefix.
        seed: the seed of the plan.
        delivery: ``acknowledged`` or ``transactional``.
        kinds: the fault kinds in order (empty: a seeded order of all of them).
        shape: the run's durations and rates.
        out: the run's output directory.
    """

    prefix: str
    seed: int
    delivery: str
    kinds: tuple[str, ...]
    shape: Shape
    out: Path

    def plan(self) -> Plan:
        return make_plan(self.seed, self.shape, self.kinds)

    def save(self) -> Path:
        """Write ``config.json`` in the run's directory; its path."""
        doc = dataclasses.asdict(self)
        doc["out"] = str(self.out)
        path = self.out / "config.json"
        path.write_text(json.dumps(doc, indent=2) + "\n")
        return path

    @classmethod
    def load(cls, path: Path) -> RunConfig:
        doc = json.loads(path.read_text())
        fields: dict[str, Any] = {
            k: tuple(v) if isinstance(v, list) else v for k, v in doc["shape"].items()
        }
        shape = Shape(**fields)
        return cls(
            prefix=doc["prefix"],
            seed=doc["seed"],
            delivery=doc["delivery"],
            kinds=tuple(doc["kinds"]),
            shape=shape,
            out=Path(doc["out"]),
        )
