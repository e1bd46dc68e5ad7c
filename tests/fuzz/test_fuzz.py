"""The fuzzer's fixed-seed set in `make test`: cases 0..CASES-1 of SEED, in chunks that
pytest-xdist spreads over its workers. A failing case prints its repro file's path and text.

A fallback to eager passes only for a reason listed in docs/limits.md (ALLOWED_FALLBACKS); any
other fallback is a kiln bug the fuzzer found, and fails like a wrong answer.
"""

import logging
from pathlib import Path

import pytest

from tests.fuzz.run import run_case
from tests.kiln_backend import private_cache  # noqa: F401  (each test gets an empty compile cache)

SEED = 0
CASES = 200
CHUNK = 20
# Fallback reasons that docs/limits.md states (a size that depends on data, read by a later op).
ALLOWED_FALLBACKS = ("capture data_dependent",)
# Cases that meet a bug listed in docs/limits.md, with its repro in tests/fuzz/known/: none today.
KNOWN: dict[int, str] = {}


def _report(r) -> str:
    text = Path(r.repro).read_text() if r.repro and Path(r.repro).exists() else "(no repro written)"
    return f"case {r.case} of seed {SEED}: {r.status} ({r.kind or r.fallbacks}):\n{r.detail}\n{r.repro}:\n{text}"


@pytest.mark.parametrize("first", range(0, CASES, CHUNK))
def test_fuzz_cases(first, tmp_path, caplog):
    caplog.set_level(logging.WARNING)  # Dynamo's debug records would bury the repro in the report
    bad = []
    for case in range(first, first + CHUNK):
        if case in KNOWN:
            continue
        r = run_case(SEED, case, tmp_path / "repros", shrink_fallbacks=set())
        allowed = r.status == "fallback" and all(f.startswith(ALLOWED_FALLBACKS) for f in r.fallbacks)
        if r.status == "fail" or r.status == "fallback" and not allowed:
            bad.append(_report(r))
    assert not bad, "\n\n".join(bad)


def test_cases_reproduce_from_their_number():
    from tests.fuzz.generate import generate
    a, b = generate(SEED, 7), generate(SEED, 7)
    assert a.source() == b.source() and a.inputs == b.inputs
    assert generate(SEED, 8).source() != a.source()
