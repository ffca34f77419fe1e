"""Metrics and logs, at the bottom: every stage reports here, and this imports none of them.

``metrics`` declares and serves the Prometheus metrics; ``logging`` configures structlog;
``layout_metrics`` and ``snapshot_metrics`` collect what the layout checks and the snapshot
watch report.
"""
