"""`kiln build-runner [--out DIR]`: builds `kiln-run` (kiln/native/src/kiln_run.cpp over the header
kiln/native/include/kiln_artifact.h) against the libtorch inside the installed torch wheel, and
prints its path. The runner runs an exported artifact without Python (docs/deploy.md)."""

from __future__ import annotations

import argparse
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Any

from kiln.native import INCLUDE
import kiln
from kiln.native.build import compiler, machine
from kiln.native.libkiln import torch_flags

SOURCE = Path(__file__).parents[1] / "native" / "src" / "kiln_run.cpp"


def build_runner(out: str | Path) -> Path:
    """`kiln-run` built into the folder `out`; its path."""
    cxx, _ = compiler()
    compile_flags, link_flags = torch_flags()
    folder = Path(out)
    folder.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=folder) as tmp:
        target = Path(tmp) / "kiln-run"
        checks = [f'-DKILN_ISA="{machine()}"', f'-DKILN_VERSION="{kiln.__version__}"']
        command = [cxx, "-O2", *[f for f in compile_flags if f != "-fvisibility=hidden"], *checks, f"-I{INCLUDE}", str(SOURCE),
                   "-o", str(target), *link_flags, "-ltorch", "-ldl"]
        done = subprocess.run(command, capture_output=True, text=True)
        if done.returncode != 0:
            raise RuntimeError(f"kiln build-runner: the compiler failed:\n{done.stderr[-4000:]}")
        shutil.move(target, folder / "kiln-run")
    return folder / "kiln-run"


def main(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    print(build_runner(args.out))
    return 0


def add_command(commands: Any) -> None:
    parser = commands.add_parser("build-runner", help="build kiln-run, which runs an exported artifact without Python")
    parser.add_argument("--out", default=".", help="folder to put kiln-run in (default: the current one)")
    parser.set_defaults(handler=main)
