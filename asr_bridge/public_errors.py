"""What a browser is told of a gRPC failure: the server's words, without the bridge's view
of the network.

gRPC's own messages about a connection name what it tried ("failed to connect to all
addresses; last error: UNKNOWN: ipv4:10.0.3.7:50051: Connection refused", "DNS
resolution failed for asr-internal:50051"): a replica's address and port, or an internal
host name, which a page on the internet has no business learning. The bridge logs them
whole; the browser gets them with each address replaced by "the server".
"""

from __future__ import annotations

import re

from asr_client.connection import ConnectionOptions

#: gRPC's address URIs, [IPv6]:port, and IPv4 with or without a port
_ADDRESS = re.compile(
    r"""\b(?:ipv4|ipv6|unix|unix-abstract|vsock|dns):(?://[^/\s]*/)?[^\s,;()]*[^\s,;():]
      | \[[0-9A-Fa-f:.%]+\](?::\d+)?
      | \b\d{1,3}(?:\.\d{1,3}){3}(?::\d+)?\b""",
    re.X,
)
SERVER = "the server"


def for_browser(text: str, server: ConnectionOptions) -> str:
    """``text`` (a status's details, an outage's cause) with the server's target, its host
    and every network address in it replaced."""
    target = server.target.split("///", 1)[-1]  # (dns:///host:port)
    host = target.rsplit(":", 1)[0] if target.count(":") == 1 else target
    text = _ADDRESS.sub(SERVER, text)
    for name in sorted({target, host} - {""}, key=len, reverse=True):
        text = re.sub(rf"(?<![\w.-]){re.escape(name)}(?![\w-]|\.\w)", SERVER, text)
    return text
