"""What a client request must satisfy, checked once, at the router.

The front doors only decode the wire format (`codec`, `rest_codec`, `grpc_codec`): they
pass the model name and version, the inputs, the parameters and the requested outputs
through to the `DataPlane`, and the router checks them here, the same way for both doors
(KServe's and MLServer's layering). Every check raises an `InferenceError` whose status
and message the client sees: `ModelNotFound` (404) for a model or version the router does
not serve, `InvalidInput` (400) for everything else.

Workers do not check their inputs again: a stage's inputs are pipeline inputs checked
here or the outputs of an upstream stage, which its `StageRunner` conformed to their
declaration when the model produced them (`sloline.runtimes.runner`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

from sloline.common.tensors import InvalidInput, ModelNotFound, StageFailed, Tensor
from sloline.spec import PipelineGraph

# A router serves one version of its pipeline; OIP clients may name it.
VERSIONS: Final = ("1",)


class RequestChecks:
    """The checks on one pipeline's requests: model, inputs, parameters, outputs."""

    def __init__(
        self,
        graph: PipelineGraph,
        *,
        default_timeout_s: float,
        max_timeout_factor: float,
        max_timeout_s: float,
        max_rows: int = 64,
    ) -> None:
        self.name = graph.name
        self.max_rows = max_rows
        self._slo_s = graph.pipeline.spec.slo.latency_ms / 1000.0
        self._inputs = {t.name: t for t in graph.pipeline.spec.inputs}
        self._outputs = frozenset(t.name for t in graph.output.spec.outputs)
        self._default_timeout_s = default_timeout_s
        self._max_timeout_factor = max_timeout_factor
        self._max_timeout_s = max_timeout_s
        self._max_timeout_ms = max(max_timeout_factor * self._slo_s, max_timeout_s) * 1000.0

    def model(self, name: str, version: str = "") -> None:
        """404 unless this router serves `name` (and `version`, when one is given)."""
        if name != self.name:
            raise ModelNotFound(f"unknown model {name!r}; this router serves {self.name!r}")
        if version and version not in VERSIONS:
            raise ModelNotFound(
                f"model {name!r} has no version {version!r}; it has {list(VERSIONS)}"
            )

    def inputs(self, given: Mapping[str, Tensor]) -> tuple[list[dict[str, Tensor]], int | None]:
        """Check names, datatypes and shapes; return each row's inputs and the number of
        rows: a request without a leading batch dimension is one row (None), one with
        a leading dimension N is N rows (1 to `max_rows`), each served as a request of
        its own and answered together (`shape_outputs`)."""
        unknown = sorted(set(given) - set(self._inputs))
        if unknown:
            raise InvalidInput(f"unknown input(s) {unknown}; expected {sorted(self._inputs)}")
        inputs: dict[str, Tensor] = {}
        leads: set[int | None] = set()
        for name, spec in self._inputs.items():
            tensor = given.get(name)
            if tensor is None:
                raise InvalidInput(f"missing input {name!r} ({spec.datatype} {spec.shape})")
            if tensor.datatype != spec.datatype:
                raise InvalidInput(
                    f"input {name!r} has datatype {tensor.datatype}, expected {spec.datatype}"
                )
            shape = tensor.shape
            lead = None
            if len(shape) == len(spec.shape) + 1:
                lead, shape = shape[0], shape[1:]
            if len(shape) != len(spec.shape) or any(
                want not in (-1, got) for want, got in zip(spec.shape, shape, strict=True)
            ):
                raise InvalidInput(
                    f"input {name!r} has shape {list(tensor.shape)}, expected {spec.shape} "
                    f"or [N, {', '.join(map(str, spec.shape))}] for N rows, N at most "
                    f"{self.max_rows} (-1 = any size)"
                )
            if lead is not None and not 1 <= lead <= self.max_rows:
                raise InvalidInput(
                    f"input {name!r} has {lead} rows (shape {list(tensor.shape)}); a request "
                    f"takes 1 to {self.max_rows} rows (the router's max_rows): split it"
                )
            leads.add(lead)
            inputs[name] = tensor
        if len(leads) > 1:
            raise InvalidInput(
                "inputs disagree on their leading batch dimension (rows): "
                + ", ".join(f"{n} {list(t.shape)}" for n, t in inputs.items())
            )
        rows = leads.pop()
        if rows is None:
            return [inputs], None
        if rows == 1:
            return [{n: Tensor(t.datatype, t.shape[1:], t.data) for n, t in inputs.items()}], 1
        split = {n: t.split_rows() for n, t in inputs.items()}
        return [{n: parts[i] for n, parts in split.items()} for i in range(rows)], rows

    def timeout(self, parameters: Mapping[str, Any]) -> float:
        """The request's deadline in seconds: `timeout_ms`, a finite number of
        milliseconds in (0, max(max_timeout_factor x SLO, max_timeout_s)], else the
        default."""
        value = parameters.get("timeout_ms")
        if value is None:
            return self._default_timeout_s
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise InvalidInput(
                f"parameter timeout_ms must be a number of milliseconds, got {value!r} "
                f"({type(value).__name__})"
            )
        # NaN fails both comparisons, inf and 1e300 the second.
        if not 0 < value <= self._max_timeout_ms:
            raise InvalidInput(
                f"parameter timeout_ms must be above 0 and at most {self._max_timeout_ms:g} "
                f"(the larger of {self._max_timeout_factor:g} x the pipeline's "
                f"{self._slo_s * 1000:g} ms SLO and {self._max_timeout_s:g} s), "
                f"got {value!r}"
            )
        return float(value) / 1000.0

    @staticmethod
    def priority(parameters: Mapping[str, Any]) -> None:
        """Triton's `priority` (an unsigned integer, 0 = the default level) is accepted for
        its clients' sake and not used: every stage queue is one FIFO, which the estimator
        simulates. A value Triton would refuse is refused here too."""
        value = parameters.get("priority")
        if value is not None and (
            isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < 2**64
        ):
            raise InvalidInput(
                f"parameter priority must be an integer in [0, 2^64), got {value!r} "
                "(sloline accepts it for Triton's clients and serves every request in FIFO "
                "order)"
            )

    def outputs(self, requested: tuple[str, ...] | None) -> None:
        """400 for a requested output the pipeline does not declare (before it runs)."""
        if requested is None:
            return
        unknown = sorted(set(requested) - self._outputs)
        if unknown:
            raise InvalidInput(f"unknown output(s) {unknown}; available {sorted(self._outputs)}")

    @staticmethod
    def shape_outputs(
        rows: list[dict[str, Tensor]], requested: tuple[str, ...] | None, count: int | None
    ) -> dict[str, Tensor]:
        """The answer's outputs: the ones requested (checked by `outputs`), in the order
        asked for, all when none was; with the leading batch dimension the inputs had
        (`count` rows stacked, in order; None: the one row as it is)."""
        if count is None:
            outputs = rows[0]
            return outputs if requested is None else {name: outputs[name] for name in requested}
        if count == 1:
            one = rows[0] if requested is None else {name: rows[0][name] for name in requested}
            return {n: Tensor(t.datatype, (1, *t.shape), t.data) for n, t in one.items()}
        if requested is None:
            requested = tuple(rows[0])
        out = {}
        for name in requested:
            try:
                out[name] = Tensor.join_rows([row[name] for row in rows])
            except ValueError as exc:
                raise StageFailed(
                    f"output {name!r}: the request's rows cannot be stacked: {exc}; send "
                    "them as separate requests"
                ) from None
        return out
