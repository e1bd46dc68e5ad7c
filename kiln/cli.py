"""The `kiln` command: `kiln run` serves an exported model, `kiln autotune` answers a workload's
autotune questions ahead of time, `kiln prebuild` builds kiln's own libraries at install time, `kiln bisect` finds the stage that makes a model's output wrong; the commands other installed packages add (entry points in the
group `kiln.commands`: the repository's `benchmarks` package adds `kiln bench`, `kiln report`,
`kiln profile`, `kiln capture-cost`, `kiln many-shapes`, `kiln call-overhead`, `kiln bench-launch`).

The product never imports the benchmark: a command is an `add_command(subparsers)` function found
by its entry point, so `kiln bench` exists wherever `benchmarks` is installed (the README's
`pip install -e .[bench]`) and nowhere else."""

from __future__ import annotations

import argparse
import importlib
import sys
from importlib.metadata import entry_points

from kiln import logs
from kiln.autotune import cli as autotune_cli
from kiln.debug import cli as bisect_cli
from kiln.deploy import runner
from kiln.native import prebuild

COMMAND_GROUP = "kiln.commands"


def main(argv: list[str] | None = None, extra: dict[str, str] | None = None) -> int:
    """Run the `kiln` command line; `extra`: command -> "module:function" adding it, for commands
    of a package that is not installed (its entry points are not there)."""
    parser = argparse.ArgumentParser(prog="kiln", description="kiln, a deep-learning compiler for PyTorch")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    runner.add_command(commands)
    autotune_cli.add_command(commands)
    prebuild.add_command(commands)
    bisect_cli.add_command(commands)
    added = {entry.name: entry.value for entry in entry_points(group=COMMAND_GROUP)}
    for name, target in sorted({**added, **(extra or {})}.items()):
        module, _, function = target.partition(":")
        getattr(importlib.import_module(module), function)(commands)
    args = parser.parse_args(argv)
    try:
        logs.enabled_artifacts()  # a typo in KILN_LOGS fails now, not in the middle of a run
    except ValueError as e:
        parser.error(str(e))
    return args.handler(args, parser)


if __name__ == "__main__":
    sys.exit(main())
