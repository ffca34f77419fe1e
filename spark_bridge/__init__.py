"""spark_bridge: Spark jobs and purgatory, through Kafka (data sources) and HTTP (the driver).

Driver-side helpers (:class:`Driver`: ``register``, ``signal``, ``wait_for`` as a barrier with
a deadline) talk to the service's HTTP API; the PySpark data sources for signals and callbacks
join them. The bridge never imports the service (an import-linter contract checks it).
"""

from spark_bridge._driver import BarrierTimeoutError, Driver

__all__ = ["BarrierTimeoutError", "Driver"]
