"""Autotuning: measure candidate implementations of an op for its shapes once, keep the winner on
disk, reuse it in later processes (seed 002's offline autotuning).

    choice = autotune.choose("mm", key, candidates)   # {name: zero-argument callable}

`store.py` is the persistent table, `timing.py` the measurement, `gemm.py` the GEMM and
convolution candidates kiln's passes ask about.
"""

from kiln.autotune.choose import choose  # noqa: F401

MODES = ("off", "default", "max-autotune", "record")


def mode() -> str:
    """The `backend.autotune` setting, checked."""
    from kiln import config

    value = config.backend.autotune
    if value not in MODES:
        raise ValueError(f"setting backend.autotune (KILN_AUTOTUNE) must be one of {', '.join(MODES)}; got {value!r}")
    return value
