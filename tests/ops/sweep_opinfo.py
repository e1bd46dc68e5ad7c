"""The OpInfo float32 CPU sweep through `torch.compile(backend="kiln")` beside Inductor, in one run.

    python -m tests.ops.sweep_opinfo [--ops add,sum] [--backward] [--json PATH] [--markdown PATH]

For each op (each OpInfo entry: name and variant) its first samples run through kiln, then through
Inductor, against eager (see tests/aot/opinfo.py for what passing means: a graph compiled, no
fallback to eager, values and, with --backward, gradients match). It prints both pass rates over
the same ops, a table per family (tests/ops/families.py) with the share of ops kiln ran as its own
generated code rather than as ATen externs, and kiln's failures grouped by cause.

Each sample has a time limit (SIGALRM; --timeout). Rows are written to --json after every op, and
--resume skips the ops already there, so a crash costs one op. `--report PATH` prints (and with
--markdown writes) the summary of a saved run without running anything.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time
import warnings
from contextlib import contextmanager

os.environ.setdefault("TORCHINDUCTOR_COMPILE_THREADS", "1")  # no compile-worker pool on a 2-core machine

import torch  # noqa: E402
import torch._dynamo  # noqa: E402
from torch.testing._internal.common_methods_invocations import op_db  # noqa: E402

from tests.aot.opinfo import Outcome, check_sample, op_id, op_status  # noqa: E402
from tests.ops.families import family, fallback_externs  # noqa: E402
from tests.ops.report import markdown, summary_text  # noqa: E402

BACKENDS = ("kiln", "inductor")


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


def run_sample(op, sample, backward: bool, backend: str, timeout: int) -> Outcome:
    try:
        with time_limit(timeout):
            return check_sample(op, sample, backward, backend=backend)
    except SampleTimeout as e:
        return Outcome("fail", f"raised SampleTimeout: {e}")
    except Exception as e:  # noqa: BLE001 - the sweep goes on whatever one sample does
        return Outcome("fail", f"raised {type(e).__name__} in the checker: {str(e).splitlines()[0] if str(e) else ''}")
    finally:
        torch._dynamo.reset()


def selected_ops(only: set[str] | None) -> list:
    ops = [op for op in op_db if torch.float32 in op.supported_dtypes("cpu")]
    return [op for op in ops if not only or op.name in only or op_id(op) in only]


def sweep_op(op, backward: bool, samples_per_op: int, backends: tuple[str, ...], timeout: int) -> dict:
    row = dict(op=op_id(op), family=family(op), backward=backward)
    try:
        samples = list(op.sample_inputs("cpu", torch.float32, requires_grad=backward))[:samples_per_op]
    except Exception as e:  # noqa: BLE001
        return row | {b: "no-samples" for b in backends} | {f"{b}_detail": str(e)[:200] for b in backends}
    outcomes: dict[str, list[Outcome]] = {b: [] for b in backends}
    for sample in samples:  # interleaved: each sample through every backend before the next
        for b in backends:
            outcomes[b].append(run_sample(op, sample, backward, b, timeout))
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


def sweep(ops: list, backward: bool, samples_per_op: int, backends: tuple[str, ...], timeout: int,
          done: list[dict], save) -> list[dict]:
    rows = list(done)
    seen = {r["op"] for r in done}
    for op in ops:
        if op_id(op) in seen or (backward and not op.supports_autograd):
            continue
        start = time.time()
        row = sweep_op(op, backward, samples_per_op, backends, timeout)
        rows.append(row)
        save(rows)
        extra = " ".join(f"{b}={row[b]}" for b in backends)
        why = row.get("kiln_detail") or ", ".join(row.get("kiln_fallback_externs", []))
        print(f"{row['op']} [{row['family']}] {extra} ({time.time() - start:.1f} s) {why[:120]}", file=sys.stderr, flush=True)
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ops", help="comma-separated op names or name.variant (default: every float32 op)")
    parser.add_argument("--backward", action="store_true", help="check gradients too (ops that support autograd)")
    parser.add_argument("--samples", type=int, default=3, help="samples per op (default 3)")
    parser.add_argument("--backends", default=",".join(BACKENDS), help="comma-separated (default kiln,inductor)")
    parser.add_argument("--timeout", type=int, default=180, help="seconds per sample and backend (default 180)")
    parser.add_argument("--json", help="write every row here, after each op")
    parser.add_argument("--resume", action="store_true", help="keep the rows already in --json and skip their ops")
    parser.add_argument("--markdown", help="write the summary here as Markdown")
    parser.add_argument("--report", help="summarize this saved --json file instead of running")
    parser.add_argument("--note", help="what was measured (e.g. the commit), kept in the results")
    args = parser.parse_args()
    warnings.filterwarnings("ignore")

    meta = dict(torch=torch.__version__, threads=torch.get_num_threads(), samples_per_op=args.samples,
                direction="backward" if args.backward else "forward", dtype="float32", device="cpu", note=args.note or "")
    if args.report:
        with open(args.report) as f:
            saved = json.load(f)
        rows, meta, seconds = saved["rows"], saved["meta"], saved.get("seconds")
        if args.note:
            meta["note"] = args.note
    else:
        backends = tuple(args.backends.split(","))
        done = []
        if args.resume and args.json and os.path.exists(args.json):
            with open(args.json) as f:
                done = json.load(f)["rows"]
        start = time.time()

        def save(rows: list[dict]) -> None:
            if args.json:
                with open(args.json + ".tmp", "w") as f:
                    json.dump(dict(meta=meta, seconds=round(time.time() - start), rows=rows), f, indent=1)
                os.replace(args.json + ".tmp", args.json)

        only = set(args.ops.split(",")) if args.ops else None
        rows = sweep(selected_ops(only), args.backward, args.samples, backends, args.timeout, done, save)
        seconds = round(time.time() - start)
        save(rows)
    print(summary_text(rows, meta, seconds))
    if args.markdown:
        with open(args.markdown, "w") as f:
            f.write(markdown(rows, meta, seconds))
    return 0


if __name__ == "__main__":
    sys.exit(main())
