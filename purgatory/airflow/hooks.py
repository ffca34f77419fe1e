"""The ``purgatory`` connection and its clients (airflow integration: the hook).

A connection of type ``purgatory`` holds the service's URL in *host* (``http://host:port``, or
a bare host name with the port in *port*) and the API token in *password*, so the token comes
from Airflow's connections or its secrets backend (``AIRFLOW_CONN_PURGATORY_DEFAULT`` included),
never from DAG code. ``purgatory_default`` is the connection used unless told.
"""

from __future__ import annotations

from typing import Any

from airflow.sdk import BaseHook

from purgatory.client import AsyncPurgatoryClient, PurgatoryClient

__all__ = ["PurgatoryHook", "base_url"]


def base_url(host: str | None, port: int | None) -> str:
    """The service's URL from a connection's *host* and *port* (``http`` unless given)."""
    if not host:
        raise ValueError("the purgatory connection has no host: set it to the service's URL")
    url = host if "://" in host else f"http://{host}"
    if port and url.count(":") < 2:
        url = f"{url}:{port}"
    return url.rstrip("/")


class PurgatoryHook(BaseHook):  # type: ignore[misc]
    """Clients of the service named by an Airflow connection.

    Args:
        purgatory_conn_id: the connection (type ``purgatory``).
        timeout_s: each request's timeout (a long poll adds its own length).
    """

    conn_name_attr = "purgatory_conn_id"
    default_conn_name = "purgatory_default"
    conn_type = "purgatory"
    hook_name = "Purgatory"

    def __init__(self, purgatory_conn_id: str = default_conn_name, timeout_s: float = 30.0):
        super().__init__()
        self.purgatory_conn_id = purgatory_conn_id
        self.timeout_s = timeout_s

    def get_conn(self) -> PurgatoryClient:
        """A blocking client (close it, or use it in a ``with`` block)."""
        conn = self.get_connection(self.purgatory_conn_id)
        return PurgatoryClient(
            base_url(conn.host, conn.port), token=conn.password or None, timeout_s=self.timeout_s
        )

    async def get_async_conn(self) -> AsyncPurgatoryClient:
        """An async client, for a trigger (reads the connection without blocking the loop)."""
        conn = await self.aget_connection(self.purgatory_conn_id)
        return AsyncPurgatoryClient(
            base_url(conn.host, conn.port), token=conn.password or None, timeout_s=self.timeout_s
        )

    def signal(self, scope: str, key: str, *, payload: Any = None) -> Any:
        """Publish one signal: ``key`` happened in ``scope``."""
        with self.get_conn() as client:
            return client.signal(scope, key, payload=payload)
