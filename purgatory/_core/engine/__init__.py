"""The engine: operations over signals, one outcome each (core concept; sans-IO, stdlib only).

``engine`` composes the wheel, the keyed timers and the TTL state into ``Engine``, with three
parts of its own that it builds and owns: ``lifecycle`` (holding, re-arming and finishing pending
operations), ``budget`` (the limits on what is held) and ``views`` (the read side: queries and
operators' views in bounded steps); ``state`` holds what they share (the clock and outcome
counters, the tally of what is held in estimated bytes by ``footprint``'s formulas, and the
record of the live collections). ``model`` holds what clients register and what they get back,
``engine_types`` its configuration, results, statistics and per-operation records,
``sorted_ids`` the pages' index, and ``validate`` the checks every input passes.
"""
