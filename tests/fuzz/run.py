"""Run a range of fuzz cases and summarize them (the body of `python -m tests.fuzz`)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import tempfile
import time
import traceback
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from tests.fuzz.check import Outcome, check
from tests.fuzz.generate import generate
from tests.fuzz.ops import OPS

FAMILY = {name: family for name, _, _, family in OPS}

ROOT = Path(__file__).resolve().parents[2]  # the repository: workers import tests.fuzz from it


@dataclass
class CaseResult:
    case: int
    status: str
    kind: str = ""
    detail: str = ""
    fallbacks: list[str] = field(default_factory=list)
    repro: str = ""
    door: str = "kiln"
    ops: dict = field(default_factory=dict)


def reason_key(reason: str) -> str:
    """A fallback reason without its numbers and paths, so that like reasons count together."""
    return re.sub(r"\d+", "N", re.sub(r"/\S+", "PATH", reason))[:120]


def run_case(seed: int, case: int, out_dir: Path | None, shrink_fallbacks: set | None = None) -> CaseResult:
    """Generate, check and (on failure, if `out_dir`) shrink one case."""
    prog = generate(seed, case)
    try:
        outcome = check(prog)
    except Exception as e:  # the harness itself failed: report it as a failure, never lose it
        outcome = Outcome("fail", "harness", "".join(traceback.format_exception(e)[-4:]))
    result = CaseResult(case, outcome.status, outcome.kind, outcome.detail, outcome.fallbacks, door=prog.door,
                        ops=prog.notes.get("ops", {}))
    # One repro per fallback reason (the first case that meets it); every failure gets its own.
    wants_repro = outcome.status == "fail" or (
        outcome.status == "fallback" and shrink_fallbacks is not None
        and reason_key(outcome.fallbacks[0]) not in shrink_fallbacks)
    if out_dir is not None and wants_repro:
        from tests.fuzz.shrink import shrink_and_write
        try:
            path, _ = shrink_and_write(prog, outcome, seed, case, out_dir)
            result.repro = str(path)
        except Exception as e:
            result.repro = f"(shrinking failed: {type(e).__name__}: {e})"
    return result


def _run_chunk(seed: int, cases: list[int], out_dir: str | None, cache_dir: str, seen: set) -> list[CaseResult]:
    """Run `cases` in worker processes; a case whose process dies is a failure, and the rest go on."""
    results: list[CaseResult] = []
    todo = list(cases)
    while todo:
        cmd = [sys.executable, "-m", "tests.fuzz.worker", "run", str(seed), out_dir or "", cache_dir,
               json.dumps(sorted(seen)), *map(str, todo)]
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                cwd=ROOT)
        stdout, stderr = proc.communicate()
        current = None
        for line in stdout.splitlines():
            if line.startswith("START "):
                current = int(line.split()[1])
            elif line.startswith("RESULT "):
                results.append(CaseResult(**json.loads(line[7:])))
                if results[-1].status == "fallback":
                    seen.add(reason_key(results[-1].fallbacks[0]))
                current = None
        done = {r.case for r in results}
        if current is None and proc.returncode != 0:  # died outside a case: report its first case
            current = next(c for c in todo if c not in done)
        if current is not None:
            results.append(_died(seed, current, proc.returncode, stderr, out_dir, cache_dir))
            done.add(current)
        todo = [c for c in todo if c not in done]
    return results


def _died(seed: int, case: int, returncode: int, stderr: str, out_dir: str | None, cache_dir: str) -> CaseResult:
    from tests.fuzz.worker import SIGNAL_KIND
    detail = f"the process running the case exited with {returncode}\n{stderr[-1500:]}"
    prog = generate(seed, case)
    result = CaseResult(case, "fail", SIGNAL_KIND, detail, door=prog.door, ops=prog.notes.get("ops", {}))
    if out_dir:
        from tests.fuzz.shrink import shrink_and_write
        try:
            path, _ = shrink_and_write(prog, Outcome("fail", SIGNAL_KIND, detail), seed, case, Path(out_dir),
                                       cache_dir=cache_dir)
            result.repro = str(path)
        except Exception as e:
            result.repro = f"(shrinking failed: {type(e).__name__}: {e})"
    return result


def run(cases: int, seed: int, start: int = 0, out_dir: str | None = None, jobs: int = 1,
        cache_dir: str | None = None, progress=print, chunk: int = 50) -> list[CaseResult]:
    """Cases start..start+cases-1 of `seed`; failures shrunk into `out_dir` when given."""
    cache_dir = cache_dir or tempfile.mkdtemp(prefix="kiln-fuzz-cache-")
    out_dir = str(Path(out_dir).resolve()) if out_dir else None
    ids = list(range(start, start + cases))
    chunks = [ids[i:i + chunk] for i in range(0, len(ids), chunk)]
    results: list[CaseResult] = []
    seen: set = set()
    began = time.time()

    def report(chunk_results):
        results.extend(chunk_results)
        for r in chunk_results:
            if r.status == "fail":
                progress(f"case {r.case}: FAIL ({r.kind}) {r.detail.splitlines()[0] if r.detail else ''} "
                         f"-> {r.repro}")
        progress(f"[{len(results)}/{cases}] {time.time() - began:.0f} s, "
                 f"{sum(r.status == 'fail' for r in results)} failed")

    with ThreadPoolExecutor(max(jobs, 1)) as pool:
        for chunk_results in pool.map(lambda c: _run_chunk(seed, c, out_dir, cache_dir, seen), chunks):
            report(chunk_results)
    return results


def summary(results: list[CaseResult], seconds: float) -> str:
    status = Counter(r.status for r in results)
    families = Counter()
    for r in results:
        for name, n in r.ops.items():
            families[FAMILY.get(name, name)] += n
    lines = [f"cases: {len(results)} in {seconds:.0f} s ({seconds / max(len(results), 1):.2f} s per case); "
             f"passed {status['pass']}, failed {status['fail']}, fell back {status['fallback']}, "
             f"discarded {status['discard']}",
             f"doors: {dict(Counter(r.door for r in results))}",
             "ops generated: " + ", ".join(f"{k} {v}" for k, v in families.most_common())]
    fallbacks = Counter(reason_key(r.fallbacks[0]) for r in results if r.status == "fallback")
    if fallbacks:
        lines.append("fallbacks by reason:")
        repro = {reason_key(r.fallbacks[0]): r.repro for r in results if r.status == "fallback" and r.repro}
        cases = {}
        for r in results:
            if r.status == "fallback":
                cases.setdefault(reason_key(r.fallbacks[0]), []).append(r.case)
        lines += [f"  {n:5d}  {k}  (cases {', '.join(map(str, cases[k][:5]))}{', ...' if n > 5 else ''})"
                  + (f"  -> {repro[k]}" if k in repro else "") for k, n in fallbacks.most_common()]
    failed = [r for r in results if r.status == "fail"]
    if failed:
        lines.append("failures:")
        lines += [f"  case {r.case} ({r.kind}): {(r.detail.splitlines() or [''])[0][:160]}\n    repro: {r.repro}"
                  for r in failed]
    return "\n".join(lines)
