"""Forwarding a request to the replica that owns its scope (service layer): where to send
it, sending it (whole, or a batch's items by owner), and passing the owner's answer on.

The HTTP side of :mod:`purgatory.service.ownership.forward`: a request already forwarded is
never forwarded again, a batch is split by owner (:func:`split_by_owner`) and each owner sent
its items in one request (:func:`forward_parts`). An owner that does not answer in time raises
:class:`~purgatory.service.errors.OwnerUnansweredError`, which the one error mapping answers;
an owner that refuses its part of a batch answers for the whole batch
(:class:`ForwardRefusedError`).
"""

from __future__ import annotations

import json
from typing import Any

from starlette.requests import Request
from starlette.responses import Response

from purgatory.service.errors import OwnerUnansweredError
from purgatory.service.ingress.http.context import RequestContext
from purgatory.service.ownership.forward import FORWARDED_BY, Forwarded

__all__ = [
    "ForwardRefusedError",
    "forward_parts",
    "forward_to_owner",
    "owner_response",
    "owner_url_for",
    "split_by_owner",
]


class ForwardRefusedError(Exception):
    """An owner did not take its part of a batch: its answer is the batch's.

    Args:
        answer: the owner's answer (not a 200).
    """

    def __init__(self, answer: Forwarded) -> None:
        super().__init__(answer.status)
        self.answer = answer


def owner_url_for(ctx: RequestContext, request: Request, partition: int) -> str | None:
    """Where to forward a request for ``partition``: None to answer here (no forwarder, a
    request already forwarded, or no other owner known)."""
    if ctx.config.forwarder is None or FORWARDED_BY in request.headers:
        return None
    owners = ctx.config.owners
    return owners.url_of(partition) if owners is not None else None


async def forward_to_owner(
    ctx: RequestContext, request: Request, url: str, raw: bytes | None, *, extra_s: float = 0.0
) -> Forwarded:
    """Send ``request`` to the owner at ``url``, with the body ``raw``.

    Args:
        extra_s: a long poll's own wait, added to the forwarder's bound.

    Raises:
        OwnerUnansweredError: the owner did not answer within the bound.
    """
    assert ctx.config.forwarder is not None
    return await ctx.config.forwarder.send(
        url,
        method=request.method,
        path=request.url.path,
        query=request.url.query,
        headers=request.headers,
        body=raw,
        extra_s=extra_s,
    )


def split_by_owner(
    ctx: RequestContext, request: Request, scopes: list[str]
) -> tuple[list[int], dict[str, list[int]]]:
    """The batch's item indexes to apply here, and those to forward, by owner URL."""
    local: list[int] = []
    remote: dict[str, list[int]] = {}
    serving = ctx.table.serving()
    for index, scope in enumerate(scopes):
        partition = ctx.table.partition_of(scope)
        url = None if partition in serving else owner_url_for(ctx, request, partition)
        if url is None:
            local.append(index)
        else:
            remote.setdefault(url, []).append(index)
    return local, remote


async def forward_parts(
    ctx: RequestContext, request: Request, payload: Any, name: str, remote: dict[str, list[int]]
) -> list[tuple[list[int], Forwarded | OwnerUnansweredError]]:
    """Send each owner its items of the batch ``payload[name]`` (as they came, in one request
    per owner); each owner's indexes and answer, or the error of an owner that did not
    answer. The one place a batch is forwarded: the callers decide what an owner's failure
    means (an item's 503, or the whole batch's)."""
    answers: list[tuple[list[int], Forwarded | OwnerUnansweredError]] = []
    for url, indexes in remote.items():
        sub = json.dumps({name: [payload[name][i] for i in indexes]}).encode()
        try:
            answers.append((indexes, await forward_to_owner(ctx, request, url, sub)))
        except OwnerUnansweredError as exc:
            answers.append((indexes, exc))
    return answers


def owner_response(answered: Forwarded) -> Response:
    """The owner's answer, as this replica's."""
    response = Response(answered.body, status_code=answered.status)
    for name, value in answered.headers.items():
        response.headers[name] = value
    return response
