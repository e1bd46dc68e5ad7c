"""The inputs a GEMM or convolution question is timed on: made only when measuring, and never
from the user's random stream."""

import pytest
import torch

import kiln
from kiln.autotune import gemm
from kiln.autotune.choose import clear_memory


@pytest.fixture(autouse=True)
def private_cache(tmp_path):
    clear_memory()
    with kiln.config.patch({"cache.dir": str(tmp_path / "cache")}):
        yield
    clear_memory()


def _count_inputs(monkeypatch) -> list:
    made = []
    original = gemm.Inputs._random

    def counting(self, val, memory_format):
        made.append(tuple(val.shape))
        return original(self, val, memory_format)

    monkeypatch.setattr(gemm.Inputs, "_random", counting)
    return made


def test_a_question_answered_from_the_cache_makes_no_inputs(monkeypatch):
    made = _count_inputs(monkeypatch)
    a, b = torch.empty(8, 64, device="meta"), torch.empty(64, 32, device="meta")
    first = gemm.choose_mm(a, b, None)
    copies = gemm.weight_copies(b)
    assert copies == gemm.MAX_WEIGHT_COPIES  # a small weight: several copies, read from beyond L2
    assert sorted(made) == [(8, 64), (64, 32)]  # measured: a once, b once (its other copies are its clones)
    clear_memory()  # the next answer comes from the disk cache
    made.clear()
    assert gemm.choose_mm(a, b, None) == first and made == []


def test_a_weight_larger_than_the_stream_is_timed_alone():
    assert gemm.weight_copies(torch.empty(4096, 4096, device="meta")) == 1  # 64 MB
    assert gemm.weight_copies(torch.empty(2048, 1024, device="meta")) == 2  # 8 MB: 16 MB in two copies
    assert gemm.weight_copies(torch.empty(3072, 1024, device="meta")) == 2  # 12 MB: two copies exceed 16 MB


def test_each_call_of_a_candidate_reads_the_next_copy_and_the_warm_up_packs_them_all():
    r = gemm.Inputs(**{f"b{k}": (torch.empty(2, 2, device="meta"), None) for k in range(4)})
    seen = {"first": [], "second": []}
    runs = gemm._rotating(r, ["b0", "b1", "b2", "b3"], {name: lambda b, name=name: seen[name].append(b.data_ptr())
                                                        for name in seen})
    for name, run in runs.items():
        run()  # the warm-up: every copy
        assert len(set(seen[name])) == 4
        seen[name].clear()
    for _ in range(8):  # rounds, the candidates interleaved
        for run in runs.values():
            run()
    for calls in seen.values():
        assert len(set(calls)) == 4 and calls[:4] == calls[4:] and calls[0] != calls[1]
    # Never one copy in the same round: ATen's candidates read the weight itself, and the later one
    # would find the copy the earlier one just read in the cache.
    assert all(a != b for a, b in zip(seen["first"], seen["second"]))


def test_conv_inputs_keep_the_arriving_layout_in_the_question(monkeypatch):
    made = _count_inputs(monkeypatch)
    x, w = torch.empty(1, 8, 10, 10, device="meta"), torch.empty(16, 8, 3, 3, device="meta")
    args = ([1, 1], [1, 1], [1, 1], 1)
    assert gemm._strides(x, torch.channels_last) == (800, 1, 80, 8)
    for channels_last in (False, True):
        gemm.choose_conv(x, channels_last, w, None, args, "none", [], None, None)
    # x and the weight (its other copies, timed in turn as in a model, are its clones) for each
    # layout: two questions, not one
    assert len(made) == 2 * 2


def test_compiling_leaves_the_users_random_stream_alone():
    model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 8)).eval()
    x = torch.randn(4, 64)
    torch.manual_seed(123)
    expected = torch.rand(3)
    torch.manual_seed(123)
    with torch.no_grad():
        torch.testing.assert_close(kiln.compile(model)(x), model(x))  # autotunes its GEMMs on a fresh cache
    torch.testing.assert_close(torch.rand(3), expected)


def _record_runtime_calls(monkeypatch) -> list:
    called = []
    original = gemm.native_ops.direct

    def direct(name):
        def recording(a, b, bias, unary, scalars, algorithm, impl):
            called.append((impl, unary))
            return original(name)(a, b, bias, unary, scalars, algorithm, impl)

        return recording if name == "mm" else original(name)

    monkeypatch.setattr(gemm.native_ops, "direct", direct)
    return called


def test_gemm_candidates_are_timed_as_the_cpp_wrapper_calls_them(monkeypatch):
    # From Python, kiln's GEMM paid ~3 µs more a call than ATen's; in a C++ wrapper, less: at
    # batch-1 sizes that decided questions the other way round from what the graph then ran.
    called = _record_runtime_calls(monkeypatch)
    a, b, bias = (torch.empty(1, 64, device="meta"), torch.empty(64, 48, device="meta"),
                  torch.empty(48, device="meta"))
    choice = gemm.choose_mm(a, b, bias, post_op=("relu", [], ""))
    impls = gemm.mm_impls(torch.float32)
    assert choice in [*impls, *gemm._fused_impls(torch.float32)]
    assert {impl for impl, unary in called if unary == "none"} == set(impls)  # every plain candidate
    assert {impl for impl, unary in called if unary == "relu"} == set(gemm._fused_impls(torch.float32).values())


def test_an_answered_question_leaves_no_packs_of_its_trial_weights_in_the_runtime():
    from kiln.native import libkiln

    held = libkiln.library().kiln_packs_held()
    a, b = torch.empty(4, 64, device="meta"), torch.empty(64, 40, device="meta")
    gemm.choose_mm(a, b, None)  # every packing candidate packs each of 8 weight copies
    assert libkiln.library().kiln_packs_held() <= held


def test_weight_copies_are_clones_of_the_first_drawn(monkeypatch):
    made = _count_inputs(monkeypatch)
    like = torch.empty(4, 4, device="meta")
    r = gemm.Inputs({"b1": "b0", "b2": "b0"}, **{f"b{k}": (like, None) for k in range(3)})
    assert torch.equal(r.b2, r.b0) and r.b2.data_ptr() != r.b0.data_ptr() and torch.equal(r.b1, r.b0)
    assert made == [(4, 4)]  # one drawn, two cloned


def _clone_count(monkeypatch) -> list:
    cloned = []
    original = gemm.Inputs.__getattr__

    def counting(self, name):
        if name not in self.__dict__.get("_made", {}) and name in self.__dict__.get("_copies", {}):
            cloned.append(name)
        return original(self, name)

    monkeypatch.setattr(gemm.Inputs, "__getattr__", counting)
    return cloned


def test_a_memory_bound_product_of_a_graph_beyond_the_cache_is_timed_on_weights_from_dram(monkeypatch):
    # A decode step's product (one row) in a model larger than the last-level cache reads its
    # weight from DRAM: timed on copies as large together as that cache, as a question of its own.
    monkeypatch.setattr(gemm, "last_level_cache_bytes", lambda: 1 << 20)
    cloned = _clone_count(monkeypatch)
    a, b = torch.empty(1, 256, device="meta"), torch.empty(256, 64, device="meta")  # 64 KB
    assert gemm.streamed_copies(b) == 16 and gemm.memory_bound(a)
    gemm.choose_mm(a, b, None, weights_from_dram=True)
    assert len(cloned) == 15  # 16 copies: one drawn, fifteen cloned
    cloned.clear()
    gemm.choose_mm(a, b, None)  # from L3: another question, on the usual copies
    assert len(cloned) == gemm.weight_copies(b) - 1
    # (a graph finds a quarter of the cache's bytes again the next call, not the whole cache's)
    assert gemm.streams_weights((1 << 18) + 1) and not gemm.streams_weights(1 << 18)


def test_a_product_of_many_rows_is_timed_from_the_cache_whatever_the_graph(monkeypatch):
    monkeypatch.setattr(gemm, "last_level_cache_bytes", lambda: 1 << 20)
    cloned = _clone_count(monkeypatch)
    a, b = torch.empty(64, 256, device="meta"), torch.empty(256, 64, device="meta")
    assert not gemm.memory_bound(a)
    gemm.choose_mm(a, b, None, weights_from_dram=True)  # compute-bound: as from L3
    assert len(cloned) == gemm.weight_copies(b) - 1


def test_the_last_level_cache_is_read_from_the_system():
    size = gemm.last_level_cache_bytes()
    assert isinstance(size, int) and (256 << 10) <= size <= (4 << 30)


def test_grouped_query_attentions_expanded_keys_are_timed(tmp_path):
    """Keys and values repeated over the query heads (stride 0, as a GQA model's graph expands them)
    are drawn as their memory and seen with those strides: both attention candidates run (drawing
    into such a tensor raised, which left both out and `aten` taken unmeasured)."""
    import json

    from kiln.autotune.attention import choose_attention

    r = gemm.Inputs(k=(torch.empty(2, 4, 12, 16).as_strided((2, 4, 12, 16), (192, 0, 16, 1)), None))
    assert r.k.stride() == (192, 0, 16, 1) and torch.equal(r.k[:, 0], r.k[:, 3]) and r.k.std() > 0.5
    q = torch.empty(2, 4, 12, 16, device="meta")
    kv = torch.empty(2, 1, 12, 16, device="meta").expand(2, 4, 12, 16)
    assert choose_attention(q, kv, kv, None, 0.25, True) in ("aten", "kiln")
    (entry,) = (tmp_path / "cache").rglob("*.json")
    answer = json.loads(entry.read_text())
    assert answer["rounds"] > 0 and "failed" not in answer and set(answer["seconds"]) == {"aten", "kiln"}, answer
