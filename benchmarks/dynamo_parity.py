"""kiln's capture measured on Dynamo's own tests: each test file run under Dynamo and again with
Dynamo's entry points given to kiln (benchmarks/dynamo_parity_worker.py), the outcomes compared.

    kiln dynamo-parity DIR [--files GLOB] [--jobs N] [--json OUT] [--markdown OUT]

DIR holds test files of PyTorch's test/dynamo (not part of this repository: bring them to the
machine). Every file runs in three fresh processes, one per mode: under Dynamo, under kiln, and
"eager" (the compiled functions are the functions themselves: the reference for what Python
gives). A test that passes under Dynamo and fails under kiln is classified by where it failed:

- wrong result: an assertion on the values a compiled function returned (standard_test's
  `same(...)` checks, a test's own comparisons): a bug in kiln, always;
- extra break: an assertion on the number of frames or graphs compiled (kiln split a function
  that Dynamo captured whole, or recompiled it), or kiln refusing a construct under fullgraph;
- Dynamo-internal: an assertion on Dynamo's own details (op counts of its graph, its counters,
  guards, config) or an exception raised inside torch._dynamo: reported apart, not counted
  against kiln;
- error: any other exception (a crash in kiln, or in what kiln ran);
- fails eagerly: a wrong result or error where the test fails eagerly too, at the same line (it
  asserts what Dynamo gives and Python does not: `gen.close()`'s value before 3.13, a warning or
  cache entry of Dynamo's): reported apart, not counted;
- not redirected: the test reached Dynamo by a path the harness does not give to kiln (export,
  `optimize` as a context manager, `torch._dynamo.run`): reported apart, not counted.

kiln's pass rate is its passes over Dynamo's passes less the fewer-graphs, Dynamo-internal,
fails-eagerly and not-redirected ones.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import re
import subprocess
import sys
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

KINDS = ("wrong_result", "extra_break", "held_memory", "error", "timeout", "fewer_graphs", "dynamo_internal",
         "fails_eagerly", "not_redirected")
# Kinds reported apart and not counted against kiln.
NOT_COUNTED = ("fewer_graphs", "dynamo_internal", "fails_eagerly", "not_redirected")

# Source text of a failed assertion that names Dynamo's own details (its graphs' op counts, its
# counters, guards, config, logs): such a test checks Dynamo, not the program's meaning.
# (`_nodes)`: a count of the recorded graph's nodes of some kind, `len(sym_max_nodes)`: its structure)
_DYNAMO_DETAILS = ("op_count", "counters", "_dynamo", "guard", "config", "normalize_gm", "graph.code",
                   "print_readable", "assertExpectedInline", "assertLogs", "_log", "code_parts", "recompil",
                   "compile_id", "cache_entr", "_inductor.", "_nodes)")
# ...that counts frames or graphs compiled.
_COUNTS = ("frame_count", "graph_count", "compile_count", "cnt.", "counter.", "num_graphs", "len(graphs)",
           "len(backend.graphs)", ".graphs)", "compiles")


def _count_kind(message: str, kiln_breaks: int | None = None) -> str:
    """A failed count of frames or graphs: fewer than Dynamo's but some (kiln captured across a
    break Dynamo makes, e.g. through a C function Dynamo will not trace) is Dynamo's choice of
    where to break; some where Dynamo's is none (the test asserts that Dynamo gives up on the frame,
    e.g. at a break inside a generator, and kiln captured it) checks Dynamo's own limit; none
    where Dynamo has some is kiln's break, unless kiln broke nowhere and ran nothing eagerly
    (`kiln_breaks`: the function had no op for a graph, which Dynamo compiles anyway); more is
    kiln's break."""
    # (assertEqual's "Expected 2 but got 3", assertExpectedInline's "'2' != '3'", assertIn's "3 not found in (5, 7)")
    found = re.search(r"Expected (\d+) but got (\d+)", message) or re.match(r"'(\d+)' != '(\d+)'", message)
    among = re.match(r"(\d+) not found in \(([\d, ]+)\)", message)
    if among:
        got, expected = int(among.group(1)), [int(n) for n in among.group(2).replace(" ", "").split(",") if n]
        return "fewer_graphs" if 0 < got < min(expected) else "extra_break"
    if found and 0 < int(found.group(2)) < int(found.group(1)):
        return "fewer_graphs"
    if found and int(found.group(2)) < int(found.group(1)) and kiln_breaks == 0:
        return "fewer_graphs"  # (none, where kiln broke nowhere and ran nothing eagerly: no op to compile)
    if found and int(found.group(1)) == 0 < int(found.group(2)):
        return "dynamo_internal"
    return "extra_break"


def classify(kiln_outcome: dict[str, Any]) -> str:
    """"passed" or one of KINDS for a test that passed under Dynamo."""
    outcome = kiln_outcome.get("outcome")
    if kiln_outcome.get("dynamo_ran") or outcome == "not_redirected":
        return "not_redirected"
    if outcome == "passed":
        return "passed"
    if outcome == "timeout":
        return "timeout"
    if outcome != "failed":
        return "error"
    if kiln_outcome.get("expects_dynamo_refusal"):
        return "dynamo_internal"  # (the test asserts that Dynamo refuses a construct; kiln did not)
    kind, line = kiln_outcome.get("type", ""), kiln_outcome.get("testing_line") or kiln_outcome.get("test_line") or ""
    if kiln_outcome.get("uses_guard_fail_fn") and "fail" in (kiln_outcome.get("test_line") or ""):
        return "dynamo_internal"  # (what Dynamo's guard_fail_fn callback was given: its guards' text)
    if kind.startswith("kiln.") and any(n in kind for n in ("Unsupported", "CaptureError", "FullGraph")):
        return "extra_break"
    if kind == "builtins.AssertionError" or kind.endswith("AssertionError"):
        if "_ref()" in line or "weakref" in line:
            return "held_memory"
        if any(s in line for s in _COUNTS) and "op_count" not in line:
            return _count_kind(kiln_outcome.get("message", ""), kiln_outcome.get("kiln_breaks"))
        if any(s in line for s in _DYNAMO_DETAILS):
            return "dynamo_internal"
        if kiln_outcome.get("reads_dynamo_counters") and re.search(r"assert(True|False)\(\s*\w+\s*[,)]", line):
            return "dynamo_internal"  # (a flag computed from Dynamo's counters or messages)
        if kiln_outcome.get("reads_dynamo_logs") and "records" in line:
            return "dynamo_internal"  # (make_logging_test's `records`: Dynamo's own log lines)
        return "wrong_result"
    if kind.startswith("torch._dynamo.") or (kiln_outcome.get("innermost") or "").startswith(("eval_frame", "convert_frame")):
        return "dynamo_internal"
    return "error"


@dataclass
class FileRow:
    file: str
    run: int = 0
    dynamo_passed: int = 0
    kiln_passed: int = 0
    kinds: dict[str, int] = field(default_factory=lambda: {k: 0 for k in KINDS})
    import_error: str | None = None
    failures: dict[str, dict[str, Any]] = field(default_factory=dict)  # test -> kiln's outcome, kind

    @property
    def counted(self) -> int:
        """Dynamo's passes that count: less those checking Dynamo's internals and not redirected."""
        return self.dynamo_passed - sum(self.kinds[k] for k in NOT_COUNTED)

    @property
    def rate(self) -> float | None:
        return self.kiln_passed / self.counted if self.counted else None


def _fails_eagerly(kind: str, kiln_outcome: dict[str, Any], eager_outcome: dict[str, Any] | None) -> bool:
    """A wrong result or error under kiln where the test, its compiled functions being the functions
    themselves, fails too, at the same line of the test: it asserts what Dynamo gives and eager
    does not (`gen.close()`'s value before Python 3.13, a warning of Dynamo's own)."""
    if kind not in ("wrong_result", "error") or not eager_outcome or eager_outcome.get("outcome") != "failed":
        return False
    line = kiln_outcome.get("test_line")
    # (a count of frames or graphs, or a graph of a backend's list, fails eagerly always: nothing compiles)
    return line is not None and eager_outcome.get("test_line") == line and not any(s in line for s in (*_COUNTS, "graphs["))


def compare(dynamo: dict[str, Any], kiln: dict[str, Any], eager: dict[str, Any] | None = None) -> FileRow:
    """One file's row from its reports (the eager one, where there is one, tells which of kiln's
    failures assert what eager does not give)."""
    row = FileRow(dynamo["file"])
    if "import_error" in dynamo or "import_error" in kiln:
        row.import_error = dynamo.get("import_error") or kiln.get("import_error")
        return row
    row.run = len(dynamo["tests"])
    for test, outcome in dynamo["tests"].items():
        if outcome["outcome"] != "passed":
            continue
        row.dynamo_passed += 1
        kind = classify(kiln["tests"].get(test, {"outcome": "failed", "type": "missing"}))
        eager_outcome = eager.get("tests", {}).get(test) if eager is not None else None
        if _fails_eagerly(kind, kiln["tests"].get(test, {}), eager_outcome):
            kind = "fails_eagerly"
        if kind == "passed":
            row.kiln_passed += 1
        else:
            row.kinds[kind] += 1
            row.failures[test] = {"kind": kind, **kiln["tests"].get(test, {}), "eager": eager_outcome}
    return row


def _run_worker(test_file: Path, mode: str, out: Path, timeout_s: int, python: str) -> dict[str, Any]:
    command = [python, "-m", "benchmarks.dynamo_parity_worker", str(test_file), mode, str(out), "--timeout", str(timeout_s)]
    repo = Path(__file__).resolve().parent.parent
    try:
        done = subprocess.run(command, cwd=repo, capture_output=True, text=True, timeout=timeout_s * 40)
    except subprocess.TimeoutExpired:
        return {"file": test_file.name, "mode": mode, "import_error": "the file ran past the harness's limit", "tests": {}}
    if done.returncode != 0 or not out.exists():
        tail = (done.stderr or done.stdout).strip().splitlines()[-3:]
        return {"file": test_file.name, "mode": mode, "import_error": f"worker exited {done.returncode}: {' | '.join(tail)}",
                "tests": {}}
    return json.loads(out.read_text())


def run(files: list[Path], jobs: int, timeout_s: int, python: str = sys.executable) -> list[FileRow]:
    """Every file under both modes (`jobs` processes at a time), compared."""
    with tempfile.TemporaryDirectory(prefix="kiln-dynamo-parity-") as tmp:
        work = [(f, mode, Path(tmp) / f"{f.stem}.{mode}.json") for f in files for mode in ("dynamo", "kiln", "eager")]
        with concurrent.futures.ThreadPoolExecutor(max(1, jobs)) as pool:
            reports = list(pool.map(lambda w: _run_worker(*w, timeout_s, python), work))
    by_file: dict[str, dict[str, Any]] = {}
    for (f, mode, _), report in zip(work, reports):
        by_file.setdefault(f.name, {})[mode] = report
    return [compare(r["dynamo"], r["kiln"], r["eager"]) for r in by_file.values()]


_HEADER = ["file", "tests run", "passed under Dynamo", "passed under kiln", "kiln's rate", "wrong results",
           "extra breaks", "held memory", "errors", "timeouts", "fewer graphs", "Dynamo-internal", "fails eagerly",
           "not redirected"]


def _cells(row: FileRow) -> list[str]:
    rate = f"{row.rate:.1%}" if row.rate is not None else "-"
    return [row.file, str(row.run), str(row.dynamo_passed), str(row.kiln_passed), rate, *(str(row.kinds[k]) for k in KINDS)]


def markdown(rows: list[FileRow]) -> str:
    lines = ["| " + " | ".join(_HEADER) + " |", "|" + "---|" * len(_HEADER)]
    total = FileRow("all")
    for row in rows:
        if row.import_error:
            lines.append(f"| {row.file} | did not import: {row.import_error} |" + " |" * (len(_HEADER) - 2))
            continue
        lines.append("| " + " | ".join(_cells(row)) + " |")
        total.run += row.run
        total.dynamo_passed += row.dynamo_passed
        total.kiln_passed += row.kiln_passed
        for k in KINDS:
            total.kinds[k] += row.kinds[k]
    lines.append("| " + " | ".join(f"**{c}**" for c in _cells(total)) + " |")
    return "\n".join(lines)


def failures_text(rows: list[FileRow]) -> str:
    """Each counted failure: file, test, kind, exception and the line that failed."""
    out = []
    for row in rows:
        for test, f in sorted(row.failures.items()):
            if f["kind"] in NOT_COUNTED:
                continue
            where = f.get("testing_line") or f.get("test_line") or f.get("innermost") or ""
            out.append(f"{row.file} {test}: {f['kind']}: {f.get('type', '')}: {f.get('message', '')[:160]!r} at {where!r}")
    return "\n".join(out)


def main(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    directory = Path(args.directory)
    if not directory.is_dir():
        parser.error(f"DIR: {directory} is not a folder (it holds test files of PyTorch's test/dynamo)")
    files = sorted(p for p in directory.glob(args.files) if p.is_file() and p.suffix == ".py")
    if not files:
        parser.error(f"--files: no test file matches {args.files!r} in {directory}")
    rows = run(files, args.jobs, args.timeout)
    table = markdown(rows)
    print(table)
    print()
    print(failures_text(rows))
    if args.markdown:
        Path(args.markdown).write_text(table + "\n")
    if args.json:
        Path(args.json).write_text(json.dumps([{**asdict(r), "rate": r.rate} for r in rows], indent=1))
    return 0


def add_command(commands: Any) -> None:
    parser = commands.add_parser("dynamo-parity", help="kiln's capture on Dynamo's own tests, against Dynamo")
    parser.add_argument("directory", metavar="DIR", help="a folder of test files from PyTorch's test/dynamo")
    parser.add_argument("--files", default="test_*.py", help="which files of DIR (a glob; default test_*.py)")
    parser.add_argument("--jobs", type=int, default=2, help="test processes at a time (default 2)")
    parser.add_argument("--timeout", type=int, default=120, help="seconds one test may run (default 120)")
    parser.add_argument("--json", default=None, help="write each file's row and failures here")
    parser.add_argument("--markdown", default=None, help="write the table here")
    parser.set_defaults(handler=main)
