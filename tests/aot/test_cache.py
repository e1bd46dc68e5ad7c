"""The AOT graph cache: a second compile of the same graph loads what the first built; a changed
input layout or grad mode, another CPU or thread count, a change to kiln's source miss; a
corrupted entry is rebuilt, never loaded."""

import shutil
import sys
from pathlib import Path

import pytest
import torch
from torch import fx

import kiln
from kiln import aot, disk_cache
from kiln.backend import Backend


@pytest.fixture(autouse=True)
def private_cache(tmp_path):
    with kiln.config.patch({"cache.dir": str(tmp_path / "cache")}):
        yield tmp_path / "cache"


@pytest.fixture
def traces(monkeypatch):
    """How many inference graphs the AOT layer traced."""
    compile_module = sys.modules["kiln.aot.compile"]
    count = {"n": 0}
    original = compile_module.trace_inference

    def counting(*args, **kwargs):
        count["n"] += 1
        return original(*args, **kwargs)

    monkeypatch.setattr(compile_module, "trace_inference", counting)
    return count


class Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(8, 8)

    def forward(self, x):
        return torch.softmax(self.linear(x), -1) * 2, x.sum()


def compile_block(x, module=None):
    gm = fx.symbolic_trace(module or Block().eval())
    return aot.compile(gm, [x], Backend(), options=aot.AotOptions(cache=True))


def test_second_compile_loads_instead_of_tracing(traces):
    x = torch.randn(4, 8)
    module = Block().eval()
    with torch.no_grad():
        first = compile_block(x, module)(x)
        second_compiled = compile_block(x, module)
        second = second_compiled(x)
    assert traces["n"] == 1
    torch.testing.assert_close(second, first)
    torch.testing.assert_close(second, module(x))


def test_other_weights_same_graph_hit_and_use_their_own_weights(traces):
    x = torch.randn(4, 8)
    a, b = Block().eval(), Block().eval()
    with torch.no_grad():
        compile_block(x, a)(x)
        out = compile_block(x, b)(x)
    assert traces["n"] == 1
    torch.testing.assert_close(out, b(x))


def test_other_layouts_miss(traces):
    with torch.no_grad():
        compile_block(torch.randn(4, 8))(torch.randn(4, 8))
        compile_block(torch.randn(5, 8))(torch.randn(5, 8))
        compile_block(torch.randn(8, 4).t())(torch.randn(8, 4).t())
    assert traces["n"] == 3


def test_a_graph_traced_under_autocast_is_another_entry(traces):
    # autocast's casts are baked into the traced graph: an fp32 entry must not serve bf16 calls
    x = torch.randn(4, 8)
    module = Block().eval()
    with torch.no_grad():
        fp32 = compile_block(x, module)(x)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            bf16 = compile_block(x, module)(x)
            expected = module(x)
    assert traces["n"] == 2
    assert fp32[0].dtype == torch.float32 and bf16[0].dtype == expected[0].dtype == torch.bfloat16
    assert not torch.equal(bf16[0].float(), fp32[0])  # the linear ran in bfloat16
    torch.testing.assert_close(bf16[0], expected[0], rtol=2e-2, atol=2e-2)


def test_an_entry_written_under_one_cpu_is_not_used_under_another(traces, monkeypatch):
    # A graph carries its machine's autotuning answers and kernel choices: another CPU builds its own.
    x = torch.randn(4, 8)
    module = Block().eval()
    with torch.no_grad():
        compile_block(x, module)(x)
        monkeypatch.setattr(disk_cache, "cpu_identity", lambda: "Another CPU AuthenticAMD 25 17|fma avx2|AVX2")
        out = compile_block(x, module)(x)
        assert traces["n"] == 2
        compile_block(x, module)(x)  # that CPU's own entry serves it
    assert traces["n"] == 2
    torch.testing.assert_close(out, module(x))


def test_an_entry_written_at_one_thread_count_is_not_used_at_another(traces):
    # The autotuner's answers in a graph were measured at the thread count it was compiled under.
    x = torch.randn(4, 8)
    module = Block().eval()
    before = torch.get_num_threads()
    try:
        with torch.no_grad():
            torch.set_num_threads(1)
            compile_block(x, module)(x)
            torch.set_num_threads(2)
            compile_block(x, module)(x)
    finally:
        torch.set_num_threads(before)
    assert traces["n"] == 2


def test_a_change_to_the_runtimes_cpp_source_misses(traces, monkeypatch, tmp_path):
    # The graphs call into kiln's runtime: one built against another runtime source is not loaded.
    x = torch.randn(4, 8)
    module = Block().eval()
    package = Path(kiln.__file__).parent
    copy = tmp_path / "kiln"
    shutil.copytree(package / "native", copy / "native", ignore=shutil.ignore_patterns("__pycache__"))
    monkeypatch.setattr(disk_cache, "kiln_fingerprint", lambda: disk_cache.fingerprint(copy))
    with torch.no_grad():
        compile_block(x, module)(x)
        source = copy / "native" / "src" / "kiln_runtime.cpp"
        source.write_text(source.read_text() + "\n// changed\n")
        compile_block(x, module)(x)
    assert traces["n"] == 2


def test_a_corrupted_entry_is_rebuilt(traces, private_cache):
    x = torch.randn(4, 8)
    with torch.no_grad():
        compile_block(x)(x)
        (entry,) = private_cache.glob("aot/*/*.pkl")
        entry.write_bytes(entry.read_bytes()[:-7] + b"garbage")
        out = compile_block(x)(x)
    assert traces["n"] == 2
    assert out[0].shape == (4, 8)


def test_without_the_option_nothing_is_cached(private_cache):
    x = torch.randn(4, 8)
    gm = fx.symbolic_trace(Block().eval())
    with torch.no_grad():
        aot.compile(gm, [x], Backend())(x)
    assert not list(private_cache.glob("aot/*/*.pkl"))


def test_graphs_are_compiled_and_run_with_the_callers_autocast_off():
    # The trace holds autocast's casts; an op it kept in float32 (autocast disabled around it) must
    # stay float32 when the backend's passes re-run ops on fake values and when the compiled graph
    # runs its extern ops under the caller's autocast.
    def f(x, w):
        with torch.autocast("cpu", enabled=False):
            return torch.mm(x.float(), w).sin() + 1

    torch.manual_seed(0)
    x, w = torch.randn(8, 16), torch.randn(16, 16)
    compiled = kiln.compile(f)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        want, got = f(x, w), compiled(x, w)
    assert got.dtype == want.dtype == torch.float32
    torch.testing.assert_close(got, want)
