"""The bridge's Origin policy, without sockets: same-origin default, lists, ``*``, oddities."""

from __future__ import annotations

import pytest

from asr_bridge.origin import OriginConfigError, OriginPolicy, parse_origin


@pytest.mark.parametrize(
    ("text", "parsed"),
    [
        ("http://localhost:8080", ("http", "localhost", 8080)),
        ("HTTPS://App.Example.org", ("https", "app.example.org", 443)),
        ("https://app.example.org:443/", ("https", "app.example.org", 443)),
        ("http://[::1]:8080", ("http", "::1", 8080)),
        ("null", None),  # sandboxed frames and file: pages
        ("https://app.example.org/page", None),
        ("ftp://example.org", None),
        ("http://host:99999", None),
        ("http://user@host", None),
        ("", None),
    ],
)
def test_parse_origin(text: str, parsed: tuple[str, str, int] | None) -> None:
    assert parse_origin(text) == parsed


@pytest.mark.parametrize(
    ("origin", "host", "scheme", "allowed"),
    [
        ("http://127.0.0.1:8080", "127.0.0.1:8080", "ws", True),
        ("https://asr.example.org", "asr.example.org", "wss", True),
        ("https://asr.example.org", "asr.example.org:443", "wss", True),  # default port
        ("http://asr.example.org", "asr.example.org:80", "ws", True),
        ("https://asr.example.org", "asr.example.org", "ws", False),  # scheme-aware
        ("http://asr.example.org", "asr.example.org", "wss", False),
        ("http://127.0.0.1:8081", "127.0.0.1:8080", "ws", False),  # another port
        ("http://localhost:8080", "127.0.0.1:8080", "ws", False),  # another name
        ("https://evil.example", "asr.example.org", "wss", False),
        ("null", "asr.example.org", "wss", False),
        ("http://127.0.0.1:8080", None, "ws", False),  # no Host: nothing to be the same as
        (None, "asr.example.org", "wss", True),  # not a browser: the token guards it
    ],
)
def test_same_origin_by_default(
    origin: str | None, host: str | None, scheme: str, allowed: bool
) -> None:
    assert OriginPolicy().allows(origin, host, scheme) is allowed


def test_a_list_replaces_same_origin_and_star_allows_any() -> None:
    policy = OriginPolicy.from_list(["https://app.example.org", " http://localhost:3000/ ", ""])
    assert policy.allows("https://app.example.org", "asr.internal:8080", "ws")
    assert policy.allows("http://localhost:3000", "asr.internal:8080", "ws")
    assert not policy.allows("http://asr.internal:8080", "asr.internal:8080", "ws")
    assert not policy.allows("https://evil.example", "asr.internal:8080", "ws")
    anyone = OriginPolicy.from_list(["*"])
    assert anyone.allows("https://evil.example", "asr.internal:8080", "ws")
    assert anyone.allows("null", "asr.internal:8080", "ws")


@pytest.mark.parametrize("bad", ["app.example.org", "https://app.example.org/ui", "ws://a:1"])
def test_an_origin_that_cannot_match_is_a_config_error(bad: str) -> None:
    with pytest.raises(OriginConfigError, match="--allowed-origin"):
        OriginPolicy.from_list([bad])


def test_the_token_is_read_from_every_place_a_client_may_put_it() -> None:
    from asr_bridge.auth import presented_token

    assert presented_token({}, [], {"authorization": "Bearer abc"}) == "abc"  # OpenAI SDKs
    assert presented_token({}, [], {"authorization": "Token abc"}) == "abc"  # Deepgram SDKs
    assert presented_token({}, ["openai-insecure-api-key.abc"]) == "abc"  # OpenAI in a browser
    assert presented_token({}, ["streamasr.v1", "bearer.abc"]) == "abc"
    assert presented_token({}, ["token", "abc"]) == "abc"  # Deepgram in a browser
    assert presented_token({}, ["bearer", "jwt.x.y"]) == "jwt.x.y"  # ... a temporary token
    assert presented_token({}, ["token"]) is None
    assert presented_token({"token": "abc"}, []) == "abc"
    assert presented_token({"token": "q"}, [], {"authorization": "Basic x"}) == "q"
    assert presented_token({}, [], {"authorization": "Bearer "}) is None


def test_a_key_offered_as_subprotocols_is_answered_with_its_scheme() -> None:
    """Browsers drop a socket whose server picks none of the subprotocols they offered."""
    from asr_bridge.auth import key_subprotocol

    assert key_subprotocol(["token", "abc"]) == "token"
    assert key_subprotocol(["bearer", "abc"]) == "bearer"
    assert key_subprotocol(["token"]) is None
    assert key_subprotocol(["streamasr.v1", "bearer.abc"]) is None
    assert key_subprotocol([]) is None
