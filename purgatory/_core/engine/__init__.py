"""The engine: operations over signals, one outcome each (core concept; sans-IO, stdlib only).

``engine`` composes the wheel, the keyed timers and the TTL state into ``Engine``; ``model`` holds
what clients register and what they get back, ``engine_types`` its configuration, results and
statistics, ``budget`` the byte estimates its limits use (with ``footprint``'s formulas),
``views`` the operators' read-only views in bounded steps, ``sorted_ids`` the pages' index, and
``validate`` the checks every input passes.
"""
