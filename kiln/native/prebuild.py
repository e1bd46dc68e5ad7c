"""`kiln prebuild`: kiln's own libraries — its runtime over libtorch (libkiln.py) and its CPython
extension (python_door.py) — built at install time into `cache.prebuilt_dir` (by default
`<sys.prefix>/share/kiln`, the virtual environment's own folder), so that no user's first compile
waits for them (~25 s on 2 cores, one after the other). The README's set-up (`make setup`) runs it.

Both are keyed like every C++ library (sources, compiler, `-march=native`'s ISA, flags, torch's and
Python's headers): a later process looks there first and uses an entry only when its key matches,
so an installation moved to another machine, or a torch upgraded in place, builds into the cache
as before instead of loading the wrong library."""

from __future__ import annotations

import argparse
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from kiln import config
from kiln.native import libkiln, python_door
from kiln.native.build import prebuild_library, prebuilt_library

LIBRARIES = {"runtime": libkiln.build_arguments, "extension": python_door.build_arguments}


def prebuild() -> list[tuple[str, Path, bool, float]]:
    """Build every one of kiln's own libraries missing from `cache.prebuilt_dir`, side by side:
    (name, path, built now, seconds) each."""

    def one(name: str) -> tuple[str, Path, bool, float]:
        start = time.perf_counter()
        path, built = prebuild_library(*LIBRARIES[name]())
        return name, path, built, time.perf_counter() - start

    with ThreadPoolExecutor(len(LIBRARIES)) as pool:
        return list(pool.map(one, LIBRARIES))


def missing() -> list[str]:
    """The names of kiln's own libraries `cache.prebuilt_dir` lacks for this process."""
    return [name for name, arguments in LIBRARIES.items() if prebuilt_library(*arguments()) is None]


def main(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    if args.dir:
        config.cache.prebuilt_dir = args.dir
    try:
        done = prebuild()
    except (OSError, RuntimeError) as error:
        print(f"kiln prebuild: could not build into {config.prebuilt_dir()}: {error}")
        return 1
    for name, path, built, seconds in done:
        print(f"{name}: {path} ({f'built in {seconds:.1f} s' if built else 'already built'})")
    return 0


def add_command(commands: Any) -> None:
    parser = commands.add_parser("prebuild", help="build kiln's own C++ libraries (its runtime and its Python extension) "
                                 "for this machine, torch and Python at install time, so no first compile waits for them")
    parser.add_argument("--dir", default="", help="where to put them (default: cache.prebuilt_dir, "
                        "<sys.prefix>/share/kiln); a later process must have KILN_PREBUILT_DIR set to the same")
    parser.set_defaults(handler=main)
