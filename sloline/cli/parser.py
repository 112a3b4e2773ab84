"""The `sloline` argument parser: each command module adds its own subcommands, and
command plugins (the entry-point group ``sloline.commands``) add theirs."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterator
from importlib.metadata import entry_points
from typing import TYPE_CHECKING, Any

from sloline import __version__
from sloline.cli import calibrate, crd, internal, operator, planning, serve

PLUGIN_GROUP = "sloline.commands"  # each entry point: a function register(subparsers)


class _Commands(dict[str, argparse.ArgumentParser]):
    """The subcommands by name. Iteration (argparse's "invalid choice" list) skips the
    hidden ones; looking them up finds them."""

    def __init__(self) -> None:
        super().__init__()
        self.hidden: set[str] = set()

    def __iter__(self) -> Iterator[str]:
        return (name for name in super().__iter__() if name not in self.hidden)


if TYPE_CHECKING:
    _SubParsersAction = argparse._SubParsersAction[argparse.ArgumentParser]
else:  # not subscriptable at run time
    _SubParsersAction = argparse._SubParsersAction


class _SubcommandsAction(_SubParsersAction):
    """Subcommands added with ``help=argparse.SUPPRESS`` stay out of `--help` and of the
    choices listed on a mistyped command (Python 3.11 would list them as "==SUPPRESS==")."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._name_parser_map = self.choices = _Commands()

    def add_parser(self, name: str, **kwargs: Any) -> argparse.ArgumentParser:
        hidden = kwargs.get("help") is argparse.SUPPRESS
        if hidden:
            del kwargs["help"]  # no entry in the listing
        parser = super().add_parser(name, **kwargs)
        if hidden:
            assert isinstance(self.choices, _Commands)
            self.choices.hidden.add(name)
        return parser


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="sloline",
        description="Serve multi-model prediction pipelines under a tail-latency SLO.",
    )
    parser.add_argument("--version", action="version", version=f"sloline {__version__}")
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    parser.register("action", "parsers", _SubcommandsAction)
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    planning.register(sub)  # validate, profile, plan
    serve.register(sub)  # run, router
    calibrate.register(sub)
    operator.register(sub)
    crd.register(sub)
    internal.register(sub)  # worker, profile-stage, profile-job: hidden
    _register_plugins(sub)
    return parser


def _register_plugins(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Let each installed command plugin add its subcommands; one that fails is reported
    in a warning and left out."""
    for plugin in entry_points(group=PLUGIN_GROUP):
        try:
            plugin.load()(sub)
        except Exception as exc:  # a broken plugin must not take the other commands down
            print(
                f"warning: command plugin {plugin.name!r} ({plugin.value}) not loaded: {exc}",
                file=sys.stderr,
            )
