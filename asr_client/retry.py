"""The client's gRPC retry policy: a ``Recognize`` call refused at admission is retried.

A full, draining or still-loading replica refuses a new call before reading or writing
anything (RESOURCE_EXHAUSTED or UNAVAILABLE, with ``grpc-retry-pushback-ms``). Until a call
has received response headers, grpc core can replay it from its retry buffer: through an
L7 proxy the retry is a new request that the proxy balances again; with client-side
balancing (several addresses, ``round_robin``) it is the next pick. grpc core replays only
a call whose request fits its per-RPC retry buffer (256 KiB by default, 8 s of 16 kHz
audio), so ``AsrClient`` sets that buffer to its largest message.

Only ``Recognize`` (one request message) is retried this way. A ``StreamingRecognize``
call replayed by grpc core while its client kept writing lost audio in our tests (0.3 s
of a stream, a few messages, with no error: tests/integration/test_resume.py), so streams
are never given a retry policy; the stream itself makes a refused call again and replays
what it sent (asr_client/resume.py, ``ResumePolicy.seat_wait_s``).
"""

from __future__ import annotations

import json

SERVICE = "asr.v1.Recognizer"

#: grpc caps attempts at 5; with the server's 50-250 ms pushback that is about a second of
#: trying before the caller sees RESOURCE_EXHAUSTED, i.e. the whole deployment is full.
MAX_ATTEMPTS = 5


def retry_service_config(*, load_balancing: str | None = None) -> str:
    """The ``grpc.service_config`` channel option (JSON).

    ``load_balancing="round_robin"`` adds client-side balancing over every address the
    target resolves to (a headless Kubernetes Service, ``ipv4:a:p,b:p``); a service config
    replaces any other, so pass it here rather than as a second ``grpc.service_config``.
    """
    config: dict[str, object] = {
        "methodConfig": [
            {
                "name": [{"service": SERVICE, "method": "Recognize"}],
                "retryPolicy": {
                    "maxAttempts": MAX_ATTEMPTS,
                    # Used only when the server sends no pushback (e.g. a proxy refused).
                    "initialBackoff": "0.1s",
                    "maxBackoff": "1s",
                    "backoffMultiplier": 2,
                    "retryableStatusCodes": ["RESOURCE_EXHAUSTED", "UNAVAILABLE"],
                },
            }
        ]
    }
    if load_balancing:
        config["loadBalancingConfig"] = [{load_balancing: {}}]
    return json.dumps(config)
