"""A graph fuzzer for kiln: random well-typed torch programs compiled by kiln and compared with eager.

`python -m tests.fuzz --cases N --seed S` generates cases (generate.py), checks each against eager
with float64 as the arbiter (check.py), shrinks every failure and writes a standalone repro file
(shrink.py). tests/fuzz/test_fuzz.py runs a fixed-seed set in `make test`. docs/debugging.md#fuzzing.
"""
