"""asr_bridge.public_errors: gRPC's messages about a connection, as a browser gets them."""

from __future__ import annotations

import pytest

from asr_bridge.public_errors import for_browser
from asr_client import ConnectionOptions

INTERNAL = ConnectionOptions("asr-internal.svc.cluster.local:50051")


@pytest.mark.parametrize(
    ("details", "told"),
    [
        (  # grpc-core's, for a replica that is down (the security reviewer's)
            "could not resume the stream within 30 s (UNAVAILABLE: failed to connect to all "
            "addresses; last error: UNKNOWN: ipv4:10.0.3.7:50051: Connection refused)",
            "could not resume the stream within 30 s (UNAVAILABLE: failed to connect to all "
            "addresses; last error: UNKNOWN: the server: Connection refused)",
        ),
        (
            "last error: UNKNOWN: ipv6:%5B::1%5D:50051: Failed to connect",
            "last error: UNKNOWN: the server: Failed to connect",
        ),
        ("connect to [2001:db8::7]:443 failed", "connect to (an address) failed"),
        (
            "DNS resolution failed for asr-internal.svc.cluster.local:50051: C-ares status is "
            "not ARES_SUCCESS qtype=A name=asr-internal.svc.cluster.local is_balancer=0",
            "DNS resolution failed for the server: C-ares status is not ARES_SUCCESS qtype=A "
            "name=the server is_balancer=0",
        ),
        # other addresses (the bridge's, as the server names a client) are not told either
        (
            "client ip:10.0.0.4 is at its limit of 1 concurrent streams; close one",
            "client ip:(an address) is at its limit of 1 concurrent streams; close one",
        ),
        (  # IPv6 as the server writes a client's, without brackets (third reviewer)
            "client ip:fd00:10::4 is at its limit; client ip:::1; ip:2001:0db8:0:0:0:ff00:42:8329",
            "client ip:(an address) is at its limit; client ip:(an address); ip:(an address)",
        ),
        (  # IPv4-mapped and NAT64, a zone id (fourth reviewer)
            "ip:::ffff:192.168.7.23; ip:64:ff9b::10.0.0.1; ip:fe80::1%eth0; [fe80::1%eth0]:5000",
            "ip:(an address); ip:(an address); ip:(an address); (an address)",
        ),
        # an IPv6 address unbracketed only where the server names a client: not these
        (
            "at 12:30:45, x :: y, config a::b, id deadbeef:cafe::1, std::vector",
            "at 12:30:45, x :: y, config a::b, id deadbeef:cafe::1, std::vector",
        ),
        # the server's own words are the client's to read, unchanged (the second
        # reviewer of this: "hotwords[1]" was taken for an IPv6 address)
        (
            "config.hotwords[1] has 150 characters; the limit is 100",
            "config.hotwords[1] has 150 characters; the limit is 100",
        ),
        ("config.resume.channels[0a].x", "config.resume.channels[0a].x"),
        (
            "config.endpointing.silence_ms 50 is out of range 100-10000",
            "config.endpointing.silence_ms 50 is out of range 100-10000",
        ),
        ("Socket closed", "Socket closed"),
    ],
)
def test_addresses_and_the_servers_name_are_not_told(details: str, told: str) -> None:
    assert for_browser(details, INTERNAL) == told


def test_a_short_host_name_is_replaced_as_a_name_only() -> None:
    """A host called "asr" is replaced where it is the host, not inside other words."""
    told = for_browser(
        "dns:///asr:50051 refused; DNS resolution failed for asr:50051; asr.v1.Recognizer",
        ConnectionOptions("dns:///asr:50051"),
    )
    assert told == "the server refused; DNS resolution failed for the server; asr.v1.Recognizer"


def test_a_target_with_a_dns_authority_or_a_tls_name_is_not_told() -> None:
    """The host past a DNS resolver's address stayed in the message, as did the name
    checked in the server's certificate."""
    server = ConnectionOptions("dns://10.0.0.2:53/asr-internal.invalid:50051")
    told = for_browser(
        "errors resolving asr-internal.invalid:50051: [address lookup failed for "
        "asr-internal.invalid:50051: Could not contact DNS servers]",
        server,
    )
    assert told == (
        "errors resolving the server: [address lookup failed for the server: Could not "
        "contact DNS servers]"
    )
    server = ConnectionOptions("10.0.0.9:443", server_name="asr.internal.example")
    told = for_browser("peer name asr.internal.example is not in peer certificate", server)
    assert told == "peer name the server is not in peer certificate"
