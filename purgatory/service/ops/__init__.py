"""What an operator looks at: the operator's page data (``overview``), the recent outcomes and
dead letters (``recent``) and ``purgatory top`` (``top``). It reads the other stages; nothing
below imports it.
"""
