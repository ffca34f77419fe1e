"""The trio shell around the core: the command line and the demo for now; the HTTP API, Kafka
clients, metrics and logs join it as the service grows. Imports trio; the core never does."""

from purgatory.service._cli import main
from purgatory.service._demo import DemoResult, run_demo

__all__ = ["DemoResult", "main", "run_demo"]
