"""Stage profiles as Kubernetes termination messages, and the pipeline profile built from them.

On Kubernetes each (stage, hardware class) is profiled by a Job (`sloline profile-job`)
whose pod writes its result to `/dev/termination-log`; the operator reads it from the
pod status (`state.terminated.message`) and plans with the ordinary planner. Kubernetes
keeps at most 4096 bytes of that message, so the format is compact JSON on one line
(version 1):

```
{"v":1,"stage":"fast","hardware":"cpu-1",
 "us":[[1,812,1045,830],[2,950,1201,961],...],
 "hopUs":412,
 "visits":{"stages":["preprocess","fast","accurate"],"n":256,"bits":"eJz7..."}}
```

- `us`: one row per measured batch size: batch size, p50, p99 and mean latency of one
  batch, in whole microseconds (at least 1). Raw samples are not carried, so the
  estimator's `samples` service mode is unavailable from these profiles; the planner's
  default (`p50`) and the tuner need only these statistics.
- `hopUs` (optional): the router -> worker -> router overhead per stage visit measured in
  the Job's pod (the same loopback measurement `sloline profile` makes).
- `visits` (optional): the visit matrix of the pipeline's samples (which stages each
  sample ran, InferLine §4.1 scale factors with conditional routing), row-major bits,
  zlib-compressed, base64. Every Job traces the whole pipeline to get its stage's
  inputs, so every message carries it. When it does not fit, `scale` (the per-stage visit
  fractions) replaces it, and when even that does not fit, neither is sent.

:func:`assemble_profile` turns a set of messages into the :class:`PipelineProfile` the
planner takes: stage profiles per hardware class, the visit matrix (or scale factors) of
the newest message that covers every stage, and the median of the measured hops.
"""

from __future__ import annotations

import base64
import json
import statistics
import zlib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

from sloline.planner.profile import BatchLatency, PipelineProfile, StageProfile

__all__ = [
    "DEFAULT_HOP_S",
    "MAX_MESSAGE_BYTES",
    "ProfileMessage",
    "assemble_profile",
    "decode_message",
    "decode_profile",
    "encode_message",
    "encode_profile",
]

MAX_MESSAGE_BYTES = 4096  # Kubernetes truncates termination messages here
FORMAT_VERSION = 1
# Per-hop overhead assumed when no message carries a measurement: a pod-to-pod gRPC
# round trip with serialisation, a little above the ~0.3-0.5 ms measured on loopback.
DEFAULT_HOP_S = 0.001


@dataclass(frozen=True, slots=True, eq=False)
class ProfileMessage:
    """What one profiling Job reports."""

    stage: str
    profile: StageProfile
    hop_s: float | None = None
    visits: npt.NDArray[np.bool_] | None = None  # [samples, len(visit_stages)]
    visit_stages: tuple[str, ...] = ()
    scale_factors: Mapping[str, float] = field(default_factory=dict)

    @property
    def hardware(self) -> str:
        return self.profile.hardware


def _us(seconds: float) -> int:
    return max(1, round(seconds * 1e6))


def _pack_visits(visits: npt.NDArray[np.bool_]) -> str:
    packed = np.packbits(np.asarray(visits, dtype=np.bool_).ravel())
    return base64.b64encode(zlib.compress(packed.tobytes(), 9)).decode("ascii")


def _unpack_visits(text: str, rows: int, cols: int) -> npt.NDArray[np.bool_]:
    raw = np.frombuffer(zlib.decompress(base64.b64decode(text, validate=True)), dtype=np.uint8)
    bits = np.unpackbits(raw, count=rows * cols)
    if bits.size != rows * cols:
        raise ValueError(f"visit bits hold {bits.size} values, expected {rows} x {cols}")
    return bits.reshape(rows, cols).astype(np.bool_)


def _dump(doc: Mapping[str, Any]) -> str:
    return json.dumps(doc, separators=(",", ":"))


def encode_message(message: ProfileMessage, *, limit_bytes: int = MAX_MESSAGE_BYTES) -> str:
    """The message as compact JSON of at most `limit_bytes` bytes (see the module doc).

    Raises ValueError when even the latency table alone does not fit.
    """
    doc: dict[str, Any] = {
        "v": FORMAT_VERSION,
        "stage": message.stage,
        "hardware": message.hardware,
        "us": [
            [p.batch_size, _us(p.p50_s), _us(p.p99_s), _us(p.mean_s)]
            for p in message.profile.points
        ],
    }
    if message.hop_s is not None:
        doc["hopUs"] = round(message.hop_s * 1e6)
    fallbacks: list[dict[str, Any]] = []
    if message.visits is not None:
        visits = np.asarray(message.visits, dtype=np.bool_)
        fallbacks.append(
            {
                "visits": {
                    "stages": list(message.visit_stages),
                    "n": int(visits.shape[0]),
                    "bits": _pack_visits(visits),
                }
            }
        )
        means = visits.mean(axis=0) if visits.shape[0] else np.ones(len(message.visit_stages))
        scale = dict(zip(message.visit_stages, means.tolist(), strict=True))
    else:
        scale = dict(message.scale_factors)
    if scale:
        fallbacks.append({"scale": {k: round(v, 4) for k, v in scale.items()}})
    for extra in [*fallbacks, {}]:
        text = _dump({**doc, **extra})
        if len(text.encode()) <= limit_bytes:
            return text
    raise ValueError(
        f"the profile of stage {message.stage!r} on {message.hardware!r} "
        f"({len(doc['us'])} batch sizes) does not fit in {limit_bytes} bytes; "
        "profile fewer batch sizes (lower --cap)"
    )


def encode_profile(
    stage: str,
    hardware: str,
    points: StageProfile | Sequence[BatchLatency],
    *,
    hop_s: float | None = None,
    visits: npt.NDArray[np.bool_] | None = None,
    visit_stages: Sequence[str] = (),
    limit_bytes: int = MAX_MESSAGE_BYTES,
) -> str:
    """Encode one stage's profile on one hardware class (see :func:`encode_message`)."""
    profile = (
        points
        if isinstance(points, StageProfile)
        else StageProfile(hardware=hardware, points=tuple(points))
    )
    if profile.hardware != hardware:
        raise ValueError(f"profile is for {profile.hardware!r}, not {hardware!r}")
    return encode_message(
        ProfileMessage(stage, profile, hop_s, visits, tuple(visit_stages)),
        limit_bytes=limit_bytes,
    )


def decode_message(text: str) -> ProfileMessage:
    """Parse a message written by :func:`encode_message`; ValueError says what is wrong."""
    try:
        doc = json.loads(text)
        if not isinstance(doc, dict):
            raise TypeError("not a JSON object")
        if doc.get("v") != FORMAT_VERSION:
            raise ValueError(f"unsupported format version {doc.get('v')!r}")
        hardware = str(doc["hardware"])
        profile = StageProfile(
            hardware=hardware,
            points=tuple(
                BatchLatency(int(b), p50 / 1e6, p99 / 1e6, mean / 1e6)
                for b, p50, p99, mean in doc["us"]
            ),
        )
        hop_s = float(doc["hopUs"]) / 1e6 if "hopUs" in doc else None
        visits = None
        visit_stages: tuple[str, ...] = ()
        if "visits" in doc:
            visit_stages = tuple(str(s) for s in doc["visits"]["stages"])
            visits = _unpack_visits(
                doc["visits"]["bits"], int(doc["visits"]["n"]), len(visit_stages)
            )
        scale = {str(k): float(v) for k, v in doc.get("scale", {}).items()}
        return ProfileMessage(str(doc["stage"]), profile, hop_s, visits, visit_stages, scale)
    except (KeyError, TypeError, ValueError, zlib.error) as exc:
        head = text[:80] + ("..." if len(text) > 80 else "")
        raise ValueError(
            f"not a sloline profile message ({type(exc).__name__}: {exc}): {head!r}"
        ) from None


def decode_profile(text: str) -> StageProfile:
    """The stage profile in a message (its stage name: ``decode_message(text).stage``)."""
    return decode_message(text).profile


def assemble_profile(
    messages: Iterable[ProfileMessage | str],
    *,
    hop_s: float | None = None,
    default_hop_s: float = DEFAULT_HOP_S,
) -> PipelineProfile:
    """The :class:`PipelineProfile` of a set of Jobs' messages, for the planner.

    Pass messages oldest first: a later profile of the same (stage, hardware) replaces an
    earlier one, and the visit matrix (else the scale factors) comes from the newest
    message that covers every profiled stage, since routing depends on the whole
    pipeline. The hop overhead is `hop_s` if given, else the median of the messages'
    measurements, else `default_hop_s`.
    """
    decoded = [m if isinstance(m, ProfileMessage) else decode_message(m) for m in messages]
    if not decoded:
        raise ValueError("no profile messages to assemble")
    stages: dict[str, dict[str, StageProfile]] = {}
    for message in decoded:
        stages.setdefault(message.stage, {})[message.hardware] = message.profile
    names = set(stages)
    visits: npt.NDArray[np.bool_] | None = None
    visit_stages: tuple[str, ...] = ()
    scale: dict[str, float] = {}
    for message in reversed(decoded):
        if message.visits is not None and names <= set(message.visit_stages):
            visits, visit_stages = message.visits, message.visit_stages
            break
        if message.scale_factors and names <= set(message.scale_factors):
            scale = {n: message.scale_factors[n] for n in names}
            break
    if hop_s is None:
        measured = [m.hop_s for m in decoded if m.hop_s is not None]
        hop_s = statistics.median(measured) if measured else default_hop_s
    return PipelineProfile(
        stages=stages,
        scale_factors=scale,
        hop_s=hop_s,
        visits=visits,
        visit_stages=visit_stages,
    )
