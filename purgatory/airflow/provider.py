"""What Airflow's providers manager reads of this package (airflow integration: discovery).

``pyproject.toml`` names :func:`get_provider_info` under the ``apache_airflow_provider`` entry
point, so an Airflow environment with ``purgatory[airflow]`` installed lists the ``purgatory``
connection type (its form: the service's URL and the API token, masked) and the trigger.
"""

from __future__ import annotations

from typing import Any

__all__ = ["get_provider_info"]


def get_provider_info() -> dict[str, Any]:
    """The provider's description, in the shape of Airflow's ``provider_info`` schema."""
    return {
        "package-name": "purgatory",
        "name": "Purgatory",
        "description": "Wait on purgatory operations (barriers over watch keys with deadlines)"
        " from deferrable tasks, and signal their keys.",
        "connection-types": [
            {
                "connection-type": "purgatory",
                "hook-class-name": "purgatory.airflow.hooks.PurgatoryHook",
                "hook-name": "Purgatory",
                "ui-field-behaviour": {
                    "hidden-fields": ["login", "schema", "port", "extra"],
                    "relabeling": {"host": "Service URL", "password": "API token"},
                    "placeholders": {"host": "http://purgatory.data.svc:8080"},
                },
            }
        ],
        "triggers": [
            {
                "integration-name": "Purgatory",
                "python-modules": ["purgatory.airflow.triggers"],
            }
        ],
    }
