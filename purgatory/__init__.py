"""purgatory: durable delayed operations for data pipelines.

The engine's public API, with Kafka's purgatory names in snake_case: exactly the names of
:mod:`purgatory._core`, re-exported. ``import purgatory`` imports only the sans-IO core: no
trio, no Kafka, no I/O.
"""

from purgatory import _core
from purgatory._core import *  # noqa: F403  (the list is purgatory._core.__all__)

__all__ = list(_core.__all__)
