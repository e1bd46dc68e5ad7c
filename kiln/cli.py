"""The `kiln` command: `kiln bench` runs the benchmark, `kiln report` re-renders a saved run,
`kiln capture-cost` measures what kiln's own capture costs per model, `kiln many-shapes` what
serving many input sizes costs, `kiln autotune` fills the
autotune cache for models ahead of time, `kiln profile` times each kernel and extern of a model's
compiled graphs against the machine's peak, `kiln bench-launch` what a Triton kernel launch costs
the host."""

from __future__ import annotations

import argparse
import sys

from kiln import logs
from kiln.autotune import cli as autotune_cli
from kiln.bench import call_overhead, capture_cost, cli as bench_cli, launch_cost, many_shapes, profile_cli
from kiln.deploy import runner


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="kiln", description="kiln, a deep-learning compiler for PyTorch")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    bench_cli.add_bench_command(commands)
    bench_cli.add_report_command(commands)
    capture_cost.add_command(commands)
    many_shapes.add_command(commands)
    call_overhead.add_command(commands)
    launch_cost.add_command(commands)
    runner.add_command(commands)
    autotune_cli.add_command(commands)
    profile_cli.add_command(commands)
    args = parser.parse_args(argv)
    try:
        logs.enabled_artifacts()  # a typo in KILN_LOGS fails now, not in the middle of a run
    except ValueError as e:
        parser.error(str(e))
    return args.handler(args, parser)


if __name__ == "__main__":
    sys.exit(main())
