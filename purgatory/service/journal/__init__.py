"""Durability: every input journaled before anything it caused leaves the process.

It takes the entries the engines report and the outcomes they decided, appends them in
group-committed batches to the changelog (``changelog``, its record format in ``format``), or in
one Kafka transaction per partition (``transactional``), and gives outcomes to egress once the
broker acknowledged them (``release``). A partition taken is rebuilt from its latest snapshot
(:mod:`purgatory.service.snapshots`) and the journal after it (``restore``).
"""
