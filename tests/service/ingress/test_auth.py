"""Bearer tokens with client names; a replica that would serve an open API beyond loopback
refuses to start unless told to."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from purgatory._core import ConfigError
from purgatory.service.ingress.http.auth import ANONYMOUS, Authenticator, AuthError
from purgatory.service.settings import Settings

SPARK = "spark-token-0123456789"
CLI = "cli-token-0123456789abcdef"


def test_each_token_names_its_client() -> None:
    auth = Authenticator({"spark": SPARK, "cli": CLI})
    assert auth.enabled and auth.clients == ["cli", "spark"]
    assert auth.identify(f"Bearer {SPARK}") == "spark"
    assert auth.identify(f"bearer {CLI}") == "cli"  # the scheme is case-insensitive
    assert auth.identify(f"Bearer  {CLI} ") == "cli"


@pytest.mark.parametrize(
    "header",
    [None, "", SPARK, f"Basic {SPARK}", "Bearer ", f"Bearer {SPARK}x", f"Bearer {SPARK[:-1]}"],
)
def test_anything_but_a_known_token_is_refused(header: str | None) -> None:
    with pytest.raises(AuthError, match="bearer token"):
        Authenticator({"spark": SPARK}).identify(header)


@given(st.text(max_size=100))
def test_a_random_header_never_passes_nor_raises_anything_else(header: str) -> None:
    auth = Authenticator({"spark": SPARK})
    if header.strip() in (f"Bearer {SPARK}", f"bearer {SPARK}"):
        return
    with pytest.raises(AuthError):
        auth.identify(header)


def test_without_tokens_everyone_is_anonymous() -> None:
    auth = Authenticator({})
    assert not auth.enabled and auth.clients == [ANONYMOUS]
    assert auth.identify(None) == auth.identify("Bearer whatever") == ANONYMOUS


def test_settings_name_clients_and_refuse_ambiguity() -> None:
    settings = Settings(api_tokens=f"spark={SPARK}, cli={CLI}", api_token="d" * 16)
    assert settings.client_tokens() == {"spark": SPARK, "cli": CLI, "default": "d" * 16}
    with pytest.raises(ConfigError, match="PURGATORY_API_TOKENS: names a client twice"):
        Settings(api_tokens=f"spark={SPARK},spark={CLI}")
    with pytest.raises(ConfigError, match="PURGATORY_API_TOKENS: two clients share a token"):
        Settings(api_tokens=f"spark={SPARK},cli={SPARK}")
    with pytest.raises(ConfigError, match="PURGATORY_API_TOKEN: is the client 'default'"):
        Settings(api_tokens=f"default={SPARK}", api_token=CLI)
    with pytest.raises(ConfigError, match=r"^PURGATORY_API_TOKENS: must be a comma-separated"):
        Settings(api_tokens="spark=short")


@pytest.mark.parametrize("host", ["127.0.0.1", "::1", "[::1]", "localhost", "127.0.0.2"])
def test_an_open_api_on_loopback_is_fine(host: str) -> None:
    assert Settings(http_host=host).client_tokens() == {}


@pytest.mark.parametrize("host", ["0.0.0.0", "::", "10.1.2.3", "purgatory.svc"])
def test_an_open_api_beyond_loopback_is_asked_for_explicitly(host: str) -> None:
    with pytest.raises(ConfigError, match=r"^PURGATORY_API_TOKEN: required to listen on"):
        Settings(http_host=host)
    assert Settings(http_host=host, allow_unauthenticated=True).http_host == host
    assert Settings(http_host=host, api_tokens=f"spark={SPARK}").http_host == host
