"""Durability: every input journaled before anything it caused leaves the process.

It takes the entries the engines report and the outcomes they decided, appends them in
group-committed batches to the changelog (``changelog``), and gives outcomes to egress once the
broker acknowledged them. A partition taken is rebuilt from its latest snapshot and the journal
after it (``restore``); snapshots (``snapshots``) are written by a supervised child process
(``snapshotter``, ``supervisor``) and watched for age (``snapshot_watch``).
"""
