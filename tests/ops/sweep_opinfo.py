"""The OpInfo float32 CPU sweep through kiln's two doors beside Inductor, in one run.

    python -m tests.ops.sweep_opinfo [--ops add,sum] [--backward] [--tolerance float32] [--json PATH] [--markdown PATH]

For each op (each OpInfo entry: name and variant) its first samples run through each of --backends
against eager: "kiln" is `torch.compile(backend="kiln")` (Dynamo's capture, kiln's backend),
"kiln.compile" is `kiln.compile(fn)` (kiln's own capture and backend), "inductor" is
`torch.compile(backend="inductor")` (see tests/aot/opinfo.py for what passing means: a graph
compiled, no fallback to eager, values and, with --backward, gradients match within --tolerance:
"float32", torch.testing's defaults, rtol 1.3e-6 and atol 1e-5, or "1e-4", atol = rtol = 1e-4). It prints both pass rates over
the same ops, a table per family (tests/ops/families.py) with the share of ops kiln ran as its own
generated code rather than as ATen externs, and kiln's failures grouped by cause.

Each sample has a time limit (SIGALRM; --timeout). Rows are written to --json after every op, and
--resume skips the ops already there, so a crash costs one op. `--report PATH` prints (and with
--markdown writes) the summary of a saved run without running anything.
`--dynamic` compiles with every input size symbolic (`dynamic=True` at both doors: torch.compile and kiln.compile).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import signal
import subprocess
import sys
import time
import warnings
from contextlib import contextmanager

os.environ.setdefault("TORCHINDUCTOR_COMPILE_THREADS", "1")  # no compile-worker pool on a 2-core machine

import torch  # noqa: E402
import torch._dynamo  # noqa: E402

import kiln  # noqa: E402
from torch.testing._internal.common_methods_invocations import op_db  # noqa: E402

from tests.aot.opinfo import TOLERANCES, Outcome, check_sample, op_id, op_status  # noqa: E402
from tests.ops.families import family, fallback_externs  # noqa: E402
from tests.ops.report import markdown, summary_text  # noqa: E402

# Each name in the results: (backend, door).
BACKENDS = {"kiln": ("kiln", "torch.compile"), "kiln.compile": ("kiln", "kiln.compile"),
            "inductor": ("inductor", "torch.compile")}


class SampleTimeout(BaseException):
    """Raised by the alarm; a BaseException so that no `except Exception` on the way swallows it."""


@contextmanager
def time_limit(seconds: int):
    def expire(signum, frame):
        raise SampleTimeout(f"timed out after {seconds} s")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


def run_sample(op, sample, backward: bool, name: str, timeout: int, tolerance: str,
               dynamic: bool | None = None) -> Outcome:
    backend, door = BACKENDS[name]
    try:
        with time_limit(timeout):
            return check_sample(op, sample, backward, backend=backend, door=door, tolerance=tolerance, dynamic=dynamic)
    except SampleTimeout as e:
        return Outcome("fail", f"raised SampleTimeout: {e}")
    except Exception as e:  # noqa: BLE001 - the sweep goes on whatever one sample does
        return Outcome("fail", f"raised {type(e).__name__} in the checker: {str(e).splitlines()[0] if str(e) else ''}")
    finally:
        torch._dynamo.reset()


def selected_ops(only: set[str] | None) -> list:
    ops = [op for op in op_db if torch.float32 in op.supported_dtypes("cpu")]
    return [op for op in ops if not only or op.name in only or op_id(op) in only]


def sweep_op(op, backward: bool, samples_per_op: int, backends: tuple[str, ...], timeout: int, tolerance: str,
             dynamic: bool | None = None) -> dict:
    row = dict(op=op_id(op), family=family(op), backward=backward)
    try:
        samples = list(op.sample_inputs("cpu", torch.float32, requires_grad=backward))[:samples_per_op]
    except Exception as e:  # noqa: BLE001
        return row | {b: "no-samples" for b in backends} | {f"{b}_detail": str(e)[:200] for b in backends}
    outcomes: dict[str, list[Outcome]] = {b: [] for b in backends}
    for sample in samples:  # interleaved: each sample through every backend before the next
        for b in backends:
            outcomes[b].append(run_sample(op, sample, backward, b, timeout, tolerance, dynamic))
    for b in backends:
        status, detail = op_status(outcomes[b])
        row[b], row[f"{b}_detail"] = status, detail[:300]
    if "kiln" in backends:
        externs = [e for o in outcomes["kiln"] for e in o.externs]
        row["kiln_externs"] = sorted(set(externs))
        row["kiln_fallback_externs"] = fallback_externs(externs)
        row["kiln_kernels"] = sum(o.kernels for o in outcomes["kiln"])
        row["kiln_generated"] = row["kiln"] == "pass" and not row["kiln_fallback_externs"]
    return row


def sweep(ops: list, backward: bool, samples_per_op: int, backends: tuple[str, ...], timeout: int, tolerance: str,
          done: list[dict], save, dynamic: bool | None = None) -> list[dict]:
    rows = list(done)
    seen = {r["op"] for r in done}
    for op in ops:
        if op_id(op) in seen or (backward and not op.supports_autograd):
            continue
        start = time.time()
        row = sweep_op(op, backward, samples_per_op, backends, timeout, tolerance, dynamic)
        rows.append(row)
        save(rows)
        extra = " ".join(f"{b}={row[b]}" for b in backends)
        why = row.get("kiln_detail") or ", ".join(row.get("kiln_fallback_externs", []))
        print(f"{row['op']} [{row['family']}] {extra} ({time.time() - start:.1f} s) {why[:120]}", file=sys.stderr, flush=True)
    return rows


def _commit() -> str:
    try:
        out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=True)
        return out.stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def _cpu() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            return next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        return platform.processor() or "unknown"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ops", help="comma-separated op names or name.variant (default: every float32 op)")
    parser.add_argument("--backward", action="store_true", help="check gradients too (ops that support autograd)")
    parser.add_argument("--samples", type=int, default=3, help="samples per op (default 3)")
    parser.add_argument("--backends", default=",".join(BACKENDS),
                        help=f"comma-separated, of {', '.join(BACKENDS)} (default all)")
    parser.add_argument("--tolerance", choices=tuple(TOLERANCES), default="float32",
                        help="float32: torch.testing's defaults (rtol 1.3e-6, atol 1e-5); 1e-4: atol = rtol = 1e-4")
    parser.add_argument("--codegen", choices=("cpp", "triton"), default="cpp",
                        help="kiln's code generator (triton: run by Triton's interpreter on CPU; default cpp)")
    parser.add_argument("--dynamic", action="store_true",
                        help="compile with dynamic=True (every input size symbolic) at both doors")
    parser.add_argument("--timeout", type=int, default=180, help="seconds per sample and backend (default 180)")
    parser.add_argument("--json", help="write every row here, after each op")
    parser.add_argument("--resume", action="store_true", help="keep the rows already in --json and skip their ops")
    parser.add_argument("--redo", help="with --resume: comma-separated ops (a name covers its variants: masked covers "
                                       "masked.sum) whose saved rows are dropped and run again (after a fix)")
    parser.add_argument("--markdown", help="write the summary here as Markdown")
    parser.add_argument("--report", help="summarize this saved --json file instead of running")
    parser.add_argument("--note", help="what was measured (e.g. the commit), kept in the results")
    args = parser.parse_args()
    warnings.filterwarnings("ignore")
    kiln.config.backend.codegen = args.codegen

    meta = dict(torch=torch.__version__, threads=torch.get_num_threads(), samples_per_op=args.samples,
                direction="backward" if args.backward else "forward", dtype="float32", device="cpu", note=args.note or "",
                tolerance=args.tolerance, codegen=args.codegen, commit=_commit(), cpu=_cpu(), started=time.strftime("%Y-%m-%d %H:%M %Z"))
    if args.dynamic:  # a static run's results keep their exact form
        meta |= dict(dynamic=True, note="; ".join(filter(None, ["dynamic=True (--dynamic)", meta["note"]])))
    if args.report:
        with open(args.report) as f:
            saved = json.load(f)
        rows, meta, seconds = saved["rows"], saved["meta"], saved.get("seconds")
        if args.note:
            meta["note"] = args.note
    else:
        backends = tuple(args.backends.split(","))
        unknown = [b for b in backends if b not in BACKENDS]
        if unknown:
            parser.error(f"unknown backend {unknown[0]!r}; known: {', '.join(BACKENDS)}")
        done, prior = [], 0
        if args.resume and args.json and os.path.exists(args.json):
            with open(args.json) as f:
                saved = json.load(f)
            redo = set(args.redo.split(",")) if args.redo else set()
            done = [r for r in saved["rows"] if not any(r["op"] == n or r["op"].startswith(n + ".") for n in redo)]
            prior = saved.get("seconds") or 0
            # A resumed run keeps its first start and commit; the commits it resumed at are listed.
            meta = saved["meta"] | dict(resumed_at=saved["meta"].get("resumed_at", []) + [meta["commit"]])
        start = time.time()

        def save(rows: list[dict]) -> None:
            if args.json:
                with open(args.json + ".tmp", "w") as f:
                    json.dump(dict(meta=meta, seconds=prior + round(time.time() - start), rows=rows), f, indent=1)
                os.replace(args.json + ".tmp", args.json)

        only = set(args.ops.split(",")) if args.ops else None
        rows = sweep(selected_ops(only), args.backward, args.samples, backends, args.timeout, args.tolerance, done, save,
                     True if args.dynamic else None)
        seconds = prior + round(time.time() - start)
        save(rows)
    print(summary_text(rows, meta, seconds))
    if args.markdown:
        with open(args.markdown, "w") as f:
            f.write(markdown(rows, meta, seconds))
    return 0


if __name__ == "__main__":
    sys.exit(main())
