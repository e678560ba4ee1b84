"""streamasr server: real-time streaming speech recognition over gRPC."""

__version__ = "0.1.0"
