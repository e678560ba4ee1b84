"""Which web pages may open a WebSocket to the bridge: the ``Origin`` check.

Browsers attach ``Origin`` to every WebSocket handshake and let any page connect anywhere;
WebSockets have no CORS. Without this check, any site a user visits could open the
bridge from the user's browser, with whatever the browser carries for it (cookies, a
bridge reachable only from the user's network). So by default only the bridge's own page
may connect (same origin: the Origin's host and port are the ``Host`` the request was sent
to). A list of allowed origins replaces that default, as in python-socketio and the
websockets library: it is exact, so it also holds behind a proxy that rewrites ``Host`` and
against DNS rebinding, which the same-origin default cannot tell apart. ``*`` allows any.

A handshake *without* ``Origin`` is not a browser (browsers always send it), and is
allowed: Origin protects browsers from cross-site use of ambient credentials, and a
non-browser client has none to abuse; it must present the token like anyone else.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from urllib.parse import urlsplit

ANY = "*"
_DEFAULT_PORTS = {"http": 80, "https": 443, "ws": 80, "wss": 443}
# a page at http(s) opens ws(s): the same origin, seen from the WebSocket's side
_PAGE_SCHEME = {"ws": "http", "wss": "https", "http": "http", "https": "https"}

Origin = tuple[str, str, int]  # scheme, host, port


class OriginConfigError(ValueError):
    """An ``--allowed-origin`` that cannot match anything a browser sends."""


def parse_origin(text: str) -> Origin | None:
    """``scheme://host[:port]`` as (scheme, lowercase host, port), or None if it is not one.

    ``null`` (sandboxed frames, ``file:`` pages) and anything with a path are not origins.
    """
    try:
        parts = urlsplit(text.strip())
        port = parts.port
    except ValueError:
        return None
    scheme = parts.scheme.lower()
    if scheme not in _DEFAULT_PORTS or not parts.hostname or parts.path not in ("", "/"):
        return None
    if parts.query or parts.fragment or parts.username is not None:
        return None
    return scheme, parts.hostname.lower(), port if port is not None else _DEFAULT_PORTS[scheme]


@dataclass(frozen=True)
class OriginPolicy:
    """Allowed origins; none listed means same-origin only."""

    allowed: frozenset[Origin] = frozenset()
    allow_any: bool = False

    @classmethod
    def from_list(cls, origins: Iterable[str]) -> OriginPolicy:
        allowed: set[Origin] = set()
        allow_any = False
        for text in origins:
            text = text.strip()
            if not text:
                continue
            if text == ANY:
                allow_any = True
                continue
            origin = parse_origin(text)
            if origin is None or origin[0] not in ("http", "https"):
                raise OriginConfigError(
                    f"--allowed-origin {text!r}: want the page's origin, like "
                    "https://app.example.org or http://localhost:3000 (no path), or *"
                )
            allowed.add(origin)
        return cls(frozenset(allowed), allow_any)

    def allows(self, origin: str | None, host: str | None, scheme: str) -> bool:
        """May a handshake with this ``Origin`` header reach ``host`` (the ``Host`` header)?

        ``scheme`` is the request's own (``ws`` or ``wss``; ``http``/``https`` also work).
        """
        if origin is None:
            return True  # not a browser: see the module docstring
        if self.allow_any:
            return True
        parsed = parse_origin(origin)
        if parsed is None:
            return False
        if self.allowed:
            return parsed in self.allowed
        return host is not None and parsed == _own_origin(host, scheme)


def _own_origin(host: str, scheme: str) -> Origin | None:
    page_scheme = _PAGE_SCHEME.get(scheme.lower())
    if page_scheme is None:
        return None
    return parse_origin(f"{page_scheme}://{host}")
