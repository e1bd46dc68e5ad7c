"""`python -m tests.fuzz --cases N --seed S [--start K] [--out DIR] [--jobs J]`: the graph fuzzer."""

from __future__ import annotations

import argparse
import sys
import time

from tests.fuzz.run import run, summary


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.fuzz", description=__doc__)
    parser.add_argument("--cases", type=int, default=100, help="how many cases")
    parser.add_argument("--seed", type=int, default=0, help="the seed; a case is reproduced by (seed, case index)")
    parser.add_argument("--start", type=int, default=0, help="index of the first case")
    parser.add_argument("--out", default="fuzz-out", help="folder for the repro files of failures")
    parser.add_argument("--jobs", type=int, default=1, help="worker processes")
    parser.add_argument("--cache-dir", default=None, help="kiln's compile cache (default: a new temporary folder)")
    parser.add_argument("--show", action="store_true", help="print the program of case --start and exit")
    args = parser.parse_args(argv)
    if args.show:
        from tests.fuzz.generate import generate
        prog = generate(args.seed, args.start)
        print(prog.source(), "\n".join(f"{i.name} = {i.call()}" for i in prog.inputs), f"door: {prog.door}", sep="\n")
        return 0
    began = time.time()
    results = run(args.cases, args.seed, args.start, args.out, args.jobs, args.cache_dir,
                  progress=lambda line: print(line, flush=True))
    print(summary(results, time.time() - began), flush=True)
    return 1 if any(r.status == "fail" for r in results) else 0


if __name__ == "__main__":
    sys.exit(main())
