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
#: [IPv6] (at least two colons inside: not "hotwords[1]"), a zone id included; the address
#: the server names a client by ("ip:fd00:10::4", "ip:::ffff:10.0.0.1", "ip:fe80::1%eth0":
#: an IPv6 one is matched only there, as "a::b" or "12:30:45" elsewhere need not be one);
#: and IPv4, with or without a port
_V4 = r"\d{1,3}(?:\.\d{1,3}){3}"
_OTHER_ADDRESS = re.compile(
    rf"""\[(?=[^\]]*:[^\]]*:)[0-9A-Fa-f:.]+(?:%[\w.-]+)?\](?::\d+)?
      | (?<=\bip:)(?:{_V4}|[0-9A-Fa-f:]*:{_V4}|[0-9A-Fa-f:]*:[0-9A-Fa-f:]*)(?:%[\w.-]+)?
      | \b{_V4}(?::\d+)?\b""",
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
