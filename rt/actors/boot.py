"""What a parent tells a child at spawn, and the control socket's framing.

The parent writes one message to the child's control socket: ``(sys.path,
cloudpickle(ChildBoot))``, so the child can import what the parent could
before it unpickles the actor's factory. The child answers one of::

    ("ready",)                                    start-up done, the actor runs
    ("startup_error", traceback, error, refused)  start-up raised; the child then exits 1
    ("crashed", traceback, error)                 run() raised after ready; then exits 1

``error`` is the innermost real exception's ``Type: message`` (through exception groups);
``refused``: it was a ConfigError or a ModelLoadError (starting again would fail the same way).

Messages are a u32 length and a pickle. The parent never unpickles anything
but what its own child wrote.
"""

from __future__ import annotations

import pickle
import socket
import struct
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import trio

from rt.actors.faultplan import FaultPlan

_LEN = struct.Struct("<I")


@dataclass(frozen=True)
class ChildBoot:
    name: str
    factory: Any
    args: tuple[Any, ...]
    kwargs: Mapping[str, Any]
    incarnation: int
    heartbeat_segment: str
    heartbeat_slot: int
    heartbeat_interval: float
    inboxes: Mapping[str, Any]  # ring name -> RingSpec
    outboxes: Mapping[str, Any]
    fault_plan: FaultPlan | None


def encode(message: Any) -> bytes:
    payload = pickle.dumps(message, protocol=5)
    return _LEN.pack(len(payload)) + payload


def recv_blocking(sock: socket.socket) -> Any | None:
    """One message from a blocking socket; None at EOF."""
    head = _recv_exact_blocking(sock, _LEN.size)
    if head is None:
        return None
    body = _recv_exact_blocking(sock, _LEN.unpack(head)[0])
    return None if body is None else pickle.loads(body)


def _recv_exact_blocking(sock: socket.socket, n: int) -> bytes | None:
    buf = bytearray()
    while len(buf) < n:
        try:
            chunk = sock.recv(n - len(buf))
        except ConnectionResetError:  # the peer died with what we sent unread: an end too
            return None
        if not chunk:
            return None
        buf += chunk
    return bytes(buf)


async def recv(sock: socket.socket) -> Any | None:
    """One message from a non-blocking socket, waiting in trio; None at EOF."""
    buf = bytearray()
    need = _LEN.size
    have_head = False
    while True:
        while len(buf) < need:
            try:
                chunk = sock.recv(need - len(buf))
            except BlockingIOError:
                await trio.lowlevel.wait_readable(sock)
                continue
            except ConnectionResetError:
                # the peer died with what we sent unread (a successor killed before it
                # read its boot message: this escaped the handshake, and rt-serve exited)
                return None
            if not chunk:
                return None
            buf += chunk
        if have_head:
            return pickle.loads(buf[_LEN.size :])
        need += _LEN.unpack(buf)[0]
        have_head = True


def recv_buffered(sock: socket.socket) -> Any | None:
    """A message the peer wrote before it exited, if the socket holds a whole one."""
    try:
        data = sock.recv(1 << 20, socket.MSG_PEEK)
    except (BlockingIOError, OSError):
        return None
    if len(data) < _LEN.size or len(data) < _LEN.size + _LEN.unpack_from(data)[0]:
        return None
    sock.recv(_LEN.size + _LEN.unpack_from(data)[0])
    return pickle.loads(data[_LEN.size : _LEN.size + _LEN.unpack_from(data)[0]])


async def send(sock: socket.socket, message: Any) -> None:
    """Write one message to a non-blocking socket, waiting in trio for room."""
    view = memoryview(encode(message))
    while view:
        try:
            view = view[sock.send(view) :]
        except BlockingIOError:
            await trio.lowlevel.wait_writable(sock)
