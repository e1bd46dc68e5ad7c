"""The whole OpInfo database through kiln_aot_eager, forward and backward: `python -m tests.aot.sweep_opinfo`.

Prints per-status counts and the pass rate over ops (an op passes when all its checked samples do),
and writes every outcome as JSON. Ops whose samples Dynamo never hands to a backend are reported
apart: they say nothing about kiln.
"""

from __future__ import annotations

import argparse
import collections
import json
import sys
import time
import warnings

import torch
from torch.testing._internal.common_methods_invocations import op_db

from tests.aot.opinfo import check_sample, op_id, op_status


def sweep(samples_per_op: int, only: set[str] | None) -> list[dict]:
    rows = []
    for op in op_db:
        if only and op.name not in only:
            continue
        if torch.float32 not in op.supported_dtypes("cpu"):
            continue
        for backward in (False, True):
            if backward and not op.supports_autograd:
                continue
            try:
                samples = list(op.sample_inputs("cpu", torch.float32, requires_grad=backward))[:samples_per_op]
            except Exception as e:  # noqa: BLE001
                rows.append(dict(op=op.name, variant=op.variant_test_name, backward=backward, status="no-samples", detail=str(e)[:200]))
                continue
            status, detail = op_status([check_sample(op, s, backward) for s in samples])
            rows.append(dict(op=op.name, variant=op.variant_test_name, backward=backward, status=status, detail=detail[:300]))
            print(f"{op_id(op)} {'bwd' if backward else 'fwd'}: {status} {detail[:120]}", file=sys.stderr, flush=True)
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--samples", type=int, default=3, help="samples per op and direction")
    parser.add_argument("--ops", help="comma-separated op names (default: all)")
    parser.add_argument("--json", help="write every outcome here")
    args = parser.parse_args()
    warnings.filterwarnings("ignore")
    start = time.time()
    rows = sweep(args.samples, set(args.ops.split(",")) if args.ops else None)
    for direction in (False, True):
        part = [r for r in rows if r["backward"] == direction]
        counts = collections.Counter(r["status"] for r in part)
        judged = counts["pass"] + counts["fail"] + counts["fallback"]
        rate = counts["pass"] / judged if judged else 0.0
        print(f"{'backward' if direction else 'forward'}: {dict(counts)}; pass rate {counts['pass']}/{judged} = {rate:.1%}")
    print(f"{time.time() - start:.0f} s")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
