"""A Jepsen-style nemesis: Apache Kafka and three replicas in network namespaces of their own,
faults in rounds, and a checker of the whole history against the callbacks topic.

It is how "one outcome per operation" is shown under cut links, pauses and slow links, not only
clean crashes. The pieces, in the order a run uses them: ``lab`` (the namespaces, the bridge and
the cuts), ``plan`` (everything a run does, from its seed), ``run`` (the root side: makes the
lab, starts ``inside`` in it, checks), ``inside`` (the orchestration in the lab's client
namespace: the broker, the ``replicas``, the ``workload``, the ``faults``, the ``topic`` read
back), ``history`` (what a client observed), ``checker`` and ``availability`` (the verdict),
``report`` (the table and the evidence). ``python -m tests.nemesis`` (``make nemesis``) runs it;
``test_nemesis`` runs a short form in the test suite.
"""
