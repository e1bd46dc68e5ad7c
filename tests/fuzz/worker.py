"""A worker process of the fuzzer, so that a case that kills its process (a segfault in generated
code) is reported as a failure instead of ending the run.

`python -m tests.fuzz.worker run SEED OUT CACHE CASE...` prints `START k` before and `RESULT {json}`
after each case; `python -m tests.fuzz.worker check CACHE` reads a pickled Program on stdin and
prints its pickled Outcome (the shrinker's check of a case that crashes its process).
"""

from __future__ import annotations

import base64
import json
import pickle
import subprocess
import sys
from dataclasses import asdict
from pathlib import Path

import kiln

SIGNAL_KIND = "process died"

ROOT = Path(__file__).resolve().parents[2]  # the repository: workers import tests.fuzz from it


def isolated_check(prog, cache_dir: str):
    """check(prog) in a child process; a child killed by a signal is a failure of kind SIGNAL_KIND."""
    from tests.fuzz.check import Outcome
    proc = subprocess.run([sys.executable, "-m", "tests.fuzz.worker", "check", cache_dir],
                          input=pickle.dumps(prog), capture_output=True, timeout=600, cwd=ROOT)
    if proc.returncode != 0:
        return Outcome("fail", SIGNAL_KIND, f"the process running the case exited with {proc.returncode} "
                       f"(signal {-proc.returncode if proc.returncode < 0 else 'none'})\n"
                       f"{proc.stderr.decode(errors='replace')[-1500:]}", [])
    return pickle.loads(base64.b64decode(proc.stdout.split(b"\n")[-2]))


def main(argv: list[str]) -> int:
    if argv[0] == "check":
        from tests.fuzz.check import check
        prog = pickle.loads(sys.stdin.buffer.read())
        with kiln.config.patch({"cache.dir": argv[1]}):
            outcome = check(prog)
        sys.stdout.write("\n" + base64.b64encode(pickle.dumps(outcome)).decode() + "\n")
        return 0
    from tests.fuzz.run import reason_key, run_case
    seed, out, cache = int(argv[1]), argv[2], argv[3]
    seen: set = set(json.loads(argv[4]))  # fallback reasons already shrunk into a repro
    with kiln.config.patch({"cache.dir": cache}):
        for case in map(int, argv[5:]):
            print(f"START {case}", flush=True)
            result = run_case(seed, case, Path(out) if out else None, seen)
            if result.status == "fallback":
                seen.add(reason_key(result.fallbacks[0]))
            print("RESULT " + json.dumps(asdict(result)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
