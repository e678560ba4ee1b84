"""gRPC transport: protobuf ⇄ domain types, status mapping, the Recognizer servicer."""
