"""The trio shell around the core: HTTP API, Kafka intake and callbacks, metrics, logs, CLI.

Imports trio, Kafka and the web stack; the core never does. The composition root is
:func:`run_service`; the command line is :func:`main` (``purgatory serve|dev|op|signal|...``).
"""

from purgatory.service._app import run_service
from purgatory.service._cli import main
from purgatory.service._demo import DemoResult, run_demo
from purgatory.service._settings import Settings

__all__ = ["DemoResult", "Settings", "main", "run_demo", "run_service"]
