"""The router <-> worker wire format: protobuf messages whose tensor bytes ride outside them.

`RouterMessage` and `WorkerMessage` (proto/worker.proto) describe each tensor (name,
datatype, shape, size) but carry the bytes of all of them in one `payload` field, which
senders put first on the wire. The result is still valid protobuf (fields may come in any
order), and it lets each side handle tensors with one copy:

- building: the header is serialised without the bytes and joined with every tensor's
  buffer at once (one copy), where nested protobuf messages copy each tensor when it is
  added and again, growing, when serialised;
- reading: the payload is sliced out of the received message as a memoryview (no copy),
  where a protobuf parse copies every tensor into its arena and each `.data` access
  copies it again into a Python `bytes`.

A received payload stays alive as long as any tensor viewing it. What this saves on large
tensors is in docs/benchmarks.md ("Micro-benchmarks behind design choices"); 64 B
tensors cost the same either way.

The gRPC method is registered with these functions as its (de)serialisers, so grpc hands
over the received bytes untouched and sends the joined bytes as they are.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Final

import numpy as np

from sloline.common.tensors import (
    BYTES,
    DTYPES,
    Tensor,
    datatype_of,
    deserialize_bytes,
    serialize_bytes,
)
from sloline.serving.proto import worker_pb2 as pb

SERVICE: Final = "sloline.worker.WorkerService"
CONNECT: Final = f"/{SERVICE}/Connect"
_PAYLOAD_TAG: Final = b"\x7a"  # field 15, wire type 2 (length-delimited)
_NO_PAYLOAD: Final = memoryview(b"")

Buffer = bytes | memoryview
Received = tuple[pb.RouterMessage, memoryview]
Sent = tuple[pb.WorkerMessage, memoryview]


class WireError(ValueError):
    """A message whose tensor sizes do not add up to its payload (a protocol bug)."""


def _varint(value: int) -> bytes:
    out = bytearray()
    while value > 0x7F:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def nbytes(buffer: Buffer) -> int:
    return buffer.nbytes if isinstance(buffer, memoryview) else len(buffer)


def encode(header: pb.RouterMessage | pb.WorkerMessage, buffers: Sequence[Buffer]) -> bytes:
    """`header` serialised, preceded by `buffers` as its payload (sizes in `header`)."""
    serialized = bytes(header.SerializeToString())
    size = sum(map(nbytes, buffers))
    if not size:
        return serialized
    return b"".join([_PAYLOAD_TAG, _varint(size), *buffers, serialized])


def _split(raw: bytes) -> tuple[memoryview, memoryview]:
    """(payload, the rest) of a message whose payload comes first; no payload: empty."""
    if not raw.startswith(_PAYLOAD_TAG):
        return _NO_PAYLOAD, memoryview(raw)
    size = shift = 0
    position = 1
    while True:
        byte = raw[position]
        position += 1
        size |= (byte & 0x7F) << shift
        if byte < 0x80:
            break
        shift += 7
    view = memoryview(raw)
    return view[position : position + size], view[position + size :]


def decode_router_message(raw: bytes) -> Received:
    """A worker's view of what the router sent: the message and its payload."""
    payload, rest = _split(raw)
    message = pb.RouterMessage.FromString(rest)
    if message.payload:  # a sender that did not put the payload first
        payload = memoryview(message.payload)
    return message, payload


def decode_worker_message(raw: bytes) -> Sent:
    """The router's view of what a worker sent: the message and its payload."""
    payload, rest = _split(raw)
    message = pb.WorkerMessage.FromString(rest)
    if message.payload:
        payload = memoryview(message.payload)
    return message, payload


def identity(raw: bytes) -> bytes:
    """The serialiser of already encoded messages."""
    return raw


# ---------------------------------------------------------------- router side


def batch_message(
    batch_id: int, items: Sequence[Mapping[str, Tensor]], traceparents: Sequence[str] = ()
) -> bytes:
    """The message handing one batch of work items' inputs to a worker, with their
    requests' trace contexts while tracing is on (`tracing.py`)."""
    message = pb.RouterMessage()
    batch = message.batch
    batch.batch_id = batch_id
    if traceparents:
        batch.traceparent.extend(traceparents)
    buffers: list[Buffer] = []
    for item in items:
        tensors = batch.items.add().tensors
        for name, tensor in item.items():
            data = tensor.data
            tensors.add(name=name, datatype=tensor.datatype, shape=tensor.shape, size=nbytes(data))
            buffers.append(data)
    return encode(message, buffers)


def welcome_message(error: str = "") -> bytes:
    return encode(pb.RouterMessage(welcome=pb.Welcome(error=error)), ())


def backlog_message(head_age_s: float | None, *, released: bool = False) -> bytes:
    """Tell a worker that does not hold this router's credit what is queued here
    (`head_age_s`: the oldest item's wait, None: nothing), and whether its credit was
    just released."""
    backlog = pb.Backlog(released=released)
    if head_age_s is not None:
        backlog.queued = True
        backlog.head_age_s = head_age_s
    return encode(pb.RouterMessage(backlog=backlog), ())


def result_tensors(result: pb.Result, payload: memoryview) -> list[dict[str, Tensor]]:
    """Each item's output tensors, as views of `payload` (items with an error: empty)."""
    out: list[dict[str, Tensor]] = []
    offset = 0
    for item in result.items:
        values = {}
        for t in item.tensors:
            end = offset + t.size
            values[t.name] = Tensor(t.datatype, tuple(t.shape), payload[offset:end])
            offset = end
        out.append(values)
    if offset != len(payload):
        raise WireError(f"result tensors take {offset} bytes of a {len(payload)}-byte payload")
    return out


# ---------------------------------------------------------------- worker side


def credit_message(*, grant: bool) -> bytes:
    """Give this router the worker's credit (`grant`) or withdraw it."""
    return encode(pb.WorkerMessage(credit=pb.Credit(grant=grant)), ())


def batch_arrays(batch: pb.Batch, payload: memoryview) -> list[dict[str, np.ndarray]]:
    """Each item's inputs as read-only numpy views of `payload` (BYTES: object arrays of
    `bytes`, decoded)."""
    out: list[dict[str, np.ndarray]] = []
    offset = 0
    for item in batch.items:
        arrays = {}
        for t in item.tensors:
            end = offset + t.size
            if t.datatype == BYTES:
                arrays[t.name] = deserialize_bytes(payload[offset:end], t.shape)
            else:
                dtype = DTYPES[t.datatype]
                arrays[t.name] = np.frombuffer(payload[offset:end], dtype=dtype).reshape(t.shape)
            offset = end
        out.append(arrays)
    if offset != len(payload):
        raise WireError(f"batch tensors take {offset} bytes of a {len(payload)}-byte payload")
    return out


def result_message(
    batch_id: int,
    outputs: Sequence[Mapping[str, np.ndarray]],
    service_s: float,
    error: str = "",
    cpu_s: float = 0.0,
    elsewhere_age_s: float | None = None,
    idle_s: float | None = None,
) -> bytes:
    """The message returning one batch's per-item outputs (or the batch's error);
    `elsewhere_age_s`: the head age of older work the worker knows at another router;
    `idle_s`: how long the worker sat idle before the batch (None: its first)."""
    message = pb.WorkerMessage()
    result = message.result
    result.batch_id = batch_id
    result.service_s = service_s
    result.cpu_s = cpu_s
    result.error = error
    if elsewhere_age_s is not None:
        result.elsewhere_age_s = elsewhere_age_s
    if idle_s is not None:
        result.idle_s = idle_s
    buffers: list[Buffer] = []
    for out in outputs:
        tensors = result.items.add().tensors
        for name, value in out.items():
            array = np.asarray(value)
            datatype = datatype_of(array)
            if datatype == BYTES:
                data = serialize_bytes(array)
                tensors.add(name=name, datatype=datatype, shape=array.shape, size=len(data))
                buffers.append(data)
                continue
            tensors.add(name=name, datatype=datatype, shape=array.shape, size=array.nbytes)
            # ascontiguousarray would also turn a 0-d array into a 1-d one.
            contiguous = array if array.flags.c_contiguous else np.ascontiguousarray(array)
            buffers.append(contiguous.data)
    return encode(message, buffers)
