"""`python -m benchmarks COMMAND ...`: the `kiln` command with the benchmark's commands, whether or
not the repository is installed (its entry points exist only once it is)."""

import sys

from benchmarks import COMMANDS
from kiln.cli import main

sys.exit(main(extra=COMMANDS))
