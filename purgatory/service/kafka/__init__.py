"""The broker seam: every byte to and from Kafka crosses here.

``transport`` is the seam the rest of the service sees (an in-memory fake replaces it in tests);
``clients`` implements it with kafka-python: a consumer thread (``source``), a producer thread
(``sink``), a reader of whole partitions (``reader``), their configuration (``config``) and the
group's partition assignor (``assignor``).
"""
