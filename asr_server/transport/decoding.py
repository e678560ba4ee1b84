"""Register the Recognizer's handlers so that no request bytes can fail inside grpc itself.

grpc.aio parses requests before our code sees them, and what it does with bytes that do
not parse (garbage, a string field holding invalid UTF-8, groups nested past protobuf's
depth limit) is not a status we chose: a unary call ends ``UNKNOWN`` with Python's exception
text, and a stream's ``context.read()`` raises ``DecodeError`` into the handler. Worse, a
unary call half-closed without any message is dropped by grpc.aio without a status (see
``_handle_unary_unary_rpc``): the client waits for its deadline, or forever.

So the handlers here use a deserializer that returns an ``Undecodable`` marker instead of
raising, and Recognize is registered as a stream-unary method that reads its one message
itself (identical on the wire); the servicer answers both markers with INVALID_ARGUMENT.
Reading it itself also puts the read under admission and a timeout (servicer.Recognize):
a call that never sends its message holds a pending slot, not a handler forever.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

import grpc

from asr_api.v1 import asr_pb2

SERVICE_NAME = asr_pb2.DESCRIPTOR.services_by_name["Recognizer"].full_name

T = TypeVar("T")


@dataclass(frozen=True)
class Undecodable:
    """Stands in for a request message that could not be parsed, or was never sent."""

    reason: str


class RecognizerHandlers(Protocol):
    async def StreamingRecognize(self, request_iterator: Any, context: Any) -> None: ...  # noqa: N802
    async def Recognize(self, request_iterator: Any, context: Any) -> asr_pb2.RecognizeResponse: ...  # noqa: N802


def tolerant(parse: Callable[[bytes], T], type_name: str) -> Callable[[bytes], T | Undecodable]:
    """``parse``, but a failure becomes an ``Undecodable`` naming the message type."""

    def deserialize(data: bytes) -> T | Undecodable:
        try:
            return parse(data)
        # anything the parser raises is about the client's bytes, never a server fault
        except Exception as exc:
            return Undecodable(f"request is not a valid {type_name}: {exc}")

    return deserialize


def add_recognizer_to_server(servicer: RecognizerHandlers, server: grpc.aio.Server) -> None:
    """The generated ``add_RecognizerServicer_to_server``, with tolerant request parsing."""

    handlers = {
        "StreamingRecognize": grpc.stream_stream_rpc_method_handler(
            servicer.StreamingRecognize,
            request_deserializer=tolerant(
                asr_pb2.StreamingRecognizeRequest.FromString, "StreamingRecognizeRequest"
            ),
            response_serializer=asr_pb2.StreamingRecognizeResponse.SerializeToString,
        ),
        "Recognize": grpc.stream_unary_rpc_method_handler(
            servicer.Recognize,
            request_deserializer=tolerant(asr_pb2.RecognizeRequest.FromString, "RecognizeRequest"),
            response_serializer=asr_pb2.RecognizeResponse.SerializeToString,
        ),
    }
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE_NAME, handlers),))
    server.add_registered_method_handlers(SERVICE_NAME, handlers)
