"""Who is calling (service layer): bearer tokens, each with a client name.

The API is closed unless asked to be open. A replica is given its clients' tokens, each with a
name (``PURGATORY_API_TOKENS``: ``name=token,...``; ``PURGATORY_API_TOKEN`` alone is the client
``default``). A request to an authenticated route must carry ``Authorization: Bearer <token>``;
the token is compared with every known one in constant time (SHA-256 digests compared with
:func:`hmac.compare_digest`, all of them, whichever matches: neither the length of a token nor
which one matched shows in the timing). The matching name is the client's identity: it labels the
request's log line and metrics, and its quotas are counted under it.

With no token configured the API is open and every caller is the client ``anonymous``; the
service refuses to listen beyond loopback that way unless ``PURGATORY_ALLOW_UNAUTHENTICATED`` says
so (see ``Settings``), and logs a warning at start when it does.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Mapping

from purgatory.service.telemetry.logging import get_logger

__all__ = ["ANONYMOUS", "AuthError", "Authenticator"]

_log = get_logger()

ANONYMOUS = "anonymous"
_SCHEME = "bearer "


class AuthError(Exception):
    """The request carries no valid bearer token (answered 401, naming ``Authorization``)."""


class Authenticator:
    """Maps a request's ``Authorization`` header to the client's name.

    Args:
        tokens: ``{client name: token}``; empty: the API is open.
    """

    def __init__(self, tokens: Mapping[str, str]) -> None:
        self._digests = [(name, _digest(token)) for name, token in sorted(tokens.items())]

    @property
    def enabled(self) -> bool:
        """Whether a token is required."""
        return bool(self._digests)

    @property
    def clients(self) -> list[str]:
        """The names of the known clients (``anonymous`` when the API is open)."""
        return [name for name, _ in self._digests] or [ANONYMOUS]

    def warn_if_open(self, addresses: list[str]) -> None:
        """Log ``api_open`` (a warning) if no token is required on ``addresses``."""
        if not self._digests:
            _log.warning(
                "api_open",
                http=addresses,
                detail="no API token is set: anyone who reaches these addresses can"
                " register and cancel any operation",
            )

    def identify(self, authorization: str | None) -> str:
        """The calling client's name.

        Raises:
            AuthError: a token is required and the header carries none that is known.
        """
        if not self._digests:
            return ANONYMOUS
        if authorization is None or authorization[: len(_SCHEME)].lower() != _SCHEME:
            raise AuthError("a valid bearer token is required")
        presented = _digest(authorization[len(_SCHEME) :].strip())
        found = None
        for name, digest in self._digests:  # every one, whichever matches: constant time
            if hmac.compare_digest(presented, digest):
                found = name
        if found is None:
            raise AuthError("a valid bearer token is required")
        return found


def _digest(token: str) -> bytes:
    return hashlib.sha256(token.encode("utf-8", "surrogateescape")).digest()
