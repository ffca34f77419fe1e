"""spark_bridge: PySpark data sources that publish signals and read callbacks through Kafka.

Not built yet: the package exists so the layout and its import contract (it never imports the
service) are in place from the start.
"""

__all__: list[str] = []
