# mypy: ignore-errors
# ruff: noqa
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class Tensor(_message.Message):
    __slots__ = ("name", "datatype", "shape", "size")
    NAME_FIELD_NUMBER: _ClassVar[int]
    DATATYPE_FIELD_NUMBER: _ClassVar[int]
    SHAPE_FIELD_NUMBER: _ClassVar[int]
    SIZE_FIELD_NUMBER: _ClassVar[int]
    name: str
    datatype: str
    shape: _containers.RepeatedScalarFieldContainer[int]
    size: int
    def __init__(self, name: _Optional[str] = ..., datatype: _Optional[str] = ..., shape: _Optional[_Iterable[int]] = ..., size: _Optional[int] = ...) -> None: ...

class Item(_message.Message):
    __slots__ = ("tensors",)
    TENSORS_FIELD_NUMBER: _ClassVar[int]
    tensors: _containers.RepeatedCompositeFieldContainer[Tensor]
    def __init__(self, tensors: _Optional[_Iterable[_Union[Tensor, _Mapping]]] = ...) -> None: ...

class ItemResult(_message.Message):
    __slots__ = ("tensors", "error")
    TENSORS_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    tensors: _containers.RepeatedCompositeFieldContainer[Tensor]
    error: str
    def __init__(self, tensors: _Optional[_Iterable[_Union[Tensor, _Mapping]]] = ..., error: _Optional[str] = ...) -> None: ...

class Hello(_message.Message):
    __slots__ = ("pipeline", "stage", "worker_id", "pid", "hardware", "standby")
    PIPELINE_FIELD_NUMBER: _ClassVar[int]
    STAGE_FIELD_NUMBER: _ClassVar[int]
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    PID_FIELD_NUMBER: _ClassVar[int]
    HARDWARE_FIELD_NUMBER: _ClassVar[int]
    STANDBY_FIELD_NUMBER: _ClassVar[int]
    pipeline: str
    stage: str
    worker_id: str
    pid: int
    hardware: str
    standby: bool
    def __init__(self, pipeline: _Optional[str] = ..., stage: _Optional[str] = ..., worker_id: _Optional[str] = ..., pid: _Optional[int] = ..., hardware: _Optional[str] = ..., standby: bool = ...) -> None: ...

class Result(_message.Message):
    __slots__ = ("batch_id", "items", "error", "service_s", "cpu_s", "elsewhere_age_s", "idle_s")
    BATCH_ID_FIELD_NUMBER: _ClassVar[int]
    ITEMS_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    SERVICE_S_FIELD_NUMBER: _ClassVar[int]
    CPU_S_FIELD_NUMBER: _ClassVar[int]
    ELSEWHERE_AGE_S_FIELD_NUMBER: _ClassVar[int]
    IDLE_S_FIELD_NUMBER: _ClassVar[int]
    batch_id: int
    items: _containers.RepeatedCompositeFieldContainer[ItemResult]
    error: str
    service_s: float
    cpu_s: float
    elsewhere_age_s: float
    idle_s: float
    def __init__(self, batch_id: _Optional[int] = ..., items: _Optional[_Iterable[_Union[ItemResult, _Mapping]]] = ..., error: _Optional[str] = ..., service_s: _Optional[float] = ..., cpu_s: _Optional[float] = ..., elsewhere_age_s: _Optional[float] = ..., idle_s: _Optional[float] = ...) -> None: ...

class Leaving(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class Credit(_message.Message):
    __slots__ = ("grant",)
    GRANT_FIELD_NUMBER: _ClassVar[int]
    grant: bool
    def __init__(self, grant: bool = ...) -> None: ...

class WorkerMessage(_message.Message):
    __slots__ = ("hello", "result", "leaving", "credit", "payload")
    HELLO_FIELD_NUMBER: _ClassVar[int]
    RESULT_FIELD_NUMBER: _ClassVar[int]
    LEAVING_FIELD_NUMBER: _ClassVar[int]
    CREDIT_FIELD_NUMBER: _ClassVar[int]
    PAYLOAD_FIELD_NUMBER: _ClassVar[int]
    hello: Hello
    result: Result
    leaving: Leaving
    credit: Credit
    payload: bytes
    def __init__(self, hello: _Optional[_Union[Hello, _Mapping]] = ..., result: _Optional[_Union[Result, _Mapping]] = ..., leaving: _Optional[_Union[Leaving, _Mapping]] = ..., credit: _Optional[_Union[Credit, _Mapping]] = ..., payload: _Optional[bytes] = ...) -> None: ...

class Batch(_message.Message):
    __slots__ = ("batch_id", "items", "traceparent")
    BATCH_ID_FIELD_NUMBER: _ClassVar[int]
    ITEMS_FIELD_NUMBER: _ClassVar[int]
    TRACEPARENT_FIELD_NUMBER: _ClassVar[int]
    batch_id: int
    items: _containers.RepeatedCompositeFieldContainer[Item]
    traceparent: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, batch_id: _Optional[int] = ..., items: _Optional[_Iterable[_Union[Item, _Mapping]]] = ..., traceparent: _Optional[_Iterable[str]] = ...) -> None: ...

class Backlog(_message.Message):
    __slots__ = ("queued", "head_age_s", "released")
    QUEUED_FIELD_NUMBER: _ClassVar[int]
    HEAD_AGE_S_FIELD_NUMBER: _ClassVar[int]
    RELEASED_FIELD_NUMBER: _ClassVar[int]
    queued: bool
    head_age_s: float
    released: bool
    def __init__(self, queued: bool = ..., head_age_s: _Optional[float] = ..., released: bool = ...) -> None: ...

class Welcome(_message.Message):
    __slots__ = ("error",)
    ERROR_FIELD_NUMBER: _ClassVar[int]
    error: str
    def __init__(self, error: _Optional[str] = ...) -> None: ...

class RouterMessage(_message.Message):
    __slots__ = ("batch", "welcome", "backlog", "payload")
    BATCH_FIELD_NUMBER: _ClassVar[int]
    WELCOME_FIELD_NUMBER: _ClassVar[int]
    BACKLOG_FIELD_NUMBER: _ClassVar[int]
    PAYLOAD_FIELD_NUMBER: _ClassVar[int]
    batch: Batch
    welcome: Welcome
    backlog: Backlog
    payload: bytes
    def __init__(self, batch: _Optional[_Union[Batch, _Mapping]] = ..., welcome: _Optional[_Union[Welcome, _Mapping]] = ..., backlog: _Optional[_Union[Backlog, _Mapping]] = ..., payload: _Optional[bytes] = ...) -> None: ...
