"""The bridge's access token: where a browser may present it and how it is compared.

Browsers cannot set headers on a WebSocket, so the token travels either as a
subprotocol (``bearer.<token>`` beside ``streamasr.v1``; not logged by proxies) or as
the ``token`` query parameter (easy, but query strings end up in access logs).
"""

from __future__ import annotations

import hmac
from collections.abc import Mapping, Sequence

BEARER_PREFIX = "bearer."


def presented_token(query: Mapping[str, str], subprotocols: Sequence[str]) -> str | None:
    """The token the client offered, if any (a subprotocol wins over the query)."""
    for proto in subprotocols:
        if proto.startswith(BEARER_PREFIX):
            return proto[len(BEARER_PREFIX) :]
    return query.get("token")


def token_ok(expected: str | None, presented: str | None) -> bool:
    """True when no token is configured, or the presented one matches (in constant time)."""
    if not expected:
        return True
    if presented is None:
        return False
    return hmac.compare_digest(expected.encode(), presented.encode())
