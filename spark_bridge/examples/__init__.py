"""Example Spark jobs on purgatory, runnable as they are against a running service.

* :mod:`spark_bridge.examples.barrier`: three upstream batch jobs each signal
  ``ingest/<name>@<run>`` when done; a downstream job waits on a barrier with a deadline and
  proceeds on ``completed``, or reports the missing keys on ``expired``.
* :mod:`spark_bridge.examples.inactivity`: a streaming job over event-time data re-arms one
  inactivity timer per entity and publishes its watermark; a second streaming query reads the
  callbacks and writes the closed sessions.

``purgatory-pipeline`` (``make demo``) runs both end to end on an embedded broker and a local
service.
"""
