"""kiln's benchmark, beside the product: `kiln bench` (eager, torch.compile and kiln side by side on
real models), `kiln report`, `kiln profile`, `kiln capture-cost`, `kiln many-shapes`,
`kiln call-overhead`, `kiln bench-launch` (docs/bench.md).

Installed, these join the `kiln` command through the entry-point group `kiln.commands`
(pyproject.toml). From a checkout that is not installed (a lent GPU machine), `python -m benchmarks
bench ...` is the same command line: `COMMANDS` are added to kiln's parser directly."""

COMMANDS = {  # command -> "module:function" adding it to the `kiln` parser (pyproject.toml lists the same)
    "bench": "benchmarks.cli:add_bench_command",
    "report": "benchmarks.cli:add_report_command",
    "profile": "benchmarks.profile_cli:add_command",
    "capture-cost": "benchmarks.capture_cost:add_command",
    "many-shapes": "benchmarks.many_shapes:add_command",
    "call-overhead": "benchmarks.call_overhead:add_command",
    "bench-launch": "benchmarks.launch_cost:add_command",
    "dynamo-parity": "benchmarks.dynamo_parity:add_command",
}
