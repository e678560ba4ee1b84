#!/usr/bin/env python3
"""Fill in deploy/nginx/nginx.conf or deploy/envoy/envoy.yaml for replicas on known addresses.

Used by deploy/local/cluster.sh and by tests/integration/test_proxies.py, so the proxies
that the tests drive run the files in deploy/ and nothing else. Standard library only.

    render_proxy.py nginx --listen 127.0.0.1:50051 --replica 127.0.0.1:50061 ... -o nginx.conf
    render_proxy.py envoy --listen 127.0.0.1:50051 --admin-port 9901 --replica ... -o envoy.yaml
"""

from __future__ import annotations

import argparse
from pathlib import Path

DEPLOY = Path(__file__).resolve().parents[1]
TEMPLATES = {"nginx": DEPLOY / "nginx" / "nginx.conf", "envoy": DEPLOY / "envoy" / "envoy.yaml"}


def split_address(address: str) -> tuple[str, int]:
    host, _, port = address.rpartition(":")
    if not host or not port.isdigit():
        raise argparse.ArgumentTypeError(f"expected HOST:PORT, got {address!r}")
    return host, int(port)


def render(proxy: str, listen: str, replicas: list[str], admin_port: int = 9901) -> str:
    text = TEMPLATES[proxy].read_text()
    hosts = [split_address(r) for r in replicas]
    listen_host, listen_port = split_address(listen)
    if proxy == "nginx":
        servers = "\n".join(
            # max_fails/fail_timeout: after one connect failure skip the replica for 10 s.
            f"        server {h}:{p} max_fails=1 fail_timeout=10s;"
            for h, p in hosts
        )
        fills = {"@LISTEN@": f"{listen_host}:{listen_port}", "@UPSTREAM_SERVERS@": servers}
    else:
        endpoints = "\n".join(
            "              - endpoint: { address: { socket_address: "
            f"{{ address: {h}, port_value: {p} }} }} }}"
            for h, p in hosts
        )
        text = text.replace(
            "address: 127.0.0.1, port_value: @LISTEN_PORT@",
            f"address: {listen_host}, port_value: @LISTEN_PORT@",
        )
        fills = {
            "@LISTEN_PORT@": str(listen_port),
            "@ADMIN_PORT@": str(admin_port),
            "@ENDPOINTS@": endpoints,
        }
    for key, value in fills.items():
        text = text.replace(key, value)
    return text


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("proxy", choices=sorted(TEMPLATES))
    p.add_argument("--listen", required=True, help="HOST:PORT the proxy listens on")
    p.add_argument("--replica", action="append", required=True, help="HOST:PORT, repeated")
    p.add_argument("--admin-port", type=int, default=9901, help="Envoy admin port (loopback)")
    p.add_argument("-o", "--output", type=Path, required=True)
    a = p.parse_args()
    a.output.write_text(render(a.proxy, a.listen, a.replica, a.admin_port))


if __name__ == "__main__":
    main()
