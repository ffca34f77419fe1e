"""The trio shell around the core: HTTP API, Kafka intake and callbacks, metrics, logs, CLI.

Imports trio, Kafka and the web stack; the core never does, and nothing here knows of Spark
(an import-linter contract checks both). Public names:

* :func:`main` -- the command line, ``purgatory serve|snapshotter|dev|op|signal|watermark``
  and ``purgatory demo --engine`` (the whole-pipeline demo is :mod:`spark_bridge.demo`);
* :func:`run_service` -- the composition root: the service in a trio nursery, until stopped;
* :class:`Settings` -- every setting, read once from the ``PURGATORY_*`` environment.
"""

from purgatory.service.app import run_service
from purgatory.service.cli import main
from purgatory.service.settings import Settings

__all__ = ["Settings", "main", "run_service"]
