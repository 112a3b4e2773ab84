"""The `sloline` parser: every argument explained, the internal commands hidden, and
command plugins (entry-point group ``sloline.commands``) plugged in."""

from __future__ import annotations

import argparse
import re
import tomllib
from collections.abc import Iterator
from importlib.metadata import EntryPoint
from pathlib import Path

import pytest

from sloline.cli import main, parser
from sloline.cli.parser import PLUGIN_GROUP, build_parser

ROOT = Path(__file__).resolve().parents[3]
NOOP = ROOT / "tests" / "support" / "pipelines" / "noop" / "pipeline.yaml"
INTERNAL = ("worker", "profile-stage", "profile-job")
SIMULATE = EntryPoint(name="simulate", value="sloline.lab.cli:register", group=PLUGIN_GROUP)


def plugins(monkeypatch: pytest.MonkeyPatch, *found: EntryPoint) -> None:
    """Make ``found`` the installed command plugins."""

    def entry_points(*, group: str) -> tuple[EntryPoint, ...]:
        return tuple(p for p in found if p.group == group)

    monkeypatch.setattr(parser, "entry_points", entry_points)


def subcommands(
    p: argparse.ArgumentParser, prefix: str = "sloline"
) -> Iterator[tuple[str, argparse.ArgumentParser]]:
    """``p`` and every subcommand's parser under it, hidden ones included, by name."""
    yield prefix, p
    for action in p._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in dict.items(action.choices):
                yield from subcommands(sub, f"{prefix} {name}")


def test_every_argument_of_every_command_has_help(monkeypatch: pytest.MonkeyPatch) -> None:
    plugins(monkeypatch, SIMULATE)
    walked = dict(subcommands(build_parser()))
    assert {"sloline simulate", *(f"sloline {name}" for name in INTERNAL)} <= set(walked)
    missing = [
        f"{command}: {'/'.join(action.option_strings) or action.dest}"
        for command, p in walked.items()
        for action in p._actions
        if not isinstance(action, argparse._SubParsersAction)
        and (not action.help or action.help == argparse.SUPPRESS)
    ]
    assert missing == []


def test_internal_commands_are_hidden_but_run(monkeypatch: pytest.MonkeyPatch) -> None:
    plugins(monkeypatch)
    p = build_parser()
    listing = p.format_help()
    assert re.findall(r"^    (\S+)", listing, re.MULTILINE) == [
        "validate",
        "profile",
        "plan",
        "run",
        "router",
        "calibrate",
        "operator",
        "crd",
    ]
    assert "SUPPRESS" not in listing
    args = p.parse_args(["worker", "--pipeline", "p.yaml", "--stage", "s", "--router", "r:1"])
    assert (args.command, args.stage) == ("worker", "s")
    assert p.parse_args(["profile-job", "--pipeline", "p", "--stage", "s", "--hardware", "h"])


def test_a_mistyped_command_lists_only_the_public_ones(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    plugins(monkeypatch)
    with pytest.raises(SystemExit) as exited:
        build_parser().parse_args(["nope"])
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert "invalid choice: 'nope'" in err and "'validate'" in err
    for name in INTERNAL:
        assert repr(name) not in err


def test_pyproject_declares_the_lab_command_plugin() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert project["entry-points"][PLUGIN_GROUP] == {"simulate": SIMULATE.value}
    assert project["scripts"]["sloline"] == "sloline.cli:main"


def test_command_plugins_add_their_commands(monkeypatch: pytest.MonkeyPatch) -> None:
    from sloline.lab.cli import cmd_simulate

    plugins(monkeypatch, SIMULATE)
    p = build_parser()
    assert "simulate" in p.format_help()
    args = p.parse_args(["simulate", "p.yaml", "--trace", "ramp", "--scale", "0.1"])
    assert (args.func, args.trace, args.scale, args.calibration) == (
        cmd_simulate,
        ["ramp"],
        0.1,
        None,
    )
    plugins(monkeypatch)
    with pytest.raises(SystemExit):
        build_parser().parse_args(["simulate", "p.yaml"])


def test_a_broken_plugin_is_a_warning_and_the_rest_work(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    broken = EntryPoint(name="broken", value="sloline.lab.absent:register", group=PLUGIN_GROUP)
    plugins(monkeypatch, broken, SIMULATE)
    assert main(["validate", str(NOOP)]) == 0
    out, err = capsys.readouterr()
    assert "ok: pipeline 'noop'" in out
    warnings = [line for line in err.splitlines() if line.startswith("warning:")]
    assert warnings == [
        "warning: command plugin 'broken' (sloline.lab.absent:register) not loaded: "
        "No module named 'sloline.lab.absent'"
    ]
    assert "Traceback" not in err
    assert build_parser().parse_args(["simulate", "p.yaml"]).command == "simulate"
