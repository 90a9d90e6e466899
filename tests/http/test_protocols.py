"""What rt-serve speaks: HTTP/1.1, and WebSocket with no extension (rt/http/protocols.py).

hypercorn spoke HTTP/2 to a cleartext client that asked, and there an answer
whose client left early held its connection for good; it offered WebSocket
compression, whose frames it inflated with no bound. Raw bytes here: the
clients a user has would not send what these tests do.
"""

from __future__ import annotations

import json
import socket
import zlib
from collections.abc import Callable

import httpx
from serverlib import Server

HTTP2_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
EMPTY_SETTINGS = b"\x00\x00\x00\x04\x00\x00\x00\x00\x00"  # an HTTP/2 SETTINGS frame, no settings
WS_HANDSHAKE = (
    b"GET /ws HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
    b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n"
)


def exchange(
    server: Server, data: bytes, frame: bytes = b"", until: Callable[[bytes], bool] | None = None
) -> bytes:
    """Send ``data`` (and ``frame`` once the answer's head has come), and read
    what comes back until the server closes, or until ``until`` holds of it."""
    with socket.create_connection(("127.0.0.1", server.port), timeout=30) as sock:
        sock.sendall(data)
        answer = b""
        while not (until and until(answer)):
            chunk = sock.recv(65536)
            if not chunk:
                break
            answer += chunk
            if frame and b"\r\n\r\n" in answer:
                sock.sendall(frame)
                frame = b""
    return answer


def tracebacks(server: Server) -> int:
    return sum("Traceback" in line for line in server.log)


def client_frame(payload: bytes, *, compressed: bool = False) -> bytes:
    """A client's text frame, masked with a zero mask; RSV1 set when ``compressed``."""
    first = 0xC1 if compressed else 0x81
    size = len(payload)
    if size < 126:
        head = bytes([first, 0x80 | size])
    elif size < 1 << 16:
        head = bytes([first, 0x80 | 126]) + size.to_bytes(2)
    else:
        head = bytes([first, 0x80 | 127]) + size.to_bytes(8)
    return head + bytes(4) + payload


def server_frames(data: bytes) -> list[tuple[int, bytes]]:
    """The (opcode, payload) of each whole frame in ``data`` (the server's: unmasked)."""
    frames = []
    while len(data) >= 2:
        size, at = data[1] & 0x7F, 2
        if size == 126:
            size, at = int.from_bytes(data[2:4]), 4
        elif size == 127:
            size, at = int.from_bytes(data[2:10]), 10
        if len(data) < at + size:
            break
        frames.append((data[0] & 0x0F, data[at : at + size]))
        data = data[at + size :]
    return frames


def done_came(answer: bytes) -> bool:
    frames = server_frames(answer.partition(b"\r\n\r\n")[2])
    return any(b'"done"' in payload for _, payload in frames)


def generate_frame(text: str) -> bytes:
    params = {"max_new_tokens": 2, "ignore_eos": True}  # (2 tokens, not a sampled end at 1)
    body = {"id": "g", "type": "generate", "text": text, "sampling_params": params}
    return client_frame(json.dumps(body).encode())


def test_a_client_that_opens_with_http2_is_answered_505_and_let_go(default_server: Server) -> None:
    before = tracebacks(default_server)
    answer = exchange(default_server, HTTP2_PREFACE + EMPTY_SETTINGS)
    assert answer.startswith(b"HTTP/1.1 505 "), answer[:200]  # not HTTP/2's SETTINGS frame
    assert httpx.get(f"{default_server.url}/health", timeout=30).status_code == 200
    assert tracebacks(default_server) == before


def test_an_upgrade_to_h2c_is_answered_in_http11(default_server: Server) -> None:
    answer = exchange(
        default_server,
        b"GET /health HTTP/1.1\r\nHost: x\r\nConnection: Upgrade, HTTP2-Settings, close\r\n"
        b"Upgrade: h2c\r\nHTTP2-Settings: AAMAAABkAARAAAAAAAIAAAAA\r\n\r\n",
    )
    head, _, body = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200 "), head  # no 101 Switching Protocols
    assert json.loads(body) == {"status": "ok"}


def test_a_websocket_offered_compression_is_served_without_it(default_server: Server) -> None:
    offers = [
        b"permessage-deflate; client_max_window_bits",
        b"permessage-deflate; server_max_window_bits=abc",  # malformed: was a traceback, no answer
    ]
    before = tracebacks(default_server)
    for offer in offers:
        handshake = WS_HANDSHAKE + b"Sec-WebSocket-Extensions: " + offer + b"\r\n\r\n"
        answer = exchange(default_server, handshake, generate_frame("In the"), until=done_came)
        head, _, rest = answer.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 101 "), head
        assert b"sec-websocket-extensions" not in head.lower(), head
        done = json.loads(server_frames(rest)[-1][1])
        assert done["type"] == "done" and done["meta_info"]["completion_tokens"] == 2, done
    assert tracebacks(default_server) == before


def test_a_compressed_websocket_frame_closes_its_connection_unread(default_server: Server) -> None:
    """Compression was negotiated, and a frame inflated whole before its size was
    checked: a 64 MiB message in 64 KiB here (1 MiB took the server 1.1 GiB)."""
    message = b'{"id":"b","type":"generate","text":"' + b"a" * (64 << 20) + b'"}'
    packer = zlib.compressobj(9, zlib.DEFLATED, -15)
    bomb = (packer.compress(message) + packer.flush(zlib.Z_SYNC_FLUSH))[:-4]
    assert len(bomb) < 1 << 17
    handshake = WS_HANDSHAKE + b"Sec-WebSocket-Extensions: permessage-deflate\r\n\r\n"
    answer = exchange(default_server, handshake, client_frame(bomb, compressed=True))
    head, _, rest = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 101 "), head
    assert closed_with(rest) == 1002  # protocol error, and no answer before it
    assert httpx.get(f"{default_server.url}/health", timeout=30).status_code == 200


def test_a_frame_that_cannot_be_parsed_is_answered_with_a_close_saying_why(
    default_server: Server,
) -> None:
    """The connection used to end with no close frame (the client saw 1006)."""
    cases = {
        client_frame(b'{"id": "\xff"}'): 1007,  # a text frame not in UTF-8
        bytes([0x89, 0x80 | 126]) + (200).to_bytes(2) + bytes(4) + b"p" * 200: 1002,  # long ping
    }
    for frame, code in cases.items():
        answer = exchange(default_server, WS_HANDSHAKE + b"\r\n", frame)
        assert closed_with(answer.partition(b"\r\n\r\n")[2]) == code, answer[-100:]


def closed_with(frames: bytes) -> int:
    """The code of the close frame that ends ``frames``, the only frame in them."""
    [(opcode, payload)] = server_frames(frames)
    assert opcode == 0x8, (opcode, payload)
    return int.from_bytes(payload[:2])


def test_a_websocket_handshake_hypercorn_refuses_is_answered_400_and_let_go(
    default_server: Server,
) -> None:
    """hypercorn answered a handshake with no key, or a version not 13, with a 400
    that says ``connection: close``, then held the connection open for good (no
    timer applies to it): six such sockets took every slot of --max-connections 6."""
    base = b"GET /ws HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
    for head in (
        base + b"Sec-WebSocket-Version: 13\r\n\r\n",  # no key
        base + b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 8\r\n\r\n",
    ):
        answer = exchange(default_server, head)  # (reads until the server closes: 30 s at most)
        assert answer.startswith(b"HTTP/1.1 400 "), answer
    assert tracebacks(default_server) == 0
