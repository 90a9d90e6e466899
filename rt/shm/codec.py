"""Objects to frames and back: MessagePack for rt's messages, pickle
protocol 5 with out-of-band buffers for everything else.

rt's messages are msgspec Structs registered here (``register``); they cross
as MessagePack, encoded and decoded by msgspec in C: a small request costs
about a quarter of what pickle does. Numpy arrays inside them (token ids, a
few KB at most) travel as a MessagePack extension, copied. A registered
message that msgspec cannot encode (a field holding some other type) falls
back to pickle, which carries anything. Fields come back as their types say
(a ``tuple[int, ...]`` as a tuple); an untyped field (``Any``) comes back as
MessagePack has it (a tuple or a set as a list).

For pickle, ``dumps`` returns a list of buffers — a small header, the pickle stream, then
each array's raw memory — which a ring sender writes straight into the ring,
so an array's bytes are copied once (into the ring), never into the pickle
stream. ``loads`` rebuilds the arrays as views of the received frame.

Numpy arrays and CPU torch tensors (which cross as numpy arrays and come back
as tensors) go out of band; this module imports neither numpy nor torch. ``code=True`` uses cloudpickle, for the
rare payload that carries a function; nothing from the network is ever
unpickled.

Frame layout, told apart by the first byte: a registered message is a
MessagePack array (0x90-0x9f, 0xdc or 0xdd: its Structs are ``array_like``);
a pickle without out-of-band buffers is its bare stream (it starts with the
PROTO opcode, 0x80). Otherwise::

    u8 version | u8 reserved | u16 buffer count | u32 pickle length | u64 each buffer's length
    pickle stream, then each buffer, every piece starting on an 8-byte boundary
"""

from __future__ import annotations

import pickle
import struct
import sys
import threading
from typing import Any, Union

import cloudpickle
import msgspec

VERSION = 1
_PROTO = pickle.PROTO[0]
_HEAD = struct.Struct("<BBHI")
_PAD = bytes(8)


def _rebuild_array(buf: memoryview, dtype: str, shape: tuple[int, ...]) -> Any:
    import numpy

    return numpy.frombuffer(buf, dtype=dtype).reshape(shape)


def _reduce_array(array: Any) -> Any:
    # numpy's own reduce costs a Python-level call chain and pickles a dtype
    # object: 4.9 µs against 3.0 µs for this one on a 1,700-element array.
    # (Objects and structured dtypes take numpy's way: dtype.str loses a structure's fields.)
    if array.flags.c_contiguous and not array.dtype.hasobject and not array.dtype.fields:
        return _rebuild_array, (pickle.PickleBuffer(array), array.dtype.str, array.shape)
    return array.__reduce_ex__(5)


def _rebuild_tensor(raw: Any, dtype: str, shape: tuple[int, ...]) -> Any:
    import torch

    return torch.from_numpy(raw).view(getattr(torch, dtype)).reshape(shape)


def _reduce_tensor(tensor: Any) -> Any:
    import torch

    if tensor.device.type != "cpu":
        return tensor.__reduce_ex__(5)
    # As raw bytes, so that dtypes numpy lacks (bfloat16) cross too.
    raw = tensor.detach().contiguous().reshape(-1).view(torch.uint8).numpy()
    return _rebuild_tensor, (raw, str(tensor.dtype).removeprefix("torch."), tuple(tensor.shape))


class _Sink:
    write: Any


class _Encoder:
    """A reusable pickler, one per thread: it writes into a list's ``append``
    (a C call), so a small message costs less than ``pickle.dumps`` (0.65 µs
    against 0.78 µs). Its dispatch table, a dict lookup per non-atomic object
    in C, sends arrays and CPU tensors out of band; it is rebuilt when modules
    have been imported since (numpy or torch may have arrived)."""

    def __init__(self) -> None:
        self.chunks: list[bytes] = []
        self.buffers: list[pickle.PickleBuffer] = []
        sink = _Sink()
        sink.write = self.chunks.append
        self.pickler = pickle.Pickler(sink, 5, buffer_callback=self.buffers.append)
        self.modules = -1

    def encode(self, obj: Any) -> tuple[bytes, list[pickle.PickleBuffer]]:
        if len(sys.modules) != self.modules:
            self.modules = len(sys.modules)
            self.pickler.dispatch_table = _dispatch_table()
        chunks, buffers = self.chunks, self.buffers
        self.pickler.clear_memo()
        try:
            self.pickler.dump(obj)
            body = chunks[0] if len(chunks) == 1 else b"".join(chunks)
            out = buffers[:] if buffers else _NO_BUFFERS
        finally:
            chunks.clear()
            buffers.clear()
        return body, out


_NO_BUFFERS: list[pickle.PickleBuffer] = []


def _dispatch_table() -> dict[type, Any]:
    table: dict[type, Any] = {}
    numpy, torch = sys.modules.get("numpy"), sys.modules.get("torch")
    if numpy is not None:
        table[numpy.ndarray] = _reduce_array
    if torch is not None:
        table[torch.Tensor] = _reduce_tensor
    return table


_local = threading.local()


def _encoder() -> _Encoder:
    try:
        return _local.encoder
    except AttributeError:
        _local.encoder = _Encoder()
        return _local.encoder


# --- MessagePack for registered Structs --------------------------------------

_ARRAY_EXT = 1  # ext payload: u8 len(dtype str), dtype str, u8 ndim, u32 shape..., raw bytes
_registered: dict[type[msgspec.Struct], None] = {}  # an ordered set


def _no_messages(data: Any) -> Any:
    raise ValueError("a MessagePack frame, but no message type is registered")


_decode: Any = _no_messages  # the Decoder's decode, once a type is registered


def register(*types: type[msgspec.Struct]) -> None:
    """Send these Struct types as MessagePack. Each must be ``array_like`` and
    tagged (``tag=True``), with a tag no other registered type has."""
    global _decode
    tags: dict[Any, type[msgspec.Struct]] = {
        other.__struct_config__.tag: other for other in _registered
    }
    for cls in types:
        config = cls.__struct_config__
        if not config.array_like or config.tag is None:
            raise TypeError(f"{cls.__qualname__} must be a Struct with array_like=True, tag=True")
        other = tags.setdefault(config.tag, cls)
        if other is not cls:
            raise TypeError(f"{cls.__qualname__} and {other.__qualname__} share a tag")
    _registered.update(dict.fromkeys(types))
    union: Any = Union[tuple(_registered)]  # noqa: UP007 (a runtime union of a tuple of types)
    _decode = msgspec.msgpack.Decoder(union, ext_hook=_ext_hook).decode


def _enc_hook(obj: Any) -> Any:
    numpy = sys.modules.get("numpy")
    # Objects and structured dtypes go by pickle (dtype.str loses a structure's fields).
    if numpy is not None and type(obj) is numpy.ndarray:
        dtype = obj.dtype
        if not dtype.hasobject and not dtype.fields:
            head = _heads.get(key := (dtype.str, obj.ndim)) or _head(*key)
            shape = (
                _U32.pack(obj.size) if obj.ndim == 1 else struct.pack(f"<{obj.ndim}I", *obj.shape)
            )
            return msgspec.msgpack.Ext(_ARRAY_EXT, b"".join((head, shape, obj.tobytes())))
    raise NotImplementedError(f"{type(obj).__qualname__} has no MessagePack form")


_U32 = struct.Struct("<I")
_heads: dict[tuple[str, int], bytes] = {}  # (dtype str, ndim) -> an ext header's fixed part


def _head(dtype: str, ndim: int) -> bytes:
    _heads[dtype, ndim] = head = bytes([len(dtype)]) + dtype.encode() + bytes([ndim])
    return head


def _ext_hook(code: int, data: memoryview) -> Any:
    if code != _ARRAY_EXT:
        raise ValueError(f"unknown MessagePack extension {code}")
    n = data[0]
    ndim = data[1 + n]
    start = 2 + n + 4 * ndim
    dtype = _dtypes.get(head := bytes(data[: 1 + n])) or _dtype(head)  # imports numpy
    # A copy (bytearray): writable, and independent of the frame it came in.
    array = sys.modules["numpy"].frombuffer(bytearray(data[start:]), dtype)
    if ndim == 1:
        return array
    return array.reshape(struct.unpack_from(f"<{ndim}I", data, 2 + n))


_dtypes: dict[bytes, Any] = {}  # an ext header's dtype part -> numpy dtype


def _dtype(head: bytes) -> Any:
    import numpy

    _dtypes[head] = dtype = numpy.dtype(head[1:].decode())
    return dtype


_encode_msgpack = msgspec.msgpack.Encoder(enc_hook=_enc_hook).encode


def dumps(obj: Any, *, code: bool = False) -> bytes | list[bytes | memoryview]:
    """Serialize ``obj`` for ``RingSender.send``: one ``bytes`` when it holds no
    out-of-band array (the common, fast case), else a list of buffers to write in turn."""
    if type(obj) in _registered:
        try:
            return _encode_msgpack(obj)
        except (TypeError, ValueError, OverflowError, NotImplementedError):
            pass  # something msgspec cannot carry: pickle carries anything
    if code:
        buffers: list[pickle.PickleBuffer] = []
        body = cloudpickle.dumps(obj, protocol=5, buffer_callback=buffers.append)
    else:
        body, buffers = _encoder().encode(obj)
    if not buffers:
        return body  # a bare pickle stream: it starts with PROTO (0x80)
    raws = [buf.raw() for buf in buffers]
    sizes = [raw.nbytes for raw in raws]
    head = _HEAD.pack(VERSION, 0, len(raws), len(body)) + struct.pack(f"<{len(sizes)}Q", *sizes)
    out: list[bytes | memoryview] = [head, body]
    pad = -(len(head) + len(body)) % 8
    for raw in raws:
        if pad:
            out.append(_PAD[:pad])
        out.append(raw)
        pad = -raw.nbytes % 8
    return out


def as_received(obj: Any) -> Any:
    """``obj`` as its receiver will see it: encoded and decoded once. Raises
    ValueError, saying which field, if the receiver could not read it (a
    registered message whose field holds a value of another type)."""
    encoded = dumps(obj)
    return loads(encoded if isinstance(encoded, bytes) else b"".join(encoded))


def peek_fields(data: bytes | bytearray | memoryview) -> list[Any] | None:
    """The raw fields (tag first) of a MessagePack message that failed to
    decode as its type, or None if the frame is not readable MessagePack:
    enough to name the request a bad frame belonged to."""
    try:
        fields = msgspec.msgpack.decode(data)
    except msgspec.DecodeError:
        return None
    return fields if isinstance(fields, list) else None


def loads(data: bytes | bytearray | memoryview) -> Any:
    """Rebuild the object. Arrays are writable views of ``data``, or of one
    copy of it when ``data`` is read-only (a small frame arrives as bytes)."""
    first = data[0]
    if 0x90 <= first <= 0x9F:  # a MessagePack fixarray: a message of up to 15 fields
        return _decode(data)
    if first == _PROTO:
        return pickle.loads(data)
    if first == 0xDC or first == 0xDD:  # a MessagePack array16 / array32: a bigger message
        return _decode(data)
    version, _, count, body_len = _HEAD.unpack_from(data)
    if version != VERSION:
        raise ValueError(f"codec version {version} in frame, this rt reads {VERSION}")
    view = memoryview(data)
    if view.readonly:
        view = memoryview(bytearray(view))
    sizes = struct.unpack_from(f"<{count}Q", view, _HEAD.size)
    pos = _HEAD.size + 8 * count
    body = view[pos : pos + body_len]
    pos += body_len
    buffers = []
    for size in sizes:
        pos += -pos % 8
        buffers.append(view[pos : pos + size])
        pos += size
    return pickle.loads(body, buffers=buffers)
