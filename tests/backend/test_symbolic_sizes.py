"""Kernels over symbolic sizes: a graph whose input sizes are symbolic is compiled once, its C++
kernels taking the sizes as arguments, and serves every size with eager's results."""

import os
import re

import pytest
import torch

import kiln
from kiln.runtime import fallback
from kiln.runtime.compiled_graph import CompiledGraph
from kiln.runtime.frozen import FrozenProgram
from kiln.runtime.specialized import SizeSpecialized
from tests.kiln_backend import private_cache  # noqa: F401  (each test compiles in an empty cache: they count builds)

os.environ.setdefault("HF_HUB_OFFLINE", "1")


def _compiled_graphs(built):
    return [b.runtime if isinstance(b, FrozenProgram) else b for b in built if isinstance(b, (CompiledGraph, FrozenProgram))]


def _run_sizes(fn, sizes, make, dynamic=True, **tolerance):
    """`fn` compiled with `dynamic` over inputs `make(size)`; the graphs the backend built."""
    kiln.reset()
    fallback.reset()
    compiled = kiln.compile(fn, dynamic=dynamic)
    with torch.no_grad(), kiln.backend.watch() as built:
        for size in sizes:
            args = make(size)
            torch.testing.assert_close(compiled(*args), fn(*args), **tolerance)
    assert not fallback.FALLBACKS, fallback.FALLBACKS
    assert not any(isinstance(b, SizeSpecialized) for b in built)
    return _compiled_graphs(built)


def _rows(x, w, b):
    y = torch.nn.functional.layer_norm(x * 2, (x.shape[-1],), w, b)
    return torch.softmax(y, -1) + y.sum(0, keepdim=True) + x.amax(-1, keepdim=True)


# Sizes around the vector width (8 and 16 lanes), the unroll length and OpenMP's thresholds.
ODD = [3, 1, 7, 8, 17, 33, 64, 130]


@pytest.mark.parametrize("cols", [5, 16, 67])
def test_rows_of_every_length_through_one_compiled_graph(cols):
    w, b = torch.randn(cols), torch.randn(cols)
    # (y.sum(0) over 300 rows, added in kiln's order: 1.3e-5 from eager's in one draw of 67
    # columns, over the default atol of 1e-5)
    graphs = _run_sizes(_rows, [2, 3, 9, 17, 300, 2], lambda n: (torch.randn(n, cols), w, b), atol=5e-5, rtol=1e-5)
    assert len(graphs) == 1 and any(graphs[0].artifact.size_arguments.values())


def _columns(x):
    # A reduction over rows (vectorized across the columns), a transposed read and a cumulative op.
    return x.sum(0) * 2, (x.t() * x.mean(0, keepdim=True).t()).relu(), torch.cat([x, x[:, :1]], 1)


def test_symbolic_columns_and_rows():
    graphs = _run_sizes(_columns, [(r, c) for r in (2, 5) for c in ODD], lambda rc: (torch.randn(*rc),))
    assert len(graphs) <= 2  # a column count of 1 is its own capture


def _gather_scatter(x, idx):
    return x.index_select(0, idx) * 3, torch.zeros(x.shape[0], x.shape[1]).index_add(0, idx, x[: idx.shape[0]])


def test_gathers_and_scatters_over_symbolic_sizes():
    def make(n):
        return torch.randn(n, 6), torch.randint(0, n, (max(n // 2, 2),))
    graphs = _run_sizes(_gather_scatter, [4, 9, 33, 70], make)
    assert len(graphs) == 1


def test_a_kernel_takes_its_sizes_as_arguments():
    graphs = _run_sizes(lambda x: (x * 2).relu().sum(-1), [(4, 9), (5, 17)], lambda s: (torch.randn(*s),))
    source = graphs[0].source
    assert "int64_t ks" in source and "9L" not in source and "17L" not in source


def test_rows_of_a_symbolic_count_enter_no_parallel_region_each():
    # A dynamic KV cache's append: 12 x L rows of 64 floats, L symbolic. The rows' loops are the
    # parallel ones (or none); a region per row, even one whose `if` is false, cost ~0.35 µs a row
    # (0.7 ms for 0.5 MB). No region opens inside the rows' loops: a row of 64 never parallelizes,
    # and a symbolic last loop is chosen by a C++ branch.
    def append(cache, new, angle):  # (a rotary embedding's sines and cosines: computed once, not for every row)
        return torch.cat([cache, new * angle.cos() + new * angle.sin()], 2), \
            torch.cat([cache.transpose(2, 3), new.transpose(2, 3)], 3) + 1

    def shifted(x, y):  # rows and their length both symbolic
        return x[:, :, :-1] + y[:, :, 1:].cos()

    kv = _run_sizes(append, [3, 40, 300, 5], lambda n: (torch.randn(1, 12, n, 64), torch.randn(1, 12, 1, 64), torch.randn(64)))
    rows = _run_sizes(shifted, [(3, 5), (20, 70), (2, 3000)], lambda s: (torch.randn(s[0], 12, s[1]),) * 2)
    for graphs in (kv, rows):
        assert len(graphs) == 1
        nested = [line for line in graphs[0].source.splitlines() if line.startswith("    ") and "omp parallel for" in line and " if(" in line]
        assert not nested, nested
    kernels = kv[0].source.split('extern "C" void ')[1:]
    assert not [k for k in kernels if "kiln_vcos" in k and "kiln::select" in k]  # no cosine in the cat's loop
    assert [k for k in kernels if "kiln_vcos" in k]
    branch = r"\n( +)if \(.*\) \{\n +#pragma omp parallel for num_threads\(kiln::team\(\)\)\n +for .*\n(.*\n)*?\1\} else \{\n +for "
    assert re.search(branch, rows[0].source), rows[0].source


def _padded_to_capacity(mask, x):
    # HuggingFace's static cache: the 2D attention mask padded to the cache's capacity, the pad
    # amount (capacity - the mask's width) symbolic with the width.
    padded = torch.nn.functional.pad(mask, (0, 32 - mask.shape[-1]), value=-1.0)
    return padded * 2 + x, torch.nn.functional.pad(x, (mask.shape[-1] - 3, 1))


def test_a_pad_of_a_symbolic_amount_compiles_once():
    graphs = _run_sizes(_padded_to_capacity, [5, 9, 30, 7], lambda n: (torch.randn(1, n), torch.randn(2, 32)))
    assert len(graphs) == 1


def test_a_graph_compiled_per_size_keeps_its_frozen_weights():
    # Per size, the graph is traced again: the inputs' marks from the AOT layer (module state,
    # written back) must survive it, or freezing is lost — a quantized model's products then run
    # eager's dequantizing reference, ~100x slower.
    layer = kiln.quantize(torch.nn.Sequential(torch.nn.Linear(64, 48), torch.nn.ReLU()), "int8")
    kiln.reset()
    fallback.reset()
    compiled = kiln.compile(layer, dynamic=True)
    with torch.no_grad(), kiln.backend.watch() as built, kiln.config.patch({"backend.symbolic_kernels": False}):
        for rows in (3, 5, 6):
            x = torch.randn(rows, 64)
            torch.testing.assert_close(compiled(x), layer(x), atol=1e-4, rtol=1e-4)
    assert isinstance(built[0], SizeSpecialized) and len(built) == 4, built
    for per_size in built[1:]:
        assert isinstance(per_size, FrozenProgram), per_size
        assert "kiln_quant" not in per_size.runtime.source and "kiln_quant.linear" not in str(per_size.runtime)


def _tiny(name):
    import transformers

    common = dict(vocab_size=1000, num_hidden_layers=2)
    if name == "bert":
        config = transformers.BertConfig(hidden_size=64, num_attention_heads=4, intermediate_size=128,
                                         max_position_embeddings=256, **common)
        return transformers.BertModel(config).eval()
    config = transformers.GPT2Config(n_embd=64, n_head=4, n_positions=256, **common)
    return transformers.GPT2Model(config).eval()


@pytest.mark.parametrize("dynamic", [None, True])
@pytest.mark.parametrize("name", ["bert", "gpt2"])
def test_hf_models_over_twelve_shapes_compile_once_per_capture(name, dynamic):
    """Batch 1, 2, 4 x sequence 16-128 through kiln.compile's default backend, batch first: one
    backend compile per capture, none per size. By default (dynamic=None) the captures are static
    first, then sequence dynamic at batch 1, then both dynamic; with dynamic=True the first call
    is already symbolic in the sequence, so batch 2 is the only compile after it (sizes 0 and 1
    are specialized, as Dynamo does)."""
    model = _tiny(name)
    shapes = [(b, s) for b in (1, 2, 4) for s in (16, 32, 64, 128)]
    g = torch.Generator().manual_seed(0)
    kiln.reset()
    fallback.reset()
    compiled = kiln.compile(model, dynamic=dynamic)
    with torch.no_grad(), kiln.backend.watch() as built:
        for b, s in shapes:
            ids = torch.randint(0, 1000, (b, s), generator=g)
            torch.testing.assert_close(compiled(input_ids=ids)[0], model(input_ids=ids)[0], rtol=1e-4, atol=1e-4)
    cache = compiled.kiln_cache
    assert not fallback.FALLBACKS and cache.eager_calls == 0
    assert not any(isinstance(b, SizeSpecialized) for b in built)
    if dynamic:
        assert len(built) == len(cache.entries) == 2
    else:
        assert len(built) <= len(cache.entries) <= 3


VIEWS = {"permute": lambda x: x.permute(2, 0, 1), "narrow": lambda x: x.narrow(1, 1, 2),
         "split": lambda x: x.split(2, 1), "diagonal": lambda x: x.diagonal(0, 1, 2), "select": lambda x: x[:, 1],
         "unbind": lambda x: x.unbind(1), "expand": lambda x: x.expand(3, *x.shape)}


@pytest.mark.parametrize("name", list(VIEWS))
def test_outputs_viewing_an_input_get_the_layout_of_each_call(name):
    # The AOT layer hands such outputs back as views of the input, their layout evaluated at the
    # call's sizes; the graph computes nothing for them (it returns the input: trace.functionalized).
    fn = VIEWS[name]
    kiln.reset()
    compiled = kiln.compile(fn, dynamic=True)
    with kiln.backend.watch() as built:
        for shape in [(2, 3, 4), (3, 5, 6), (4, 7, 9)]:
            x = torch.randn(*shape)
            got, want = compiled(x), fn(x)
            torch.testing.assert_close(got, want)
            for g, w in zip(got if isinstance(got, tuple) else [got], want if isinstance(want, tuple) else [want]):
                assert g.stride() == w.stride() and g.data_ptr() == w.data_ptr()
    assert built and all(not getattr(b, "runtime", b).stages.schedule.kernels for b in built)


def test_a_graph_with_symbolic_sizes_is_loaded_from_the_aot_cache_for_every_size():
    """A second compile (a new process, or after kiln.reset) loads the symbolic graph the first
    built and runs it at sizes neither compiled; the loaded signature still hands back the view of
    the input at each call's layout."""
    w = torch.randn(6, 6)

    def fn(x):
        return torch.softmax(x @ w, -1) * 2, x.permute(1, 0, 2)

    assert len(_run_sizes(fn, [(3, 5), (4, 7)], lambda s: [torch.randn(*s, 6)])) == 1
    assert _run_sizes(fn, [(9, 2), (2, 11)], lambda s: [torch.randn(*s, 6)]) == []
    kiln.reset()
    compiled = kiln.compile(fn, dynamic=True)
    x = torch.randn(5, 3, 6)
    view = compiled(x)[1]
    assert view.data_ptr() == x.data_ptr() and view.stride() == x.permute(1, 0, 2).stride()


def test_a_cached_graph_whose_build_specialized_a_size_is_loaded_only_where_that_holds():
    """A size its build decided (x[:k] at k = 0 traces as an empty slice: k == 0 guarded) is not in
    the AOT cache key, computed before the build: the entry records it, a call where it is false
    builds (and stores) another variant, and a load adds the guard to the frame's. (Found as a
    flaky test: a fresh cache whose first data-dependent k was 0 returned empty slices for every
    later k.)"""
    def fn(x, k):
        return x[:k].cos()

    def run(k):
        kiln.reset()
        compiled = kiln.compile(fn, dynamic=True)
        x = torch.randn(9)
        with torch.no_grad(), kiln.backend.watch() as built:
            torch.testing.assert_close(compiled(x, k), fn(x, k))
            other = 3 if k == 0 else 0  # the frame's guards hold the variant's decision
            torch.testing.assert_close(compiled(x, other), fn(x, other))
        return len(_compiled_graphs(built))

    assert run(0) == 2  # k = 0, then k = 3: its key's entry (k == 0) is false there, a second variant
    assert run(5) == 0  # the k = 3 variant serves k = 5, then k = 0 loads the first
    assert run(0) == 0  # and the loaded k == 0 variant sends k = 3 to the other


def test_an_output_viewing_a_written_input_is_made_from_it_not_computed():
    """`x.mul_(y); return x[:, :2]`: the output is a view of x, made from x after the call
    (call_wrappers.AliasRestorer), not a copy the graph computes of the new values' first columns:
    the graph's kernel stores x's new values and the sum, nothing else. Eager's values and strides."""

    def fn(x, y):
        x.mul_(y)
        return x[:, :2], (x * 3).sum()

    kiln.reset()
    compiled = kiln.compile(fn, dynamic=True)
    with kiln.backend.watch() as built:
        for rows in (5, 7, 9):
            x, y = torch.randn(rows, 6), torch.randn(rows, 6)
            twin = x.clone()
            got, want = compiled(x, y), fn(twin, y)
            torch.testing.assert_close(got, want)
            assert got[0].data_ptr() == x.data_ptr() and got[0].stride() == want[0].stride()
    schedule = getattr(built[-1], "runtime", built[-1]).stages.schedule
    assert sum(len(kernel.outputs) for kernel in schedule.kernels) == 2
