"""The bridge's access token: where a browser may present it and how it is compared.

Browsers cannot set headers on a WebSocket, so the token travels either as a
subprotocol (``bearer.<token>`` beside ``streamasr.v1``; not logged by proxies) or as
the ``token`` query parameter (easy, but query strings end up in access logs). Server-side
SDKs of the hosted APIs the bridge stands in for send it as a header instead:
``Authorization: Bearer <token>`` (OpenAI) or ``Authorization: Token <token>`` (Deepgram);
OpenAI's browser client uses the subprotocol ``openai-insecure-api-key.<token>``, and
Deepgram's browser examples and SDK two subprotocols, the scheme and then the key:
``["token", <key>]`` (or ``["bearer", <temporary token>]``).
"""

from __future__ import annotations

import hmac
from collections.abc import Mapping, Sequence

BEARER_PREFIX = "bearer."
OPENAI_KEY_PREFIX = "openai-insecure-api-key."
_AUTH_SCHEMES = ("bearer", "token")


def _key_pair(subprotocols: Sequence[str]) -> tuple[str, str] | None:
    """Deepgram's browser authentication: a scheme subprotocol, then the key as the next."""
    for scheme, value in zip(subprotocols, subprotocols[1:], strict=False):
        if scheme.lower() in _AUTH_SCHEMES and value:
            return scheme, value
    return None


def key_subprotocol(subprotocols: Sequence[str]) -> str | None:
    """The subprotocol to answer a ``[scheme, key]`` pair with: the scheme, as Deepgram's
    API does (a browser drops a socket whose server chooses none it offered)."""
    pair = _key_pair(subprotocols)
    return pair[0] if pair else None


def presented_token(
    query: Mapping[str, str],
    subprotocols: Sequence[str],
    headers: Mapping[str, str] | None = None,
) -> str | None:
    """The token the client offered, if any: the Authorization header, else a subprotocol,
    else the query."""
    authorization = (headers or {}).get("authorization", "")
    scheme, _, value = authorization.strip().partition(" ")
    if scheme.lower() in _AUTH_SCHEMES and value.strip():
        return value.strip()
    for proto in subprotocols:
        for prefix in (BEARER_PREFIX, OPENAI_KEY_PREFIX):
            if proto.startswith(prefix):
                return proto[len(prefix) :]
    pair = _key_pair(subprotocols)
    if pair is not None:
        return pair[1]
    return query.get("token")


def token_ok(expected: str | None, presented: str | None) -> bool:
    """True when no token is configured, or the presented one matches (in constant time)."""
    if not expected:
        return True
    if presented is None:
        return False
    return hmac.compare_digest(expected.encode(), presented.encode())
