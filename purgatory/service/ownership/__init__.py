"""Who serves which scope: partitions, owners and forwarding.

It takes a scope and gives its partition (``partitioning``), the replica that owns it
(``owners``), and forwards a request to that replica when it is another one (``forward``); it
checks that the topics' partition counts agree (``layout``).
"""
