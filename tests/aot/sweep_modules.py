"""The whole `module_db` through kiln_aot_eager, eval and train: `python -m tests.aot.sweep_modules`."""

from __future__ import annotations

import collections
import sys
import warnings

import torch
from torch.testing._internal.common_modules import module_db

from tests.aot.modules import check_module


def main(inputs_per_module: int = 2) -> int:
    warnings.filterwarnings("ignore")
    counts: dict[bool, collections.Counter] = {False: collections.Counter(), True: collections.Counter()}
    for info in module_db:
        for training in (False, True):
            try:
                inputs = info.module_inputs_func(info, device="cpu", dtype=torch.float32, requires_grad=training,
                                                 training=training)[:inputs_per_module]
            except Exception as e:  # noqa: BLE001
                print(f"{info.module_cls.__name__}: no inputs ({e})", file=sys.stderr)
                continue
            outcomes = [check_module(info, i, training) for i in inputs]
            ran = [o for o in outcomes if o.status != "eager-error"]
            statuses = {o.status for o in ran}
            status = ("eager-error" if not ran else "pass" if statuses <= {"pass", "not-exercised"} and "pass" in statuses
                      else "not-exercised" if statuses == {"not-exercised"} else "fail")
            counts[training][status] += 1
            detail = next((o.detail for o in ran if o.status not in ("pass", "not-exercised")), "")
            print(f"{info.module_cls.__name__} {'train' if training else 'eval'}: {status} {detail[:150]}", file=sys.stderr, flush=True)
    for training, c in counts.items():
        judged = c["pass"] + c["fail"]
        print(f"{'train (forward+backward)' if training else 'eval (forward)'}: {dict(c)}; pass rate {c['pass']}/{judged}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
