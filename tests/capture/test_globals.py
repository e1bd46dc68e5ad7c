"""Module globals: read, written with `global`, mutated in place, changed or deleted between calls."""

import math

import pytest
import torch

import kiln
from tests.capture.util import assert_same, check

SCALE = 2.0
TABLE = {"shift": 1.0, "gain": 3.0}
HISTORY = []
BIAS = torch.arange(3.0)
ACTIVATION = torch.relu
COUNTER = 0


def _scaled(x):
    return x * SCALE


def test_reads_constants_tensors_functions_and_modules():
    def f(x):
        return ACTIVATION(x * SCALE + BIAS) + TABLE["shift"] * math.pi, len(TABLE)

    check(f, torch.randn(3))


def test_changed_global_constant_recompiles_unchanged_does_not():
    global SCALE
    compiled = kiln.compile(_scaled, backend="eager", fullgraph=True)
    x = torch.randn(3)
    assert_same(compiled(x), x * 2.0)
    assert_same(compiled(x), x * 2.0)
    assert len(compiled.kiln_cache.entries) == 1
    SCALE = 5.0
    try:
        assert_same(compiled(x), x * 5.0)
        assert len(compiled.kiln_cache.entries) == 2
    finally:
        SCALE = 2.0
    assert_same(compiled(x), x * 2.0)  # the first entry holds again
    assert len(compiled.kiln_cache.entries) == 2


def test_replaced_global_tensor_and_function_are_followed():
    global BIAS, ACTIVATION

    def f(x):
        return ACTIVATION(x + BIAS)

    compiled = kiln.compile(f, backend="eager", fullgraph=True)
    x = torch.randn(3)
    assert_same(compiled(x), torch.relu(x + torch.arange(3.0)))
    old_bias, old_act = BIAS, ACTIVATION
    try:
        BIAS = torch.ones(3, dtype=torch.float64)
        assert_same(compiled(x), torch.relu(x + BIAS))
        ACTIVATION = torch.sigmoid
        assert_same(compiled(x), torch.sigmoid(x + BIAS))
        assert len(compiled.kiln_cache.entries) == 3
    finally:
        BIAS, ACTIVATION = old_bias, old_act


def test_global_dict_item_changed_in_place_recompiles():
    def f(x):
        return x * TABLE["gain"]

    compiled = kiln.compile(f, backend="eager", fullgraph=True)
    x = torch.randn(3)
    assert_same(compiled(x), x * 3.0)
    TABLE["gain"] = 4.0
    try:
        assert_same(compiled(x), x * 4.0)
    finally:
        TABLE["gain"] = 3.0


def test_global_statement_and_in_place_mutation_are_replayed():
    def f(x):
        global COUNTER
        COUNTER += 1
        HISTORY.append(COUNTER)
        return x + COUNTER

    compiled = kiln.compile(f, backend="eager", fullgraph=True)
    x = torch.zeros(2)
    before = COUNTER
    assert_same(compiled(x), x + before + 1)
    assert_same(compiled(x), x + before + 2)
    assert COUNTER == before + 2 and HISTORY[-2:] == [before + 1, before + 2]
    del HISTORY[:]


def test_global_defined_after_compile_shadows_a_builtin():
    def f(x):
        return x * abs(-2)

    compiled = kiln.compile(f, backend="eager", fullgraph=True)
    x = torch.randn(3)
    assert_same(compiled(x), x * 2)
    globals()["abs"] = lambda v: 10
    try:
        assert_same(compiled(x), f(x))
        assert len(compiled.kiln_cache.entries) == 2
    finally:
        del globals()["abs"]


def test_deleted_global_raises_name_error_as_in_eager():
    globals()["_TEMP"] = 1.0

    def f(x):
        return x + _TEMP  # noqa: F821 - defined and deleted by this test

    compiled = kiln.compile(f, backend="eager")
    x = torch.randn(2)
    assert_same(compiled(x), x + 1.0)
    del globals()["_TEMP"]
    with pytest.raises(NameError, match="_TEMP"):
        compiled(x)


def test_a_global_written_in_another_module_is_read_back_through_the_module():
    # Dynamo's test_modules.py test_globals_change_in_other_file: a function of another module
    # ran `global counter; counter += 1`, and `other.counter` then read the value from before.
    import types

    other = types.ModuleType("kiln_test_other_module")
    exec("counter = 0\ndef bump(x):\n    global counter\n    counter += 1\n    return x * counter\n", other.__dict__)

    def fn(x):
        a = other.bump(x)
        return a * other.counter, other.counter

    compiled = kiln.compile(fn, backend="eager", fullgraph=True)
    out, seen = compiled(torch.ones(2))
    assert other.counter == 1 and seen == 1
    torch.testing.assert_close(out, torch.ones(2))
