"""Child processes: the snapshotter started, reaped, restarted with backoff and counted.

``purgatory serve`` runs its snapshotter as a child process under a ``supervisor``, which starts
it, reaps it whatever ends it, restarts it after a backoff, and stops it when the service stops;
the child dies with its parent (``with_pdeathsig``).
"""
