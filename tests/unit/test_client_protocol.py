"""What the client library and the server must agree on outside the proto."""

from __future__ import annotations

import json

from asr_client import api
from asr_client.retry import retry_service_config
from asr_server.transport import servicer


def test_client_and_server_name_the_admission_header_alike() -> None:
    assert api.ADMITTED_HEADER == servicer.ADMITTED_HEADER


def test_grpc_retries_only_the_one_message_call() -> None:
    # grpc core's replay of a bidi stream lost messages (see retry.py): streams are retried
    # by the resume layer, never by a retry policy
    config = json.loads(retry_service_config(load_balancing="round_robin"))
    names = [name for method in config["methodConfig"] for name in method["name"]]
    assert names == [{"service": "asr.v1.Recognizer", "method": "Recognize"}]
    assert config["loadBalancingConfig"] == [{"round_robin": {}}]
