"""The API against its own served OpenAPI document, with schemathesis: no 5xx, and every status,
media type, header and body as documented.

The service's parts run over the in-memory broker in a thread of their own (trio, real time),
served by hypercorn's trio worker on a loopback port, as in production; schemathesis loads the
document from ``/openapi.json`` there and sends its generated requests to that port.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Iterator
from functools import partial
from typing import Any

import pytest
import schemathesis
import trio
from hypercorn.trio import serve
from hypothesis import HealthCheck, given, settings
from schemathesis import GenerationMode
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_headers_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from purgatory.service.ingress.http.routes import ROUTES
from purgatory.service.ingress.http.server import server_config
from purgatory.service.ingress.http.table import ApiRoute
from purgatory.service.settings import Settings
from reaper import Clock
from tests.service.ingress.test_http import serving

EXAMPLES = 50  # per route and mode (20 runs): well under a minute on 2 cores
CHECKS = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_headers_conformance,
    response_schema_conformance,
]


async def _serve_api(started: queue.Queue[str], stop: threading.Event) -> None:
    """The service over the in-memory broker, its API on a loopback port, until ``stop``."""
    settings_ = Settings.from_env(
        {},
        max_pending_per_scope=50,
        max_request_bytes=20_000,
        max_batch=10,
        max_wait_ms=100,  # a generated long poll may find a generated operation: keep it short
        max_deadline_ahead_ms=86_400_000,
        topic_partitions=1,
    )
    async with serving(settings_, Clock()) as (service, _):
        hypercorn = server_config("127.0.0.1:0", max_wait_ms=100, graceful_timeout_s=0.1)
        stopped = trio.Event()
        async with trio.open_nursery() as nursery:
            asgi: Any = service.app  # hypercorn's framework type does not name Starlette
            bound = await nursery.start(
                partial(serve, asgi, hypercorn, shutdown_trigger=stopped.wait)
            )
            started.put(bound[0])
            while not stop.is_set():
                await trio.sleep(0.05)
            stopped.set()


@pytest.fixture(scope="module")
def base_url() -> Iterator[str]:
    started: queue.Queue[str] = queue.Queue()
    stop = threading.Event()
    thread = threading.Thread(target=trio.run, args=(_serve_api, started, stop), daemon=True)
    thread.start()
    try:
        yield started.get(timeout=30)
    finally:
        stop.set()
        thread.join(timeout=30)


@pytest.fixture(scope="module")
def api_schema(base_url: str) -> schemathesis.BaseSchema:
    return schemathesis.openapi.from_url(f"{base_url}/openapi.json")


# Every route with what schemathesis generates from its document; and, for a route that takes
# input, what the document says is wrong (which must be a documented 4xx, never a 5xx).
RUNS = [
    pytest.param(route, mode, id=f"{route.method} {route.path} {mode.value}")
    for route in ROUTES
    for mode in GenerationMode
    if mode is GenerationMode.POSITIVE or route.params or route.body is not None
]


@pytest.mark.parametrize(("route", "mode"), RUNS)
def test_the_api_answers_as_its_document_says(
    api_schema: schemathesis.BaseSchema, route: ApiRoute, mode: GenerationMode
) -> None:
    operation = api_schema[route.path][route.method]

    @given(case=operation.as_strategy(generation_mode=mode))
    @settings(
        max_examples=EXAMPLES,
        deadline=None,
        database=None,
        derandomize=True,
        suppress_health_check=list(HealthCheck),
    )
    def answers_as_documented(case: schemathesis.Case[Any]) -> None:
        case.call_and_validate(checks=CHECKS)

    answers_as_documented()
