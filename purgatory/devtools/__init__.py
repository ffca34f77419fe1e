"""Development tooling: not part of ``purgatory serve`` (nothing in :mod:`purgatory.service`
imports it but the ``dev`` and ``demo`` commands, lazily).

It takes a machine with nothing running and gives a broker and a service to try or test against:
the embedded broker (Tansu, the ``devbroker`` extra) and Apache Kafka (``make kafka``'s jars)
behind one contract (``broker``, ``kafka_broker``), the broker a development command starts and
watches (``dev_broker``), ``purgatory dev`` itself (``dev``), a ``purgatory serve`` child process
for demos and tests (``child``), and the engine-only demo (``demo``).
"""
