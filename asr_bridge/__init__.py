"""streamasr's browser bridge: a web page and a WebSocket endpoint in front of the gRPC server.

Each browser session becomes its own ``StreamingRecognize`` stream. The WebSocket
protocol (JSON events, binary int16 PCM frames) is in ``docs/websocket-protocol.md``; the
hosted APIs it also speaks (OpenAI Realtime ``/v1/realtime``, Deepgram live ``/v1/listen``
and Flux ``/v2/listen``) are in ``docs/compat.md``;
``asr-bridge --help`` runs it. The app lives in ``asr_bridge.app`` (``start_bridge``,
``create_app``); it needs the ``bridge`` extra: ``pip install 'streamasr[bridge]'``.
"""
