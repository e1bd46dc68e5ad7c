"""The C++ wrapper (backend.cpp_wrapper): a CPU graph run by one generated C function that calls
its kernels directly and everything else through kiln's runtime over libtorch, with eager's
results; every implementation of kiln::mm and kiln::conv (C++, kiln's runtime) against ATen; the
graphs it declines keep the Python wrapper, said in the log."""

import ctypes
import dataclasses
import gc
import logging
import os
import warnings
import weakref

import pytest
import sympy
import torch

import kiln
from kiln.backend import codegens
from kiln.codegen.cpp_wrapper import cpp_wrapper
from kiln.codegen.wrapper_plan import wrapper_plan
from kiln.externs import kiln_attention, native_ops
from kiln.externs import prepacked
from kiln.native import libkiln
from kiln.runtime import fallback
from kiln.runtime.compiled_graph import CompiledGraph
from kiln.runtime.frozen import FrozenProgram
from tests.codegen.test_kiln_gemm import EPILOGUES, unary_reference

os.environ.setdefault("HF_HUB_OFFLINE", "1")


@pytest.fixture(scope="module", autouse=True)
def module_cache(tmp_path_factory):
    """One cache for the module: kiln's runtime library is built once (about 15 s), not per test."""
    with kiln.config.patch({"cache.dir": str(tmp_path_factory.mktemp("cache")), "backend.cpp_wrapper": True}):
        yield


def _graphs(built):
    return [b.runtime if isinstance(b, FrozenProgram) else b for b in built if isinstance(b, (CompiledGraph, FrozenProgram))]


def _compiled(fn, *calls, dynamic=None, **tolerance):
    """`fn` compiled with the C++ wrapper, checked against eager on each call's arguments; the
    graphs built."""
    kiln.reset()
    fallback.reset()
    compiled = kiln.compile(fn, dynamic=dynamic)
    with torch.no_grad(), kiln.backend.watch() as built:
        for args in calls:
            torch.testing.assert_close(compiled(*args), fn(*args), **tolerance)
    assert not fallback.FALLBACKS, fallback.FALLBACKS
    graphs = _graphs(built)
    assert graphs and all(g.artifact.cpp_wrapper is not None for g in graphs)
    return graphs


def _rows(x, w):
    y = torch.nn.functional.layer_norm(x * 2, (x.shape[-1],))
    return torch.softmax(y @ w, -1), y.sum(0), (x > 0).float().t()


def _views_and_repeats(x):
    y = x.sin()
    return y, y, x.t(), x.long() + 3


def _masked_fill(x, m):
    return x.masked_fill(m, -1.0).cumsum(1)


def _complex(z):
    return torch.view_as_real(z * 2 + 1).sum(-1)


CASES = {
    "kernels and an aten::mm extern": (_rows, [(torch.randn(8, 16), torch.randn(16, 5))]),
    "an output twice, a view, int64": (_views_and_repeats, [(torch.randn(4, 6),)]),
    "a bool input, an extern with defaults": (_masked_fill, [(torch.randn(5, 7), torch.rand(5, 7) > 0.5)]),
    # complex ops run as ATen externs, the 2 and 1 passed where their schemas have a Tensor
    "numbers as tensor arguments": (_complex, [(torch.randn(4, 3, dtype=torch.complex64),)]),
}


@pytest.mark.parametrize("case", list(CASES))
def test_graphs_run_through_the_cpp_wrapper_with_eagers_results(case):
    fn, calls = CASES[case]
    _compiled(fn, *calls)


def test_symbolic_sizes_are_read_off_the_inputs():
    graphs = _compiled(_rows, *[(torch.randn(n, 16), torch.randn(16, 5)) for n in (3, 9, 17)], dynamic=True)
    assert len(graphs) == 1 and "kiln_size(" in graphs[0].artifact.cpp_wrapper


def _scaled(x, n):
    # `n`, a Python int that changes between calls, becomes a symbolic integer input of the graph.
    return x.sin() * n + torch.ones(n).sum()


def test_integer_inputs_reach_the_cpp_wrapper_as_numbers():
    """A graph with an integer input (a static KV cache's `max_cache_len` across `generate()`
    lengths) runs through the C++ wrapper, which reads the number from a 0-d tensor the call
    makes; it ran kiln's Python wrapper before (~100 µs more a call). Eager's values at each."""
    x = torch.randn(3, 5)
    graphs = _compiled(_scaled, (x, 7), (x, 9), (x, 12), (x, 16))
    symbolic = graphs[-1]
    assert symbolic.artifact.number_inputs and "kiln_data(" in symbolic.artifact.cpp_wrapper


def test_a_frozen_model_runs_its_gemms_through_the_runtime():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.GELU(), torch.nn.Linear(64, 8)).eval()
    (graph,) = _compiled(model, (torch.randn(4, 32),), (torch.randn(4, 32),), rtol=1e-4, atol=1e-4)
    wrapper = graph.artifact.cpp_wrapper
    assert "kiln_find_op(\"kiln::mm\"" in wrapper  # the runtime's own function (no dispatcher: docs/native.md)


# The post-ops each implementation takes: the graph pass gives those that do not fuse one "none"
# (ATen runs it after); gelu comes with its algorithm.
POST_OPS = [("none", [], None), ("gelu", [], "none"), ("gelu", [], "tanh"), ("leaky_relu", [0.1], None),
            ("hardtanh", [-0.5, 0.5], None)]
MM_CASES = [(impl, *post) for impl in prepacked.MM_IMPLS for post in POST_OPS
            if post[0] == "none" or impl in ("onednn", "kiln")]


@pytest.mark.parametrize("impl, unary, scalars, algorithm", MM_CASES)
def test_every_kiln_mm_implementation_matches_aten(impl, unary, scalars, algorithm):
    torch.manual_seed(0)
    a, b, bias = torch.randn(5, 33), torch.randn(33, 20), torch.randn(20)
    aten = lambda: unary_reference(torch.addmm(bias, a, b), unary, scalars, algorithm)  # noqa: E731
    direct, dispatched = native_ops.direct("mm"), native_ops.op("mm")
    torch.testing.assert_close(direct(a, b, bias, unary, scalars, algorithm, impl), aten(), rtol=1e-5, atol=1e-5)
    # The packed weight is kept: a second call with the weight changed in place packs again.
    with torch.no_grad():
        b.mul_(2)
    torch.testing.assert_close(direct(a, b, bias, unary, scalars, algorithm, impl), aten(), rtol=1e-5, atol=1e-5)
    # One implementation: the dispatcher's kernel is the same function.
    assert torch.equal(dispatched(a, b, bias, unary, scalars, algorithm, impl),
                       direct(a, b, bias, unary, scalars, algorithm, impl))


@pytest.mark.parametrize("unary, scalars, algorithm", EPILOGUES)
def test_kiln_post_op_is_eagers(unary, scalars, algorithm):
    # What the autotuner times the implementations that apply a post-op after their product with.
    y = torch.randn(7, 9)
    got = native_ops.direct("post_op")(y, unary, scalars, algorithm)
    torch.testing.assert_close(got, unary_reference(y, unary, scalars, algorithm))
    assert got.data_ptr() != y.data_ptr()  # a new tensor, "none" included, as its schema says


def test_kiln_mm_refuses_an_unknown_implementation_naming_the_accepted_ones():
    a = torch.randn(2, 3)
    with pytest.raises(RuntimeError, match=r"unknown implementation fast \(aten, aten_kn, aten_nk, kiln, kiln_bf16, mkl, onednn\)"):
        native_ops.direct("mm")(a, a.t(), None, "none", [], None, "fast")


def test_packs_of_freed_weights_are_dropped():
    a = torch.randn(4, 16)
    weights = [torch.randn(8, 16).t() for _ in range(3)]  # "aten_kn" packs a row-major copy
    mm = native_ops.direct("mm")
    for w in weights:
        mm(a, w, None, "none", [], None, "aten_kn")
    held = libkiln.library().kiln_packs_held()
    del weights, w
    gc.collect()
    keep = torch.randn(8, 16).t()
    mm(a, keep, None, "none", [], None, "aten_kn")  # packing drops the freed weights' packs
    assert libkiln.library().kiln_packs_held() <= held - 3 + 1
    # A weight already in the wanted layout is its own pack: not held (it would never be freed).
    before = libkiln.library().kiln_packs_held()
    mm(a, torch.randn(16, 8), None, "none", [], None, "aten_kn")
    assert libkiln.library().kiln_packs_held() == before


# kiln's own implementation runs depthwise convolutions only: tests/codegen/test_kiln_depthwise.py.
CONV_CASES = [(impl, unary, with_other) for impl in [*prepacked.CONV_IMPLS, prepacked.IN_PLACE_CONV_IMPL]
              for unary in ("none", "relu") for with_other in (False, True)
              if (with_other or impl != prepacked.IN_PLACE_CONV_IMPL) and impl != "kiln"]


@pytest.mark.parametrize("padding", [[1, 1], [0, 1, 1, 2]])
@pytest.mark.parametrize("impl, unary, with_other", CONV_CASES)
def test_every_kiln_conv_implementation_matches_aten(impl, unary, with_other, padding):
    torch.manual_seed(0)
    x, weight, bias = torch.randn(2, 8, 9, 9), torch.randn(16, 4, 3, 3), torch.randn(16)
    padded = torch.nn.functional.pad(x, [padding[1], padding[3], padding[0], padding[2]]) if len(padding) == 4 else x
    y = torch.nn.functional.conv2d(padded, weight, bias, 2, 0 if len(padding) == 4 else padding, 1, 2)
    other = torch.randn(y.shape).contiguous(memory_format=torch.channels_last) if with_other else None
    want = unary_reference(y + other if with_other else y, unary, [], None)
    got = native_ops.direct("conv")(x, weight, bias, [2, 2], padding, [1, 1], 2, unary, [], None, other, impl)
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
    if impl == prepacked.IN_PLACE_CONV_IMPL:
        assert got.data_ptr() == other.data_ptr()  # written over the added tensor


def test_a_conv_net_runs_its_convolutions_through_the_runtime():
    torch.manual_seed(0)

    class Block(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.conv1, self.bn1 = torch.nn.Conv2d(8, 8, 3, padding=1), torch.nn.BatchNorm2d(8)
            self.conv2 = torch.nn.Conv2d(8, 8, 3, padding=1, groups=8)

        def forward(self, x):
            return torch.relu(self.conv2(torch.relu(self.bn1(self.conv1(x)))) + x).mean((2, 3))

    model = Block().eval()
    graphs = _compiled(model, (torch.randn(2, 8, 12, 12),), rtol=1e-4, atol=1e-4)
    wrappers = "".join(g.artifact.cpp_wrapper for g in graphs)
    assert "kiln_find_op(\"kiln::conv\"" in wrappers


# kiln::attention's masks: none, one per query and key, and a key-padding one broadcast over the
# queries (read where it lies, with a zero query stride).
ATTENTION_MASKS = {"no mask": None, "a [Sq, Sk] mask": (1, 1, 7, 9), "a key-padding mask": (1, 1, 1, 9)}


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("mask", list(ATTENTION_MASKS))
def test_kiln_attention_runs_through_the_runtime_with_atens_results(mask, causal):
    torch.manual_seed(0)
    # q a transposed view ([B, S, H, D] as models make it), read where it lies
    q, k, v = torch.randn(1, 7, 2, 32).transpose(1, 2), torch.randn(1, 2, 9, 32), torch.randn(1, 2, 9, 32)
    m = torch.randn(ATTENTION_MASKS[mask]) if ATTENTION_MASKS[mask] else None

    op = kiln_attention.op()  # defined by kiln's runtime

    def fn(q, k, v, m):
        return op(q, k, v, m, 0.3, causal)

    kiln.reset()
    fallback.reset()
    with torch.no_grad(), kiln.backend.watch() as built:
        got = kiln.compile(fn)(q, k, v, m)
    want = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(q, k, v, 0.0, causal, attn_mask=m, scale=0.3)[0]
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    assert got.stride() == want.stride()  # ATen's layout, [B, Sq, H, Dv]
    assert torch.equal(got, op(q, k, v, m, 0.3, causal))  # one implementation: the dispatcher's is the same
    assert not fallback.FALLBACKS, fallback.FALLBACKS
    graphs = _graphs(built)
    assert graphs and all(g.artifact.cpp_wrapper is not None for g in graphs)
    wrappers = "".join(g.artifact.cpp_wrapper for g in graphs)
    assert "kiln_find_op(\"kiln::attention\"" in wrappers  # the generic call of an operator


def test_a_cpp_wrapper_calls_kilns_cpp_operators_without_the_dispatcher():
    # The runtime's own function, not the dispatcher's CPU kernel: with that kernel replaced, the
    # compiled graph still computes kiln's attention, while the dispatcher gives the replacement.
    op = kiln_attention.op()
    q = k = v = torch.randn(1, 2, 5, 16)
    want = op(q, k, v, None, 0.5, False)
    kiln.reset()
    fallback.reset()
    compiled = kiln.compile(lambda q, k, v: op(q, k, v, None, 0.5, False))
    with torch.no_grad():
        compiled(q, k, v)  # compiled (and its fake function run) before the kernel is replaced
        replacement = torch.library.Library("kiln", "IMPL")
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # "Overriding a previously registered kernel"
                replacement.impl("attention", lambda q, k, v, m, s, c: torch.zeros_like(q), "CPU")
            assert torch.equal(op(q, k, v, None, 0.5, False), torch.zeros_like(q))
            assert torch.equal(compiled(q, k, v), want)
        finally:
            replacement._destroy()
    assert torch.equal(op(q, k, v, None, 0.5, False), want)  # the runtime's kernel back


def test_the_runtimes_kiln_attention_refuses_what_its_kernel_does_not_compute():
    d = kiln_attention.lanes() + 1  # v's head size not a multiple of the vector width
    q = k = v = torch.randn(1, 2, 5, d)
    kiln.reset()
    fallback.reset()
    op = kiln_attention.op()
    with torch.no_grad(), pytest.raises(RuntimeError, match=rf"kiln::attention: .* not q \[1, 2, 5, {d}\] Float") as e:
        kiln.compile(lambda q, k, v: op(q, k, v, None, 0.5, False))(q, k, v)
    assert "frame #" not in str(e.value)  # no C++ backtrace


def test_an_index_out_of_range_raises_index_error():
    def gather_rows(w, i):
        return w[i] * 2

    w, i = torch.randn(10, 4), torch.tensor([1, 3, 9])
    _compiled(gather_rows, (w, i))
    compiled = kiln.compile(gather_rows)
    compiled(w, i)
    with pytest.raises(IndexError, match="index out of range in kiln kernel"):
        compiled(w, torch.tensor([1, 30]))
    torch.testing.assert_close(compiled(w, i), gather_rows(w, i))  # the flag was reset


def test_the_python_wrapper_still_sees_index_errors_once_the_runtime_is_loaded():
    # Found by the full suite: the runtime (loaded with global symbols) defined kiln_index_error
    # too, and kernel libraries loaded after it wrote that one instead of their own.
    libkiln.library()

    def gather_rows(w, i):
        return w[i] * 2

    kiln.reset()
    with kiln.config.patch({"backend.cpp_wrapper": False}):
        compiled = kiln.compile(gather_rows)
        compiled(torch.randn(10, 4), torch.tensor([1, 3]))
        with pytest.raises(IndexError, match="index out of range in kiln kernel"):
            compiled(torch.randn(10, 4), torch.tensor([1, 30]))


def test_the_wrapper_holds_no_input_or_output_after_the_call():
    (graph,) = _compiled(lambda x: (x * 2).sum(0), (torch.randn(6, 5),))
    x = torch.randn(6, 5)
    (out,) = graph(x)
    inputs, outputs = weakref.ref(x), weakref.ref(out)
    del x, out
    gc.collect()
    assert inputs() is None and outputs() is None


def test_a_large_call_holds_no_input_or_output_after_it():
    # Inputs of 64 KB or more run with the GIL released: the call holds each input once more while
    # the wrapper runs and drops it after, with the GIL.
    (graph,) = _compiled(lambda x, w: (x @ w).relu(), (torch.randn(64, 300), torch.randn(300, 90)))
    x, w = torch.randn(64, 300), torch.randn(300, 90)
    (out,) = graph(x, w)
    torch.testing.assert_close(out, (x @ w).relu())
    refs = [weakref.ref(t) for t in (x, w, out)]
    del x, w, out
    gc.collect()
    assert all(ref() is None for ref in refs)


def test_graphs_of_more_inputs_than_the_stack_holds_run_call_after_call():
    # Beyond 256 handles a call's live in a block its thread keeps for the next call, grown where
    # a later call has more: each call's inputs are its own, each in its place.
    def doubled(*xs):
        return torch.cat(xs) * 2

    (small,) = _compiled(doubled, tuple(torch.randn(3) for _ in range(300)))
    (large,) = _compiled(doubled, tuple(torch.randn(3) for _ in range(400)))
    tail = tuple(torch.randn(3) for _ in range(100))
    bound = small.bound(tail)
    for graph, count, bound_inputs in ((small, 300, ()), (large, 400, ()), (small, 300, ()), (bound, 200, tail)):
        xs = tuple(torch.randn(3) for _ in range(count))
        (out,) = graph(*xs)
        torch.testing.assert_close(out, doubled(*xs, *bound_inputs))


def test_a_graph_call_takes_the_runtime_s_share_and_release_together():
    from kiln.native import python_door

    with pytest.raises(ValueError, match="share and release are given together"):
        python_door.module().GraphCall(1, 1, 1, 1)


def test_the_runtime_s_handles_and_torch_s_are_released_by_either():
    # The runtime keeps released handles' blocks for its next ones; every handle is a block of
    # operator new, so torch's are released into them and torch takes the runtime's (deleting them).
    from kiln.native import libkiln

    lib = libkiln.library()
    address = lambda fn: ctypes.cast(fn, ctypes.c_void_p).value  # noqa: E731
    share = ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.c_void_p)(address(lib.kiln_share))
    release = ctypes.CFUNCTYPE(None, ctypes.c_void_p)(address(lib.kiln_release))
    x = torch.randn(4)
    for _ in range(3):
        made_by_torch = libkiln.handles_of([x])[0]
        ours = share(made_by_torch)
        release(made_by_torch)
        release(None)  # (nothing, as `delete` of a null pointer)
        (back,) = libkiln.tensors_of([ours])
        assert back.data_ptr() == x.data_ptr() and torch.equal(back, x)


@pytest.mark.parametrize("size", [(6, 5), (64, 300)])  # the GIL held, and released (64 KB or more)
def test_a_bound_graph_takes_its_last_inputs_from_the_binding(size):
    (graph,) = _compiled(lambda x, y, z: x * y - z, tuple(torch.randn(*size) for _ in range(3)))
    y, z = torch.randn(*size), torch.randn(*size)
    bound = graph.bound((y, z))
    assert type(bound(torch.randn(*size))) is tuple
    refs = [weakref.ref(y), weakref.ref(z)]
    expected = [(x, x * y - z) for x in (torch.randn(*size), torch.randn(*size))]
    del y, z
    gc.collect()
    for x, want in expected:  # the binding holds y and z alive
        (out,) = bound(x)
        torch.testing.assert_close(out, want)
    del bound
    gc.collect()
    assert all(ref() is None for ref in refs)


def test_a_graph_bound_again_takes_the_later_binding_first():
    # As Python's `lambda *head: call(*head, *tail)` of a call already bound.
    (graph,) = _compiled(lambda x, y, z: (x - y) * z, tuple(torch.randn(5, 4) for _ in range(3)))
    x, y, z = (torch.randn(5, 4) for _ in range(3))
    (out,) = graph._loaded_call.bind((z,)).bind((y,))(x)
    torch.testing.assert_close(out, (x - y) * z)


def test_a_bound_graph_under_the_profiler_or_an_instrumented_call_takes_the_usual_way():
    (graph,) = _compiled(lambda x, y: x + y, (torch.randn(6, 5), torch.randn(6, 5)))
    x, y = torch.randn(6, 5), torch.randn(6, 5)
    bound = graph.bound((y,))
    seen = []
    graph.call = graph.instrumented(lambda name, fn: (lambda *a: seen.append(name) or fn(*a)))
    torch.testing.assert_close(bound(x)[0], x + y)
    assert seen, "the instrumented call did not run"
    graph.call = graph._loaded_call
    with torch.profiler.profile() as prof:
        torch.testing.assert_close(bound(x)[0], x + y)
    assert any("kiln graph" in e.name for e in prof.events())


def test_binding_takes_tensors_only():
    from kiln.native import python_door

    (graph,) = _compiled(lambda x, y: x - y * 3, (torch.randn(6, 5), torch.randn(6, 5)))
    with pytest.raises(TypeError, match="item 0 is float"):
        graph._loaded_call.bind((1.5,))
    # Anything else than the extension's call is bound in Python.
    assert python_door.bind_trailing(lambda *a: a, (1, 2))(0) == (0, 1, 2)


def test_the_graph_call_takes_tensors_by_position_only():
    (graph,) = _compiled(lambda x: (x * 3).cos(), (torch.randn(6, 5),))
    with pytest.raises(TypeError, match="input 0 is float"):
        graph(1.5)
    with pytest.raises(TypeError, match="by position"):
        graph.call(x=torch.randn(6, 5))


def _views_inside(x, w):
    # A view that only feeds an extern (kiln_reinterpret) and one returned (a real view).
    z = (x * 2).reshape(4, 8) @ w
    return z.view(1, 4, 3), z + 1


def test_views_inside_the_graph_are_aliases_and_returned_views_are_views():
    (graph,) = _compiled(_views_inside, (torch.randn(1, 4, 8), torch.randn(8, 3)))
    assert "kiln_reinterpret(" in graph.artifact.cpp_wrapper
    view, _ = graph(torch.randn(1, 4, 8), torch.randn(8, 3))
    # The returned view is autograd's view of its base, sharing the base's version counter.
    assert view._is_view() and view._base is not None
    version = view._version
    view._base.add_(1)
    assert view._version == version + 1


def test_the_frozen_weight_check_sees_writes_rebinds_and_replacements():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2)).eval()
    compiled = kiln.compile(model)
    x = torch.randn(3, 8)
    with torch.no_grad():
        compiled(x)
        model[0].weight.add_(0.5)  # in place: the version counter moves
        torch.testing.assert_close(compiled(x), model(x))
        model[2].weight.data = torch.randn(2, 8)  # rebound to other memory
        torch.testing.assert_close(compiled(x), model(x))
        model[2].bias = torch.nn.Parameter(torch.randn(2))  # replaced
        torch.testing.assert_close(compiled(x), model(x))


def test_stamps_change_with_writes_rebinds_and_replacements():
    from kiln.native import python_door

    stamp = python_door.module().stamp
    a, b = torch.randn(3), torch.randn(4)
    with torch.inference_mode():
        c = torch.randn(2)  # an inference tensor has no version counter
    before = stamp([a, b, c])
    assert stamp([a, b, c]) == before and len(before) == 3 * 3 * 8
    b.add_(1)
    assert stamp([a, b, c]) != before
    before = stamp([a, b, c])
    a.data = torch.randn(3)
    assert stamp([a, b, c]) != before
    assert stamp([a, b.clone(), c]) != stamp([a, b, c])
    with pytest.raises(TypeError, match="item 1 is int"):
        stamp([a, 3])
    # Many tensors (a large model's frozen weights: their records prefetched level by level first),
    # inference tensors, tensors without storage among them: the same answers, item by item.
    many = [torch.randn(k % 7 + 1) for k in range(300)] + [c, torch.empty(0)]
    with torch.inference_mode():
        many.append(torch.randn(5))
    before = stamp(many)
    assert len(before) == len(many) * 3 * 8
    assert before == b"".join(stamp([t]) for t in many)
    many[150].mul_(2)
    after = stamp(many)
    assert after != before and after[:150 * 24] == before[:150 * 24] and after[151 * 24:] == before[151 * 24:]
    with pytest.raises(TypeError, match="item 301 is str"):
        stamp(many[:301] + ["x"])
    # With the expected stamp: whether it is that one, the same answers as comparing the bytes.
    assert stamp(many, after) is True and stamp(many, None) == after
    assert stamp(many[:-1], after) is False and stamp(many, after[:-1] + b"x") is False
    many[5].add_(1)
    assert stamp(many, after) is False
    with pytest.raises(TypeError, match="expected must be bytes"):
        stamp(many, list(after))
    plain = many[:300]  # (Python's stamp reads version counters, which inference tensors lack)
    python_stamp = python_door._python_stamp(plain)
    assert python_door._python_stamp(plain, python_stamp) is True
    plain[7].add_(1)
    assert python_door._python_stamp(plain, python_stamp) is False


def _python_tensor_match(t: torch.Tensor, expected: torch.Tensor, static: bool) -> bool:
    try:
        return (type(t) is type(expected) and t.dtype is expected.dtype and t.device == expected.device
                and t.dim() == expected.dim() and t.requires_grad is expected.requires_grad
                and (not static or (t.size() == expected.size() and t.stride() == expected.stride())))
    except Exception:  # noqa: BLE001 - as the guards' check: a value that cannot answer fails
        return False


def test_a_tensor_check_answers_as_the_python_guard_expression():
    from kiln.native import python_door

    TensorCheck = python_door.module().TensorCheck
    base = torch.randn(3, 4)
    values = [base, base.t(), base[:, :2], base.double(), base.unsqueeze(0), torch.randn(3, 4).requires_grad_(),
              torch.nn.Parameter(torch.randn(3, 4)), base.to_sparse(), torch.randn(12).view(3, 4), torch.randn(4, 3),
              torch.tensor(1.0), torch.empty(0, 4), base.to(device="meta"), 3, "x", None]
    for expected in values[:-3]:
        for static in (True, False):
            if static and expected.layout != torch.strided:
                continue  # (a static guard is made for strided tensors only)
            sizes, strides = (tuple(expected.shape), tuple(expected.stride())) if static else (None, None)
            check = TensorCheck(type(expected), expected.dtype, expected.device, expected.dim(), sizes, strides,
                                expected.requires_grad)
            for value in values:
                assert check(value) == _python_tensor_match(value, expected, static), (expected, value, static)
    with pytest.raises(TypeError, match="dtype: torch.dtype"):
        TensorCheck(torch.Tensor, "float32", torch.device("cpu"), 1, None, None, False)
    with pytest.raises(ValueError, match="sizes must have dim integers"):
        TensorCheck(torch.Tensor, torch.float32, torch.device("cpu"), 2, (3,), (1, 1), False)


def _python_fixed_numbers(t, sizes, strides, offset) -> bool:
    """The SHAPE guards `x.size()[d] == n`, `x.stride()[d] == n`, `x.storage_offset() == n` a
    partial TensorCheck stands for, as the guards' Python check evaluates them."""
    try:
        return (all(n is None or t.size()[d] == n for d, n in enumerate(sizes))
                and all(n is None or t.stride()[d] == n for d, n in enumerate(strides))
                and (offset is None or t.storage_offset() == offset))
    except Exception:  # noqa: BLE001 - as the guards' check: a value that cannot answer fails
        return False


@pytest.mark.filterwarnings("ignore:The PyTorch API of nested tensors")
def test_a_tensor_check_of_a_partial_layout_answers_as_the_shape_guards():
    # A dynamic input's TensorCheck also checks the sizes, strides and storage offset the shape
    # environment fixed (None: any), for strided, transposed, offset, sparse and nested tensors.
    from kiln.native import python_door

    TensorCheck = python_door.module().TensorCheck
    base = torch.randn(6, 4)
    values = [base, base.t(), base[1:], base[:, :2], torch.randn(5, 4), torch.randn(6, 8)[:, ::2], base.to_sparse(),
              torch.nested.nested_tensor([torch.randn(2, 4), torch.randn(3, 4)]), torch.randn(1, 4), base.double()]
    layouts = [((None, 4), (None, 1), 0), ((None, None), (None, 1), None), ((None, 4), (None, None), None),
               ((None, None), (None, None), 4), ((6, None), (4, None), 0), ((None, None), (None, None), None)]
    for sizes, strides, offset in layouts:
        check = TensorCheck(torch.Tensor, torch.float32, torch.device("cpu"), 2, sizes, strides, False,
                            storage_offset=offset)
        for value in values:
            want = _python_tensor_match(value, base, False) and _python_fixed_numbers(value, sizes, strides, offset)
            assert check(value) == want, (sizes, strides, offset, value)
    with pytest.raises(TypeError, match="storage_offset: int or None"):
        TensorCheck(torch.Tensor, torch.float32, torch.device("cpu"), 1, None, None, False, storage_offset="0")


def test_a_dynamic_inputs_fixed_strides_and_offset_are_checked_in_its_tensor_check():
    from kiln.native import python_door

    python_door.module()

    def f(x):
        return x * 2

    compiled = kiln.compile(f, backend="eager", dynamic=True)
    compiled(torch.randn(5, 4))
    (entry,) = compiled.kiln_cache.entries
    shapes = [g.describe() for g in entry.guards.guards if g.kind == "SHAPE"]
    assert any("stride()[1] == 1" in text for text in shapes) and any("storage_offset() == 0" in text for text in shapes)
    assert ".stride()[1] == 1" not in entry.guards.source_code and "storage_offset" not in entry.guards.source_code
    assert entry.guards.check(compiled.kiln_cache.binder(torch.randn(7, 4)))
    for other in (torch.randn(4, 7).t(), torch.randn(8, 4)[1:], torch.randn(7, 8)[:, ::2]):
        assert not entry.guards.check(compiled.kiln_cache.binder(other))
        assert entry.guards.first_failure(compiled.kiln_cache.binder(other)).kind == "SHAPE"
        torch.testing.assert_close(compiled(other), other * 2)


def test_the_extensions_views_are_pythons_as_strided():
    from kiln.native import python_door

    views_of = python_door.module().views_of
    bases = [torch.randn(4, 6), torch.randn(4, 6)]
    views = views_of(bases, (2, 3), (6, 2), 1)
    for view, base in zip(views, bases):
        assert view._base is base and view.stride() == (6, 2) and view.storage_offset() == 1
        assert torch.equal(view, base.as_strided((2, 3), (6, 2), 1))
    views[0].zero_()
    assert (bases[0][0, 1:6:2] == 0).all()  # a view: written through

    class Marked(torch.Tensor):
        pass

    assert views_of([bases[0], bases[1].as_subclass(Marked)], (2, 3), (6, 2), 1) is None  # (its as_strided may be its own)
    with pytest.raises(RuntimeError):
        views_of(bases, (10, 10), (6, 1), 0)  # past the storage
    assert python_door.views_function() is views_of


def test_views_of_written_inputs_of_one_layout_are_made_together(monkeypatch):
    # `a.mul_(2); return a[:, :2], ...`: kiln's graph hands each written input back for its view;
    # the two views of one layout are made in one call of the extension's views_of.
    from kiln.native import python_door

    python_door.module()
    made = []
    views_function = python_door.views_function

    def counted():
        views = views_function()
        return lambda bases, *layout: made.append(len(bases)) or views(bases, *layout)

    monkeypatch.setattr(python_door, "views_function", counted)

    def f(a, b, c):
        a.mul_(2)
        b.mul_(2)
        c.add_(1)
        return a[:, :2], b[:, :2], c.t()

    compiled = kiln.compile(f)
    for _ in range(2):
        a, b, c = torch.randn(5, 4), torch.randn(5, 4), torch.randn(3, 5)
        twins = [t.clone() for t in (a, b, c)]
        got, want = compiled(a, b, c), f(*twins)
        for g, w, base, twin in zip(got, want, (a, b, c), twins):
            torch.testing.assert_close(g, w)
            torch.testing.assert_close(base, twin)
            assert g._base is base and g.stride() == w.stride()
    assert made == [2, 1, 2, 1]  # each call: a's and b's views together, c's alone


def test_guards_match_tensors_in_c_once_the_extension_is_loaded():
    from kiln.native import python_door

    python_door.module()
    model = torch.nn.Linear(4, 2)
    with torch.no_grad():
        compiled = kiln.compile(model)
        compiled(torch.randn(3, 4))
        (entry,) = compiled.kiln_cache.entries
        assert "TensorCheck" in repr(entry.guards.ns.values) and ".stride()" not in entry.guards.source_code
        # It fails where the Python expression would: another stride, dtype, size or grad flag.
        L = compiled.kiln_cache.binder(torch.randn(3, 4))
        assert entry.guards.check(L)
        for other in (torch.randn(4, 3).t(), torch.randn(3, 4).double(), torch.randn(2, 4), torch.randn(3, 4).requires_grad_()):
            assert not entry.guards.check(compiled.kiln_cache.binder(other))
            assert "TENSOR_MATCH" in entry.guards.first_failure(compiled.kiln_cache.binder(other)).describe()


def test_what_the_cpp_wrapper_cannot_run_is_refused_naming_it():
    (graph,) = _compiled(lambda x: x.sin() * 2, (torch.randn(4, 3),))
    schedule = graph.schedule
    functions = {k: graph.artifact.kernels[k] for k in graph.artifact.kernels}
    with pytest.raises(NotImplementedError, match="on cuda"):
        cpp_wrapper(wrapper_plan(schedule, set(), {}, "cuda"), functions)
    with pytest.raises(NotImplementedError, match="returning sizes or constants"):
        cpp_wrapper(wrapper_plan(dataclasses.replace(schedule, outputs=[*schedule.outputs, sympy.Integer(3)]), set()),
                    functions)


def test_a_graph_the_cpp_wrapper_declines_runs_the_python_wrapper_and_says_why(monkeypatch, caplog):
    def declined(*args, **kwargs):
        raise NotImplementedError("a C++ wrapper for this graph (test)")

    monkeypatch.setattr(codegens, "cpp_wrapper", declined)
    kiln.reset()
    with kiln.config.patch({"debug.logs": "code"}), caplog.at_level(logging.INFO):
        graphs = _graphs_of(lambda x: x.cos() + 1, torch.randn(5, 2))
    assert graphs and all(g.artifact.cpp_wrapper is None for g in graphs)
    assert "the Python wrapper runs this graph: a C++ wrapper for this graph (test)" in caplog.text


def _graphs_of(fn, *args):
    with torch.no_grad(), kiln.backend.watch() as built:
        torch.testing.assert_close(kiln.compile(fn)(*args), fn(*args))
    return _graphs(built)


def test_tiny_bert_through_the_cpp_wrapper():
    import transformers

    config = transformers.BertConfig(hidden_size=64, num_attention_heads=4, intermediate_size=128,
                                     max_position_embeddings=256, vocab_size=1000, num_hidden_layers=2)
    model = transformers.BertModel(config).eval()
    ids = torch.randint(0, 1000, (2, 12), generator=torch.Generator().manual_seed(0))
    kiln.reset()
    fallback.reset()
    compiled = kiln.compile(model)
    with torch.no_grad(), kiln.backend.watch() as built:
        got = compiled(input_ids=ids).last_hidden_state
        want = model(input_ids=ids).last_hidden_state
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
    assert not fallback.FALLBACKS
    assert all(g.artifact.cpp_wrapper is not None for g in _graphs(built))


@pytest.mark.parametrize("dynamic", [None, True])
def test_training_graphs_run_through_the_cpp_wrapper(dynamic):
    def f(x, w):
        return torch.softmax(x @ w, -1).sin().sum()

    kiln.reset()
    compiled = kiln.compile(f, dynamic=dynamic)
    with kiln.backend.watch() as built:
        for n in (4, 6):
            x, w = torch.randn(n, 8, requires_grad=True), torch.randn(8, 3, requires_grad=True)
            compiled(x, w).backward()
            got = (x.grad, w.grad)
            x.grad = w.grad = None
            f(x, w).backward()
            torch.testing.assert_close(got, (x.grad, w.grad))
    graphs = _graphs(built)
    assert len(graphs) >= 2 and all(g.artifact.cpp_wrapper is not None for g in graphs)


def test_the_debug_dir_gets_both_wrappers(tmp_path):
    with kiln.config.patch({"debug.dump_dir": str(tmp_path / "dump")}):
        _compiled(lambda x: x.exp() + 1, (torch.randn(3, 4),))
    (folder,) = (tmp_path / "dump").glob("run_*/*_kiln_backend")
    names = [p.name.split("_", 1)[1] for p in sorted(folder.iterdir())]
    assert names[-2:] == ["wrapper.py", "wrapper.cpp"]
    assert 'extern "C" int kiln_graph_call' in sorted(folder.iterdir())[-1].read_text()


def test_a_weights_packs_are_dropped_on_request():
    a, w = torch.randn(4, 16), torch.randn(8, 16).t()
    native_ops.direct("mm")(a, w, None, "none", [], None, "aten_kn")
    native_ops.direct("mm")(a, w, None, "none", [], None, "kiln")
    assert prepacked.packed_bytes(w) >= 2 * w.numel() * 4
    prepacked.drop_packs(w)
    assert prepacked.packed_bytes(w) == 0


def test_a_direct_call_of_kilns_operator_names_what_is_wrong():
    a, b = torch.randn(2, 8), torch.randn(8, 4)
    mm = native_ops.direct("mm")
    with pytest.raises(RuntimeError, match="a tensor argument missing"):
        mm(None, b, None, "none", [], None, "aten")
    with pytest.raises(TypeError, match="not object"):
        mm(a, b, object(), "none", [], None, "aten")
    with pytest.raises(TypeError, match="argument impl is missing"):
        mm(a, b, None, "none", [], None)
    with pytest.raises(TypeError, match="unknown argument colour"):
        mm(a, b, None, "none", [], None, "aten", colour=1)
    with pytest.raises(RuntimeError, match="unknown implementation nope"):
        mm(a, b, None, "none", [], None, "nope")
    # Scalars as ints, floats or None, as a graph's post-ops carry them; arguments by name; defaults.
    got = mm(a, b, None, "hardtanh", [0, 1.5], algorithm=None, impl="kiln")
    torch.testing.assert_close(got, torch.nn.functional.hardtanh(a @ b, 0.0, 1.5))
    bias = torch.randn(4)
    torch.testing.assert_close(native_ops.direct("mm_softmax")(a, b, bias, None),
                               torch.softmax(a @ b + bias, -1), rtol=1e-5, atol=1e-6)
