"""Generated protobuf / gRPC code for sloline's wire protocols, and the pool it lives in.

`grpc_service.proto` is the Open Inference Protocol v2 service (`inference` package, the
exact messages and field numbers of Triton / KServe). Regenerate every `*_pb2*.py(i)` here
with `python scripts/gen_protos.py` after editing or adding a `.proto`; never edit them by
hand. They were generated with grpcio-tools 1.85.1 (protobuf gencode 7.35.1) and check at
import time that protobuf is >= 7.35.1 (< 8) and grpcio >= 1.85.1.

The generated modules register their descriptors in `POOL`, a descriptor pool private to
sloline, instead of protobuf's process-wide default pool. Triton's client
(`tritonclient.grpc`), KServe and others register the same `inference.*` symbols and the
same file name `grpc_service.proto` there, and the default pool refuses a second
definition; a private pool lets sloline and those clients live in one process (tests,
benchmarks, user code that calls Triton from a pipeline stage). The wire format does not
care which pool a message class came from.
"""

from __future__ import annotations

from google.protobuf import descriptor_pb2, descriptor_pool
from google.protobuf.descriptor import FileDescriptor

POOL = descriptor_pool.DescriptorPool()


def _ensure_file(name: str) -> None:
    """Make `name` resolvable in POOL, copying it (and its imports) from the default pool.

    Files generated from this folder are added by their own modules, which the generated
    code imports first; only files owned by other packages (protobuf's well-known types
    such as `google/protobuf/timestamp.proto`) need copying.
    """
    try:
        POOL.FindFileByName(name)
        return
    except KeyError:
        pass
    try:
        default_file = descriptor_pool.Default().FindFileByName(name)
    except KeyError:
        raise ImportError(
            f"proto dependency {name!r} is not loaded: import its generated *_pb2 module "
            "before the module that depends on it"
        ) from None
    proto = descriptor_pb2.FileDescriptorProto()
    default_file.CopyToProto(proto)
    for dependency in proto.dependency:
        _ensure_file(dependency)
    POOL.Add(proto)


def add_serialized_file(serialized_pb: bytes) -> FileDescriptor:
    """Register one generated file's descriptor in POOL (called by generated `*_pb2.py`)."""
    proto = descriptor_pb2.FileDescriptorProto.FromString(serialized_pb)
    for dependency in proto.dependency:
        _ensure_file(dependency)
    return POOL.AddSerializedFile(serialized_pb)
