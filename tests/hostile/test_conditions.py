"""Hostile `when:` conditions: bounded at validation (length, depth, whatever the parser
raises is a validation issue with the field path), and any error while evaluating one
fails only that request with a 500 naming the stage and the condition, through a real
served pipeline whose worker streams keep serving."""

from __future__ import annotations

import asyncio
import concurrent.futures
import shutil
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import yaml

from sloline.cli import main
from sloline.common.tensors import InferRequest, StageFailed, Tensor
from sloline.serving import wire
from sloline.serving.dag import DagRun
from sloline.serving.proto import worker_pb2 as pb
from sloline.serving.router import Router, RouterSettings
from sloline.serving.workers import WorkerConn
from sloline.spec import ConditionError, PipelineError, parse_condition, parse_pipeline
from sloline.spec.condition import MAX_CHARS, MAX_DEPTH
from tests.support.serve import NOOP, BackgroundPipeline

MINUS_SIGNS = "-" * 1000 + "1 > 0"


def noop_doc(**stage2: Any) -> dict[str, Any]:
    doc: dict[str, Any] = yaml.safe_load(NOOP.read_text())
    doc["spec"]["stages"][1].update(stage2)
    return doc


def issues_of(doc: dict[str, Any]) -> dict[str, str]:
    with pytest.raises(PipelineError) as info:
        parse_pipeline(doc)
    return {issue.path: issue.reason for issue in info.value.issues}


# ------------------------------------------------------------------ validation


def test_a_thousand_minus_signs_is_a_validation_issue_not_a_crash(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    found = issues_of(noop_doc(when=MINUS_SIGNS))
    assert f"the limit is {MAX_DEPTH}" in found["spec.stages[1].when"]

    folder = tmp_path / "p"
    shutil.copytree(NOOP.parent, folder)
    (folder / "pipeline.yaml").write_text(yaml.safe_dump(noop_doc(when=MINUS_SIGNS)))
    assert main(["validate", str(folder / "pipeline.yaml")]) == 2
    err = capsys.readouterr().err
    assert "spec.stages[1].when" in err and f"the limit is {MAX_DEPTH}" in err
    assert "Traceback" not in err


def test_very_long_expression_names_the_length_limit() -> None:
    text = " || ".join(["s1.x > 0"] * 200)  # 2,396 characters, flat
    with pytest.raises(ConditionError, match=f"characters long; the limit is {MAX_CHARS}"):
        parse_condition(text)
    found = issues_of(noop_doc(when=text))
    assert "at most 1024 characters" in found["spec.stages[1].when"]


@pytest.mark.parametrize(
    "text",
    [
        "!" * 40 + "(max(s1.x) > 0)",
        "max(s1.x)" + " + 1" * 40 + " > 0",
        "(" * 250 + "1" + ")" * 250 + " > 0",  # past the parser's own nesting limit
        "-(" * 100 + "1" + ")" * 100 + " > 0",
    ],
)
def test_deep_nesting_is_rejected_with_the_limit(text: str) -> None:
    limit = f"the limit is {MAX_DEPTH}|too many nested parentheses"  # ours or the parser's
    with pytest.raises(ConditionError, match=limit) as info:
        parse_condition(text)
    assert len(str(info.value)) < 300  # hostile text is cut, not echoed in full


def test_parentheses_alone_add_no_depth() -> None:
    parse_condition("(" * 40 + "max(s1.x)" + ")" * 40 + " > 0")


def test_nul_bytes_and_parser_errors_are_condition_errors() -> None:
    for text in ("s1.x\x00 > 0", "s1.x >", "lambda: 1", "s1.x > 0 if 1 else 0"):
        with pytest.raises(ConditionError):
            parse_condition(text)


# ------------------------------------------------------------------ evaluation


@pytest.mark.parametrize(
    ("text", "values", "reason"),
    [
        ("1 / 0 > max(a.y)", {"y": np.ones(2)}, "ZeroDivisionError"),
        ("max(a.y) / 0 > 1", {"y": np.ones(2)}, "divide by zero"),  # numpy: errstate raise
        ("max(a.y) * 1e308 * 10 > 1", {"y": np.ones(2)}, "overflow"),
        ("a.y + a.z > 1", {"y": np.ones(2), "z": np.ones(3)}, "did not give one boolean"),
        ("max(a.y) > 0", {"y": np.ones(0)}, "zero-size array"),
        ("max(a.q) > 0", {"y": np.ones(1)}, "is missing"),
    ],
)
def test_evaluation_errors_are_condition_errors_naming_the_condition(
    text: str, values: dict[str, np.ndarray], reason: str
) -> None:
    condition = parse_condition(text)
    with pytest.raises(ConditionError, match=reason) as info:
        condition({"a": values})
    assert repr(text) in str(info.value)


def test_dag_run_turns_an_evaluation_error_into_stage_failed() -> None:
    graph = parse_pipeline(noop_doc(when="max(s1.x) > 0 || 1 / 0 > 0"))
    x = Tensor.from_array(np.zeros(2, np.float32))
    run = DagRun(graph, {"x": x})
    run.start()
    with pytest.raises(StageFailed, match=r"stage 's2': condition .*ZeroDivisionError"):
        run.complete("s1", {"x": x})


# ------------------------------------------------------------------ the router


def answer(router: Router, conn: WorkerConn, drop_from: int | None = None) -> None:
    """Play the worker: take the batch sent to `conn` and return its inputs as outputs
    (item `drop_from` returns no tensors, as a broken worker might)."""
    message, payload = wire.decode_router_message(conn._pending.popleft())
    items = wire.batch_arrays(message.batch, payload)
    outputs = [{} if i == drop_from else dict(item) for i, item in enumerate(items)]
    result, result_payload = wire.decode_worker_message(
        wire.result_message(message.batch.batch_id, outputs, 0.001)
    )
    router.on_result(conn, result.result, result_payload)


def test_on_result_fails_one_request_of_a_batch_and_advances_the_others() -> None:
    """An unexpected error while advancing one request (here the next stage's input is
    missing from a worker's result) fails that request with a 500; its batch-mate goes on
    to the next stages, and `on_result` returns normally (the worker's stream lives)."""
    router = Router(
        parse_pipeline(noop_doc()),
        max_batch={"s1": 2},
        settings=RouterSettings(deadline_factor=100),
    )

    async def scenario() -> tuple[BaseException | None, Any]:
        x = {"x": Tensor.from_array(np.ones(2, np.float32))}
        requests = [asyncio.ensure_future(router.infer(InferRequest("noop", x))) for _ in "ab"]
        await asyncio.sleep(0)  # both queued at s1
        conns = {
            stage: router.attach(pb.Hello(pipeline="noop", stage=stage, pid=1, hardware="cpu-1"))
            for stage in ("s1", "s2", "s3")
        }
        answer(router, conns["s1"], drop_from=1)  # one batch of both requests
        answer(router, conns["s2"])
        answer(router, conns["s3"])
        good, bad = await asyncio.gather(*requests, return_exceptions=True)
        return bad if isinstance(bad, BaseException) else None, good

    bad, good = asyncio.run(scenario())
    assert isinstance(bad, StageFailed) and bad.status == 500
    assert "the router failed after stage 's1': KeyError" in str(bad)
    assert good.outputs["x"].array().tolist() == [1.0, 1.0]
    assert len(router.workers) == 3


# ------------------------------------------------------------------ served


def infer(client: httpx.Client, value: float) -> httpx.Response:
    body = {"inputs": [{"name": "x", "datatype": "FP32", "shape": [2], "data": [value, value]}]}
    return client.post("/v2/models/noop/infer", json=body)


@pytest.mark.timeout(120)
def test_condition_error_at_run_time_fails_that_request_only(tmp_path: Path) -> None:
    """`1 / 0` is evaluated only for requests whose x is not positive (`||` short-circuits):
    those get a 500 naming the stage and the condition; the others, before, between and
    after them, and in the same batches, get their answers from the same workers."""
    folder = tmp_path / "p"
    shutil.copytree(NOOP.parent, folder)
    condition = "max(s1.x) > 0 || 1 / 0 > 0"
    (folder / "pipeline.yaml").write_text(yaml.safe_dump(noop_doc(when=condition)))
    with (
        BackgroundPipeline(folder / "pipeline.yaml", max_batch={"s1": 8}, run_tuner=False) as bg,
        httpx.Client(base_url=f"http://{bg.http_url}", timeout=30) as client,
    ):
        workers = set(bg.p.router.workers)
        assert infer(client, 1.0).status_code == 200
        bad = infer(client, -1.0)
        assert bad.status_code == 500, bad.text
        error = bad.json()["error"]
        assert "stage 's2'" in error and condition in error and "ZeroDivisionError" in error
        with concurrent.futures.ThreadPoolExecutor(8) as pool:
            values = [1.0 if i % 2 else -1.0 for i in range(64)]
            codes = list(pool.map(lambda v: infer(client, v).status_code, values))
        assert codes == [200 if v > 0 else 500 for v in values]
        good = infer(client, 2.0)
        assert good.status_code == 200 and good.json()["outputs"][0]["data"] == [2.0, 2.0]
        assert set(bg.p.router.workers) == workers  # no stream was torn down or replaced
