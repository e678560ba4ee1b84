"""The client's retries of a ``Recognize`` call refused at admission.

A full, draining or still-loading replica refuses a new call before reading or writing
anything (RESOURCE_EXHAUSTED or UNAVAILABLE, with ``grpc-retry-pushback-ms``). The client
makes such a call again after the pushback: through an L7 proxy the new call is a new
request that the proxy balances again; with client-side balancing (several addresses,
``round_robin``) it is the next pick. An UNAVAILABLE without pushback (a proxy's refusal, a
replica that is not there) is made again after a short backoff.

These are the client's own retries, not grpc's retry policy: grpc's retries every
RESOURCE_EXHAUSTED alike, and grpc itself answers a request over the server's message
limit with RESOURCE_EXHAUSTED (no pushback), so a file too large for the server was sent
five times before the error came. Without pushback, RESOURCE_EXHAUSTED is final.

Streams are never retried here. A ``StreamingRecognize`` call replayed by grpc core while
its client kept writing lost audio in our tests (0.3 s of a stream, a few messages, with
no error: tests/integration/test_resume.py); the stream itself makes a refused call again
and replays what it sent (asr_client/resume.py, ``ResumePolicy.seat_wait_s``).
"""

from __future__ import annotations

import json
from collections.abc import Iterable

import grpc

#: attempts in all; with the server's 50-250 ms pushback that is about a second of trying
#: before the caller sees RESOURCE_EXHAUSTED, i.e. the whole deployment is full.
MAX_ATTEMPTS = 5
#: backoff before another attempt where no pushback came (doubling, capped)
INITIAL_BACKOFF_S, MAX_BACKOFF_S = 0.1, 1.0
PUSHBACK = "grpc-retry-pushback-ms"


def retry_delay(
    code: grpc.StatusCode, trailing: Iterable[tuple[str, str | bytes]] | None, attempt: int
) -> float | None:
    """Seconds to wait before making a refused call again (``attempt``: the attempts made
    so far), or None when it must not be: not a refusal, the server said not to (a
    negative pushback), or the attempts are spent."""
    if attempt >= MAX_ATTEMPTS:
        return None
    if code not in (grpc.StatusCode.RESOURCE_EXHAUSTED, grpc.StatusCode.UNAVAILABLE):
        return None
    pushback = next((str(v) for k, v in trailing or () if k == PUSHBACK), None)
    if pushback is not None:
        try:
            ms = int(pushback)
        except ValueError:
            return None  # (as grpc: an invalid pushback means do not retry)
        return ms / 1000 if ms >= 0 else None
    if code is grpc.StatusCode.RESOURCE_EXHAUSTED:
        return None  # not an admission refusal: grpc's message limit, the server's own
    return min(MAX_BACKOFF_S, INITIAL_BACKOFF_S * 2 ** (attempt - 1))


def balancing_service_config(policy: str = "round_robin") -> str:
    """The ``grpc.service_config`` channel option (JSON) for client-side balancing:
    ``round_robin`` spreads calls over every address the target resolves to (a headless
    Kubernetes Service, ``ipv4:a:p,b:p``); a refused call made again is the next pick. No
    retry policy: the client makes refused calls again itself (above)."""
    return json.dumps({"loadBalancingConfig": [{policy: {}}]})
