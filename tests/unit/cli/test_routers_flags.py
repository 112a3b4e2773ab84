"""`sloline worker --router` and `sloline router --peers` entries, `sloline run --routers`."""

from __future__ import annotations

import argparse
from types import SimpleNamespace

import pytest

from sloline.cli.flags import address_entries
from sloline.cli.parser import build_parser
from sloline.cli.serve import _planned_routers, _routers
from sloline.spec import PipelineError


def test_router_takes_comma_separated_entries_and_repeats() -> None:
    flags = ["--router", "a:1, b:2", "--router", "[::1]:3"]
    args = build_parser().parse_args(["worker", "--pipeline", "p.yaml", "--stage", "s", *flags])
    assert address_entries(args.router, "--router") == ("a:1", "b:2", "[::1]:3")
    assert args.resolve_s == 2.0


@pytest.mark.parametrize("bad", ["a", "a:", ":1", "a:0", "a:70000", "a:x", ","])
def test_a_bad_router_entry_is_named(bad: str) -> None:
    with pytest.raises(PipelineError, match="--router"):
        address_entries([bad], "--router")


def test_router_takes_its_peers_metrics_ports() -> None:
    flags = ["--peers", "p-router-workers:8002", "--peers", "10.0.0.2:8002,10.0.0.3:8002"]
    args = build_parser().parse_args(["router", "--pipeline", "p.yaml", *flags])
    assert address_entries(args.peers, "--peers") == (
        "p-router-workers:8002",
        "10.0.0.2:8002",
        "10.0.0.3:8002",
    )
    assert build_parser().parse_args(["router", "--pipeline", "p.yaml"]).peers == []
    with pytest.raises(PipelineError, match="--peers"):
        address_entries(["p-router-workers"], "--peers")


def run_args(*flags: str) -> argparse.Namespace:
    return build_parser().parse_args(["run", "p.yaml", *flags])


def test_routers_default_from_the_cores_but_one_with_replan() -> None:
    assert _routers(run_args(), lambda: 3) == 3
    assert _routers(run_args("--replan"), lambda: 3) == 1
    assert _routers(run_args("--routers", "2"), lambda: 3) == 2
    with pytest.raises(PipelineError, match="--routers"):
        _routers(run_args("--routers", "0"), lambda: 3)
    with pytest.raises(PipelineError, match="--replan"):
        _routers(run_args("--routers", "2", "--replan"), lambda: 3)


def test_a_plan_that_needs_more_routers_raises_the_default_only() -> None:
    plan = SimpleNamespace(routers=3)
    assert _planned_routers(run_args(), 1, plan) == 3  # type: ignore[arg-type]
    assert _planned_routers(run_args(), 4, plan) == 4  # type: ignore[arg-type]
    assert _planned_routers(run_args("--routers", "1"), 1, plan) == 1  # type: ignore[arg-type]
    assert _planned_routers(run_args("--replan"), 1, plan) == 1  # type: ignore[arg-type]
