"""What a browser is told of a gRPC failure: the server's words, without the bridge's view
of the network.

gRPC's own messages about a connection name what it tried ("failed to connect to all
addresses; last error: UNKNOWN: ipv4:10.0.3.7:50051: Connection refused", "DNS
resolution failed for asr-internal:50051"): a replica's address and port, or an internal
host name, which a page on the internet has no business learning. The bridge logs them
whole; the browser gets them with gRPC's addresses and the server's name replaced by "the
server", and any other network address (the bridge's own, as the server names a client:
"client ip:10.0.0.4 is at its limit…") by "(an address)".
"""

from __future__ import annotations

import re

from asr_client.connection import ConnectionOptions, address_in

SERVER = "the server"
ADDRESS = "(an address)"
#: gRPC's address URIs: what it tried to connect to
_GRPC_ADDRESS = re.compile(
    r"\b(?:ipv4|ipv6|unix|unix-abstract|vsock|dns):(?://[^/\s]*/)?[^\s,;()]*[^\s,;():]"
)
#: [IPv6] (at least two colons inside: not "hotwords[1]"), IPv6 as the server writes a
#: client's ("ip:fd00:10::4": a "::", or eight groups; not a time, "12:30:45"), and IPv4,
#: with or without a port
_HEX = "[0-9A-Fa-f]{1,4}"
_OTHER_ADDRESS = re.compile(
    rf"""\[(?=[^\]]*:[^\]]*:)[0-9A-Fa-f:.%]+\](?::\d+)?
      | (?<![\w.])(?:{_HEX}(?::{_HEX}){{7}}
                  | (?=[0-9A-Fa-f:]*[0-9A-Fa-f])(?:{_HEX}(?::{_HEX})*)?::(?:{_HEX}(?::{_HEX})*)?
                  )(?![\w:])
      | \b\d{{1,3}}(?:\.\d{{1,3}}){{3}}(?::\d+)?\b""",
    re.X,
)


def for_browser(text: str, server: ConnectionOptions) -> str:
    """``text`` (a status's details, an outage's cause) with the addresses in it replaced."""
    text = _GRPC_ADDRESS.sub(SERVER, text)
    target = address_in(server.target)  # host:port, past a scheme and a DNS authority
    host = target.rsplit(":", 1)[0] if target.count(":") == 1 else target
    names = {server.target, target, host, server.server_name or ""} - {""}
    for name in sorted(names, key=len, reverse=True):
        text = re.sub(rf"(?<![\w.-]){re.escape(name)}(?![\w-]|\.\w)", SERVER, text)
    return _OTHER_ADDRESS.sub(ADDRESS, text)
