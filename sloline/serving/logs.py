"""Log lines: plain text or JSON, each tagged with the id of the request it is about.

The front doors take a request's id from its `x-request-id` header (REST) or metadata
(gRPC), or make one, put it in :data:`REQUEST_ID` while they serve the request (a
context variable, so every task the request spawns sees it too), and return it in the
response headers / trailing metadata. :class:`RequestIdFilter` copies it onto every
record as `request_id`; :class:`JsonFormatter` writes a record as one JSON object.

An access log (logger `sloline.access`, one line per answered inference request) is off
unless :func:`configure` gets a sample fraction above 0.

The format and the sample fraction come from the command line or from the environment
(`SLOLINE_LOG_FORMAT`=text|json, `SLOLINE_ACCESS_LOG_SAMPLE`=F), which the processes a
command starts (workers) inherit.
"""

from __future__ import annotations

import contextvars
import itertools
import logging
import os
import random
from typing import IO, Final

import orjson

REQUEST_ID_HEADER: Final = "x-request-id"
FORMAT_ENV: Final = "SLOLINE_LOG_FORMAT"
ACCESS_SAMPLE_ENV: Final = "SLOLINE_ACCESS_LOG_SAMPLE"
FORMATS: Final = ("text", "json")
TEXT_FORMAT: Final = "%(asctime)s %(levelname)s %(name)s: %(message)s"

# Made ids: this process's random 64-bit prefix and a counter (unique across a
# deployment's processes without a random draw per request), 32 hex digits.
_ID_PREFIX: Final = os.urandom(8).hex()
_ids = itertools.count(1)
REQUEST_ID: contextvars.ContextVar[str] = contextvars.ContextVar("request_id", default="")
access_logger = logging.getLogger("sloline.access")
# The fraction of answered inference requests the access log records (0: none).
_access_sample = 0.0


def request_id(given: str | bytes | None) -> str:
    """The request's id: the client's when it sent one, else a new one; now current."""
    if given:
        rid = given.decode("latin-1") if isinstance(given, bytes) else given
    else:
        rid = f"{_ID_PREFIX}{next(_ids):016x}"
    REQUEST_ID.set(rid)
    return rid


def access(door: str, model: str, status: int, seconds: float) -> None:
    """One access-log line for an answered request, for the sampled fraction of them."""
    if _access_sample > 0.0 and random.random() < _access_sample:
        access_logger.info(
            "%s %s %d %.3f ms",
            door,
            model,
            status,
            seconds * 1e3,
            extra={"door": door, "model": model, "status": status, "duration_ms": seconds * 1e3},
        )


class RequestIdFilter(logging.Filter):
    """Sets `record.request_id` to the current request's id ('' outside a request)."""

    def filter(self, record: logging.LogRecord) -> bool:
        if not hasattr(record, "request_id"):
            record.request_id = REQUEST_ID.get()
        return True


_STANDARD: Final = frozenset(logging.LogRecord("", 0, "", 0, "", None, None).__dict__) | {
    "message",
    "asctime",
    "request_id",
}


class JsonFormatter(logging.Formatter):
    """One JSON object a line: time, level, logger, message, request_id, the `extra`
    fields, and the traceback (`exc_info`) when there is one."""

    def format(self, record: logging.LogRecord) -> str:
        doc: dict[str, object] = {
            "time": self.formatTime(record, "%Y-%m-%dT%H:%M:%S"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        rid = getattr(record, "request_id", "")
        if rid:
            doc["request_id"] = rid
        doc.update({k: v for k, v in record.__dict__.items() if k not in _STANDARD})
        if record.exc_info:
            doc["exc_info"] = self.formatException(record.exc_info)
        return orjson.dumps(doc, default=str).decode()


def handler(log_format: str, stream: IO[str] | None = None) -> logging.Handler:
    """A handler writing `log_format` ('text' or 'json') with request ids to `stream`
    (default stderr)."""
    if log_format not in FORMATS:
        raise ValueError(f"log format {log_format!r} is not one of {', '.join(FORMATS)}")
    out = logging.StreamHandler(stream)
    out.addFilter(RequestIdFilter())
    if log_format == "json":
        out.setFormatter(JsonFormatter())
    else:
        out.setFormatter(logging.Formatter(TEXT_FORMAT))
    return out


def configure(
    *, level: int, log_format: str | None = None, access_sample: float | None = None
) -> None:
    """Set up the root logger; unset arguments come from the environment, and the
    settings are put back there for the processes this one starts."""
    log_format = log_format or os.environ.get(FORMAT_ENV) or "text"
    if access_sample is None:
        access_sample = float(os.environ.get(ACCESS_SAMPLE_ENV) or 0.0)
    if not 0.0 <= access_sample <= 1.0:
        raise ValueError(f"access log sample {access_sample} is not a fraction in [0, 1]")
    logging.basicConfig(level=level, handlers=[handler(log_format)], force=True)
    set_access_sample(access_sample)
    os.environ[FORMAT_ENV] = log_format
    os.environ[ACCESS_SAMPLE_ENV] = repr(access_sample)


def set_access_sample(fraction: float) -> None:
    """Record `fraction` of answered requests in the access log (tests, embedding)."""
    global _access_sample  # noqa: PLW0603 (the process's one access-log setting)
    _access_sample = fraction
