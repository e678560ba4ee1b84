"""streamasr server: real-time streaming speech recognition over gRPC."""

import os

__version__ = "0.1.0"

# The server never goes online. onnxruntime (Silero VAD, the turn model) sends telemetry
# of its own from a thread about 10 s after its first session (a TLS connection to
# mobile.events.data.microsoft.com, seen with onnxruntime 1.32) unless told not to, and
# onnxruntime.disable_telemetry_events() does not stop it; this does, if set before
# onnxruntime is loaded: asr_server's modules load it, so here. (An operator may still
# set it otherwise.)
os.environ.setdefault("ORT_DISABLE_TELEMETRY", "1")
# gRPC core logs ERROR and worse (see asr_client/__init__.py): its INFO lines told of every
# client whose TLS handshake failed. Its ERROR lines stay: a port gRPC cannot use is
# explained by the line it writes (app.py).
os.environ.setdefault("GRPC_VERBOSITY", "ERROR")
